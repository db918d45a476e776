"""A peer's replies that do not parse: a ``ProtocolError`` naming the peer and the call.

gRPC's client hands a reply whose deserializer raises over as None, after logging the
parser's traceback at ERROR: the caller then fails on ``None`` (an ``AttributeError``), and
a stream reads as one that ended. :func:`parsing_channel` wraps a channel (``grpc`` or
``grpc.aio``) so every method built on it, by a generated stub or by hand, parses its
replies with :func:`tolerant`, and its calls raise ``ProtocolError`` for a reply that does
not parse (a string field that is not UTF-8, a message cut short: a broken peer, or one
whose build retyped a field), handled as the call's other protocol errors are::

    stub = pb_grpc.ActorServiceStub(parsing_channel(channel, address))
    reply = await stub.Describe(request)  # ProtocolError: "<address>: its Describe reply ..."
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from common.errors import ProtocolError

__all__ = ["Peer", "Unparsed", "parsing_channel", "tolerant"]


@dataclasses.dataclass(frozen=True)
class Unparsed:
    """A reply whose ``size`` bytes do not parse: ``error``, the parser's."""

    size: int
    error: DecodeError


def tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer``, giving :class:`Unparsed` for bytes it cannot parse instead of raising."""

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Unparsed(len(data), exc)

    return parse


#: How a peer is named in errors: its name, or what gives its name when an error is raised.
Peer = str | Callable[[], str]


def _sound(reply: Any, peer: Peer, method: str) -> Any:
    """``reply``, unless it did not parse: then the ``ProtocolError`` that says so."""
    if isinstance(reply, Unparsed):
        named = peer() if callable(peer) else peer
        raise ProtocolError(
            f"{named}: its {method} reply of {reply.size} bytes does not parse ({reply.error})"
        ) from reply.error
    return reply


class _Call:
    """A running call whose replies are checked; anything else is the call's own."""

    def __init__(self, call: Any, peer: Peer, method: str) -> None:
        self._call, self._peer, self._method = call, peer, method

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __await__(self) -> Generator[Any, None, Any]:
        reply = yield from self._call.__await__()
        return _sound(reply, self._peer, self._method)

    async def read(self) -> Any:
        """The next reply (or ``grpc.aio.EOF``)."""
        return _sound(await self._call.read(), self._peer, self._method)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._replies()

    async def _replies(self) -> AsyncIterator[Any]:
        async for reply in self._call:
            yield _sound(reply, self._peer, self._method)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return _sound(next(self._call), self._peer, self._method)


class _Method:
    """A method whose replies are checked: ``unary``, a sync one returning its reply."""

    def __init__(self, method: Any, peer: Peer, name: str, *, unary: bool) -> None:
        self._method, self._peer, self._name, self._unary = method, peer, name, unary

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._method(*args, **kwargs)
        if self._unary:
            return _sound(result, self._peer, self._name)
        return _Call(result, self._peer, self._name)


class _ParsingChannel:
    """``channel``, its methods' replies parsed by :func:`tolerant` and checked."""

    def __init__(self, channel: grpc.Channel | grpc.aio.Channel, peer: Peer) -> None:
        self._channel, self._peer = channel, peer
        self._sync = not isinstance(channel, grpc.aio.Channel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def _method(self, kind: str, path: str, kwargs: dict[str, Any], *, unary: bool) -> _Method:
        deserializer = kwargs.pop("response_deserializer", None)
        if deserializer is not None:
            kwargs["response_deserializer"] = tolerant(deserializer)
        method = getattr(self._channel, kind)(path, **kwargs)
        name = path.rsplit("/", 1)[-1]
        return _Method(method, self._peer, name, unary=unary and self._sync)

    def unary_unary(self, method: str, **kwargs: Any) -> Any:
        """The unary-unary method ``method`` (``grpc.Channel.unary_unary``'s arguments)."""
        return self._method("unary_unary", method, kwargs, unary=True)

    def unary_stream(self, method: str, **kwargs: Any) -> Any:
        """The unary-stream method ``method``."""
        return self._method("unary_stream", method, kwargs, unary=False)

    def stream_unary(self, method: str, **kwargs: Any) -> Any:
        """The stream-unary method ``method``."""
        return self._method("stream_unary", method, kwargs, unary=True)

    def stream_stream(self, method: str, **kwargs: Any) -> Any:
        """The stream-stream method ``method``."""
        return self._method("stream_stream", method, kwargs, unary=False)


def parsing_channel(channel: grpc.Channel | grpc.aio.Channel, peer: Peer) -> Any:
    """``channel`` for stubs and methods whose replies that do not parse raise ``ProtocolError``.

    Args:
        channel: A ``grpc`` or ``grpc.aio`` channel to ``peer``.
        peer: The peer's address, named in the error; or a function giving its name then
            (the learner names an actor by worker_id too, once its Describe told it).

    Returns:
        A stand-in for ``channel``: its methods' deserializers are :func:`tolerant`, and a
        reply that does not parse raises ``ProtocolError`` ("<peer>: its <Method> reply of N
        bytes does not parse (...)") where it is read: the returned reply of a sync unary
        call, an awaited ``grpc.aio`` call, ``read()`` or iteration of a stream.
    """
    return _ParsingChannel(channel, peer)
