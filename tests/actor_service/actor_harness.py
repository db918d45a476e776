"""Test harness for the actor-server tests: in-process actors and a raw Collect client.

:class:`Actor` is a real :class:`ActorServer` (real env pool and policy) on a
background event loop with a channel to it (the ``make_actor`` fixture in
``conftest.py`` builds them). :class:`RawCollect` drives one ``Collect`` call
through the generated stubs only, reassembling batches with
:class:`common.packets.PacketAssembler`, so the tests see exactly what a learner
sees on the wire.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from tensordict import TensorDict

from actor_service import ActorConfig, ActorServer, ServerThread, create_server
from actor_service._kinds.env.core import EnvCore
from common.packets import PacketAssembler
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import BlobAssembler

READ_TIMEOUT = 30.0
_CLOSE = object()


def small_config(**overrides: Any) -> ActorConfig:
    """A quick actor: 2 CartPole envs, an MLP policy, port 0, short grace."""
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "num_envs": 2,
        "seed": 0,
        "grace_period": 5.0,
        "max_credits": 4,
    }
    return ActorConfig(**(base | overrides))


@dataclasses.dataclass
class HeldStart:
    """A server starting on its own loop whose env pool is built once ``release`` is set."""

    server: ActorServer
    release: threading.Event
    started: concurrent.futures.Future[None]


@contextlib.contextmanager
def held_start(config: ActorConfig) -> Iterator[HeldStart]:
    """Start a server for ``config``, its pool built once ``release`` is set; stop it after."""
    release = threading.Event()

    def slow_factory(config: ActorConfig) -> EnvCore:
        release.wait(30)
        return EnvCore(config)

    server = create_server(config, slow_factory)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(server.start(), loop)
    try:
        yield HeldStart(server, release, started)
    finally:
        release.set()
        asyncio.run_coroutine_threadsafe(server.stop(1.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclasses.dataclass
class Actor:
    """A running in-process actor and a channel to it."""

    handle: ServerThread
    channel: grpc.Channel
    stub: pb_grpc.ActorServiceStub

    @property
    def port(self) -> int:
        return self.handle.port

    @property
    def worker(self) -> Any:
        return self.handle.server.runtime.core


def open_request(frames_per_batch: int = 10, credits: int = 0, **kw: Any) -> pb.OpenSession:
    """An ``open`` message with the given settings; other OpenSession fields via ``kw``."""
    settings = {k: kw.pop(k) for k in list(kw) if k in pb.CollectSettings.DESCRIPTOR.fields_by_name}
    settings.setdefault("reset_when_done", True)
    settings.setdefault("total_frames", -1)
    return pb.OpenSession(
        settings=pb.CollectSettings(frames_per_batch=frames_per_batch, **settings),
        credits=credits,
        **kw,
    )


class RawCollect:
    """One Collect call on generated stubs: requests from a queue, responses read by a thread.

    Args:
        stub: The ActorService stub.
        first: The first request(s) to send (normally one ``open``).
        metadata: Call metadata (e.g. an authorization header).
        read: Start reading responses at once; False plays a learner that stopped reading.
    """

    def __init__(
        self,
        stub: pb_grpc.ActorServiceStub,
        *first: pb.CollectRequest,
        metadata: tuple[tuple[str, str], ...] = (),
        read: bool = True,
    ) -> None:
        self._requests: queue.Queue = queue.Queue()
        for request in first:
            self._requests.put(request)
        self._responses: queue.Queue = queue.Queue()
        self._pushed_back: list[pb.CollectResponse] = []
        self.call = stub.Collect(self._iter_requests(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, daemon=True)
        if read:
            self._reader.start()

    @classmethod
    def open(cls, stub: pb_grpc.ActorServiceStub, request: pb.OpenSession, **kw: Any) -> RawCollect:
        """Start a call whose first message is ``open``."""
        return cls(stub, pb.CollectRequest(open=request), **kw)

    def _iter_requests(self) -> Iterator[pb.CollectRequest]:
        while True:
            item = self._requests.get()
            if item is _CLOSE:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
            self._responses.put(None)
        except grpc.RpcError as exc:
            self._responses.put(exc)

    def start_reading(self) -> None:
        """Start reading responses (a call opened with ``read=False``: its learner reads again)."""
        self._reader.start()

    def credit(self, batches: int) -> None:
        self._requests.put(pb.CollectRequest(credit=pb.Credit(batches=batches)))

    def ack(self, seq: int) -> None:
        self._requests.put(pb.CollectRequest(ack=pb.Ack(seq=seq)))

    def send(self, request: pb.CollectRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        self._requests.put(pb.CollectRequest(close=pb.CloseSession()))

    def half_close(self) -> None:
        self._requests.put(_CLOSE)

    def cancel(self) -> None:
        self.call.cancel()
        self._requests.put(_CLOSE)

    def next(self, timeout: float = READ_TIMEOUT) -> pb.CollectResponse | grpc.RpcError | None:
        """The next response, the RpcError that ended the call, or None at a clean end."""
        if self._pushed_back:
            return self._pushed_back.pop()
        return self._responses.get(timeout=timeout)

    def opened(self, timeout: float = READ_TIMEOUT) -> pb.SessionOpened:
        message = self.next(timeout)
        if not isinstance(message, pb.CollectResponse) or message.WhichOneof("kind") != "opened":
            raise AssertionError(f"expected `opened`, got {message!r}")
        return message.opened

    def batch(self, timeout: float = READ_TIMEOUT) -> tuple[pb.BatchInfo, TensorDict]:
        """Read one whole batch and decode it (checking chunk order and the CRC)."""
        message = self.next(timeout)
        if not isinstance(message, pb.CollectResponse) or message.WhichOneof("kind") != "chunk":
            raise AssertionError(f"expected a batch chunk, got {message!r}")
        chunk = message.chunk
        info = chunk.info
        assert chunk.index == 0
        assembler = PacketAssembler(info.total_bytes)
        assembler.add(chunk.data)
        for index in range(1, chunk.count):
            nxt = self.next(timeout)
            assert nxt.chunk.seq == info.seq
            assert nxt.chunk.index == index
            assembler.add(nxt.chunk.data)
        return info, assembler.finish(expected_crc32c=info.crc32c)

    def end(self, timeout: float = READ_TIMEOUT) -> tuple[pb.StreamEnd, list[int]]:
        """Read batches until ``end``; returns it and the seqs of the batches read on the way."""
        seqs = []
        while True:
            message = self.next(timeout)
            if isinstance(message, pb.CollectResponse) and message.WhichOneof("kind") == "chunk":
                self._pushed_back.append(message)  # batch() reads it again
                seqs.append(self.batch(timeout)[0].seq)
                continue
            if not isinstance(message, pb.CollectResponse) or message.WhichOneof("kind") != "end":
                raise AssertionError(f"expected `end`, got {message!r}")
            tail = self.next(timeout)
            assert tail is None, f"call did not close cleanly after `end`: {tail!r}"
            return message.end, seqs

    def error(self, timeout: float = READ_TIMEOUT) -> grpc.RpcError:
        """Read until the call fails; returns the RpcError."""
        while True:
            message = self.next(timeout)
            if isinstance(message, grpc.RpcError):
                return message
            if message is None:
                raise AssertionError("call ended with OK, expected an error")


def get_state(actor: Actor) -> bytes:
    """The actor's whole state (GetState), its chunks assembled and its sha256 checked."""
    stream = actor.stub.GetState(pb.GetStateRequest(), timeout=30)
    header = next(stream).header
    assembler = BlobAssembler(header.total_bytes, sha256=header.sha256)
    for message in stream:
        assembler.add(message.chunk)
    return bytes(assembler.finish())
