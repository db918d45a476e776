"""The ``rlfleet.v1.ActorService`` servicer: decode, call the collection core, encode, map errors.

Each handler validates what the learner sent, hands blocking work (env steps,
inference, weight decoding, state loading) to a thread, and turns every
exception into a gRPC status with :func:`common.errors.to_status`; an
unexpected exception becomes INTERNAL with a correlation id that is also
logged with the traceback. The servicer holds the RPC methods only: a weight push is
received, checked and swapped in by ``_push``, a ``Collect`` stream is run by ``_collect``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from actor_service._core._state import decode_state, encode_state
from actor_service._serve import _shm as shm
from actor_service._serve._collect import CollectSession
from actor_service._serve._convert import describe_to_proto
from actor_service._serve._logging import log_event
from actor_service._serve._push import WeightPushes
from actor_service._serve._runtime import ActorRuntime, Caller
from actor_service._serve._streams import first_message, read_blob, write_message
from actor_service._serve._wire import Undecodable
from common.config import LEARNER_ID_METADATA, TAKE_OVER_METADATA
from common.errors import (
    ActorBusyError,
    WeightsError,
    to_status,
)
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import (
    BlobAssembler,
    iter_blob_chunks,
    sha256_hex,
)

if TYPE_CHECKING:
    from actor_service._core._protocol import CollectionCore
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["ActorServicer"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Concurrent ActorService calls; the server admits more RPCs in total, so that
#: health checks always find room (see ``_server``).
MAX_ACTOR_CALLS = 64
#: GetState replies an actor builds or sends at once; further calls wait their turn. Each
#: holds the whole encoded state (the models' weights) until its caller read it: 64 callers
#: that each read a header and then stall would hold 64 copies.
MAX_STATES_SENT = 2


def _mapped(handler: F) -> F:
    """Cap concurrent calls and turn exceptions into a status (INTERNAL ones logged with an id)."""

    @functools.wraps(handler)
    async def wrapper(self: ActorServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if self._calls >= MAX_ACTOR_CALLS:
                raise ActorBusyError(
                    f"actor {self._rt.config.worker_id} is serving {self._calls} calls already"
                )
            if isinstance(request, Undecodable):
                raise request.error
            self._calls += 1
            try:
                return await handler(self, request, context)
            finally:
                self._calls -= 1
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            # A call its caller ended (cancelled, past its deadline, gone) fails the handler's
            # next write in gRPC's core, before the call reads as cancelled: no bug.
            if context.cancelled() or isinstance(exc, grpc.aio.InternalError):
                code, details = grpc.StatusCode.CANCELLED, "the caller ended the call"
            else:
                code, details = to_status(exc)
            if self._metrics is not None:
                self._metrics.rpc_errors.labels(handler.__name__, code.name).inc()
            level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.INFO
            log_event(
                "rpc.failed",
                level,
                method=handler.__name__,
                peer=context.peer(),
                code=code.name,
                details=details,
                error=repr(exc),
                exc_info=code == grpc.StatusCode.INTERNAL,
            )
        # Aborted once ``exc`` is let go: gRPC keeps the abort's exception, which raised in
        # its handler would chain ``exc`` and its frames (a refused push's receive buffer)
        # in a cycle with the call's state, freed only by a full garbage collection.
        await context.abort(code, details)

    return wrapper  # type: ignore[return-value]


class ActorServicer(pb_grpc.ActorServiceServicer):
    """Serves ``rlfleet.v1.ActorService`` over an :class:`ActorRuntime`.

    Args:
        runtime: The actor's serving state.
        metrics: Where to count errors, pushes and sessions; None counts nothing.
    """

    def __init__(self, runtime: ActorRuntime, metrics: ActorMetrics | None = None) -> None:
        self._rt = runtime
        self._metrics = metrics
        self._calls = 0
        self._pushes = WeightPushes(runtime, metrics)
        self._states_sent = asyncio.Semaphore(MAX_STATES_SENT)

    @_mapped
    async def Collect(
        self, request_iterator: AsyncIterator[pb.CollectRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """A collection session (see the proto for the message order)."""
        requests = aiter(request_iterator)
        request = await first_message(requests, "open", "Collect")
        self._rt.require_core()  # UNAVAILABLE while the actor starts
        stream = CollectSession(self._rt, request, context.peer())
        await stream.run(requests, context)

    @_mapped
    async def PushWeights(
        self,
        request_iterator: AsyncIterator[pb.PushWeightsRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.PushWeightsResponse:
        """Receive a safetensors blob (whole or a delta) and apply it to one model, all or nothing.

        The collection goes on while the blob arrives and is checked; it pauses only
        for the in-memory swap, whose length the response reports.
        """
        return await self._pushes.receive(aiter(request_iterator), context.peer(), _caller(context))

    @_mapped
    async def RelayWeights(
        self, request_iterator: AsyncIterator[pb.RelayRequest], context: grpc.aio.ServicerContext
    ) -> pb.RelayResponse:
        """Take the bytes of a relayed push from the relay the learner named."""
        requests = aiter(request_iterator)
        opening = await first_message(requests, "open", "RelayWeights")
        return await self._pushes.relay_in(opening, requests)

    @_mapped
    async def ForwardWeights(
        self, request: pb.ForwardRequest, context: grpc.aio.ServicerContext
    ) -> pb.ForwardResponse:
        """Forward the blob of the last whole push applied to the actor the learner names."""
        return await self._pushes.forward_held(request)

    @_mapped
    async def Describe(
        self, request: pb.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeResponse:
        """What this actor is (worker_id, env, spaces, models, pool) and how it is doing."""
        core = self._rt.core
        description = await self._rt.run_side(core.describe)
        reply = describe_to_proto(
            description,
            max_credits=self._rt.config.max_credits,
            busy=self._rt.busy,
            max_new_tokens_cap=self._rt.config.max_new_tokens_cap,
        )
        current = self._rt.current
        reply.learner_id = current.learner_id if (current is not None and current.active) else ""
        reply.draining = self._rt.draining
        reply.frames = core.frames
        reply.uptime_seconds = time.monotonic() - self._rt.started_at
        reply.part_deadline_seconds = self._pushes.part_deadline
        reply.host_identity = shm.identity()
        reply.shm_probe_ok = shm.probe_ok(request, self._rt.config.shared_memory)
        reply.relays_over_tls = bool(self._rt.config.relay_ca)
        reply.pushes_in_flight.extend(self._pushes.in_flight())
        return reply

    @_mapped
    async def GetState(
        self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Stream the actor's state as one safetensors file (header, then chunks).

        At most :data:`MAX_STATES_SENT` states are encoded and held at once; a call beyond
        waits (within its deadline) until one was read or given up.
        """
        core = self._rt.core
        async with self._states_sent:
            blob = await self._rt.run_collect(encode_state, core)
            header = pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob))
            await write_message(context, pb.StateChunk(header=header), "GetState")
            for piece in iter_blob_chunks(blob):
                await write_message(context, pb.StateChunk(chunk=bytes(piece)), "GetState")

    @_mapped
    async def LoadState(
        self, request_iterator: AsyncIterator[pb.StateChunk], context: grpc.aio.ServicerContext
    ) -> pb.LoadStateResponse:
        """Load a state produced by GetState, all or nothing, audit-logged like a push.

        The load runs to the end even if the caller cancels (it waits for the collection
        thread, and is atomic): it is logged where it ends, so the log tells the outcome.
        """
        requests = aiter(request_iterator)
        header = await first_message(requests, "header", "LoadState")
        audit = functools.partial(
            log_event,
            "weights.load_state",
            peer=context.peer(),
            sha256=header.sha256,
            bytes=int(header.total_bytes),
            allow_rollback=header.allow_rollback,
        )
        try:
            state = await self._read_state(requests, header)
            self._rt.check_caller(_caller(context), "loads a state")
        except BaseException as exc:
            result = "CANCELLED" if isinstance(exc, asyncio.CancelledError) else None
            audit(logging.WARNING, result=result or to_status(exc)[0].name)
            raise
        ran = threading.Event()
        load = functools.partial(_load_and_log, self._rt.core, state, header, audit, ran)
        loading = asyncio.ensure_future(self._rt.run_collect(load))
        loading.add_done_callback(functools.partial(_log_if_never_run, audit, ran))
        await asyncio.shield(loading)
        return pb.LoadStateResponse(worker_id=self._rt.config.worker_id)

    async def _read_state(
        self, requests: AsyncIterator[pb.StateChunk], header: pb.StateHeader
    ) -> dict:
        """The state a LoadState carries, received and decoded (nothing applied)."""
        core = self._rt.core
        if not header.sha256:
            raise WeightsError("LoadState header must carry the state blob's sha256")
        models = core.models
        cap = self._pushes.max_bytes(models.model_ids)
        assembler = BlobAssembler(header.total_bytes, max_bytes=cap, sha256=header.sha256)
        blob = await read_blob(requests, assembler, "LoadState")
        # A state holds the tensors of the actor's own (its models', a TorchRL env's) and a
        # few more (RNG states): no more are accepted.
        max_keys = await self._rt.run_collect(core.state_tensors) + 1024
        return await self._rt.run_side(decode_state, blob, max_bytes=cap, max_keys=max_keys)

    @_mapped
    async def SetSeed(
        self, request: pb.SetSeedRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetSeedResponse:
        """Seed the env pool, torch and numpy; return the next seed to chain."""
        self._rt.check_caller(_caller(context), "reseeds")
        next_seed, first_seq = await self._rt.reseed(int(request.seed), bool(request.static_seed))
        return pb.SetSeedResponse(next_seed=int(next_seed), first_seq=first_seq)


def _caller(context: grpc.aio.ServicerContext) -> Caller:
    """Who makes the call, as its metadata says (``common.config.LEARNER_ID_METADATA``)."""
    learner_id, take_over = None, False
    for key, value in context.invocation_metadata() or ():
        if key == LEARNER_ID_METADATA:
            raw = value if isinstance(value, bytes) else str(value).encode()
            learner_id = raw.decode("utf-8", "replace")
        elif key == TAKE_OVER_METADATA:
            take_over = value == "1"
    return Caller(learner_id, take_over)


def _log_if_never_run(
    log: Callable[..., None], ran: threading.Event, loading: asyncio.Future[None]
) -> None:
    """Log a load that never ran: cancelled, or refused by a stopped collection thread.

    A load that ran logged its own outcome (:func:`_load_and_log`).
    """
    if loading.cancelled():
        log(logging.WARNING, result="CANCELLED")
    elif (exc := loading.exception()) is not None and not ran.is_set():
        log(logging.WARNING, result=to_status(exc)[0].name)


def _load_and_log(
    core: CollectionCore,
    state: dict,
    header: pb.StateHeader,
    log: Callable[..., None],
    ran: threading.Event,
) -> None:
    """Apply a decoded state on the collection thread and log its outcome there."""
    ran.set()
    try:
        changes = core.load_state_dict(state, allow_rollback=header.allow_rollback)
    except BaseException as exc:
        log(logging.WARNING, result=to_status(exc)[0].name)
        raise
    log(
        logging.INFO,
        result="OK",
        versions={m: f"{old}->{new}" for m, (old, new) in changes.items()},
    )
