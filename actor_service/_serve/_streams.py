"""The client and server streams of ``ActorService``: one message at a time, never waiting forever.

``PushWeights`` and ``LoadState`` are client streams of a header, then chunks; a caller
that stops sending, or trickles chunks of a few bytes (or none), must not hold a call slot
or a half-received blob, and a refused stream is read to its end (within bounds) so the
refusal reaches the caller. ``GetState``
is a server stream: a caller that stops reading must not hold a call slot and the state's
encoded blob either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from common.errors import DeadlineError, SessionStateError
from common.weights import BlobAssembler

__all__ = [
    "chunks",
    "drain",
    "first_message",
    "kind_of",
    "next_message",
    "read_blob",
    "write_message",
]

# A client stream that goes this long without its next message is dropped, so an
# idle caller cannot hold a call slot or a half-received blob forever; so is a server
# stream whose caller takes no message for as long.
_IDLE_TIMEOUT = 60.0
# The chunks of a blob must bring at least this many bytes (or the stream's end) in every
# idle timeout: were it reset by any chunk, chunks of a byte or none would hold a call slot
# and a half-received blob for as long as their caller likes. 1 MiB per 60 s is about
# 17 KiB/s; a learner's own push deadline (``call_timeout``, 30 s) asks far more.
_MIN_PROGRESS = 1 << 20


async def next_message(requests: AsyncIterator[Any], rpc: str) -> Any:
    """The next message of a client stream, or None at its end.

    Raises:
        DeadlineError: Nothing arrived within the idle timeout.
    """
    try:
        return await asyncio.wait_for(anext(requests, None), _IDLE_TIMEOUT)
    except TimeoutError:
        raise DeadlineError(f"{rpc}: no message for {_IDLE_TIMEOUT:.0f} s") from None


async def write_message(context: grpc.aio.ServicerContext, message: Any, rpc: str) -> None:
    """Write the next message of a server stream.

    Raises:
        DeadlineError: The caller took nothing within the idle timeout (it stopped reading).
    """
    try:
        await asyncio.wait_for(context.write(message), _IDLE_TIMEOUT)
    except TimeoutError:
        raise DeadlineError(f"{rpc}: the caller read nothing for {_IDLE_TIMEOUT:.0f} s") from None


def kind_of(message: Any) -> str:
    """The ``kind`` a client message carries, or what it is when it carries none we know."""
    return message.WhichOneof("kind") or (
        "an empty message (or one of a kind this build does not know)"
    )


async def first_message(requests: AsyncIterator[Any], kind: str, rpc: str) -> Any:
    """The first message of a client stream, which must be of ``kind``."""
    first = await next_message(requests, rpc)
    got = "no message" if first is None else kind_of(first)
    if got != kind:
        raise SessionStateError(f"{rpc} must start with `{kind}`, got {got}")
    return getattr(first, kind)


async def chunks(requests: AsyncIterator[Any], rpc: str) -> AsyncGenerator[bytes, None]:
    """The bytes of every following ``chunk`` message, to the stream's end.

    Raises:
        DeadlineError: The chunks brought fewer than :data:`_MIN_PROGRESS` bytes in an
            idle timeout (the stream's end did not come either).
        SessionStateError: A message other than a ``chunk`` came.
    """
    loop = asyncio.get_running_loop()
    due, progress = loop.time() + _IDLE_TIMEOUT, 0
    while True:
        try:
            request = await asyncio.wait_for(anext(requests, None), due - loop.time())
        except TimeoutError:
            raise DeadlineError(
                f"{rpc}: fewer than {_MIN_PROGRESS} bytes of chunks in {_IDLE_TIMEOUT:g} s "
                f"(a blob must arrive at {_MIN_PROGRESS} bytes per {_IDLE_TIMEOUT:g} s or faster)"
            ) from None
        if request is None:
            return
        if request.WhichOneof("kind") != "chunk":
            raise SessionStateError(f"{rpc}: only `chunk` messages may follow the header")
        progress += len(request.chunk)
        if progress >= _MIN_PROGRESS:
            due, progress = loop.time() + _IDLE_TIMEOUT, 0
        yield request.chunk


async def read_blob(requests: AsyncIterator[Any], assembler: BlobAssembler, rpc: str) -> Any:
    """Add every following ``chunk`` message to ``assembler``; return the whole blob."""
    async for chunk in chunks(requests, rpc):
        assembler.add(chunk)
    return assembler.finish()


async def drain(requests: AsyncIterator[Any], max_bytes: int, rpc: str) -> None:
    """Read and drop the rest of a refused client stream, so the refusal reaches the caller.

    A server that answers a client stream before reading it to the end races the
    client's next write, and gRPC's asyncio client then reports INTERNAL ("Internal
    error from Core") in place of the answer (grpc/grpc#36066). Bounded: at most
    ``max_bytes`` of chunks (what the actor would have accepted), read as
    :func:`chunks` reads a blob (at its minimum progress); anything else than a chunk
    ends the drain.
    """
    seen = 0
    with contextlib.suppress(DeadlineError, SessionStateError):
        async with contextlib.aclosing(chunks(requests, rpc)) as pieces:
            while seen < max_bytes and (piece := await anext(pieces, None)) is not None:
                seen += len(piece)
