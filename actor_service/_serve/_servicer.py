"""The ``rlfleet.v1.ActorService`` servicer: decode, call the collection core, encode, map errors.

Each handler validates what the learner sent, hands blocking work (env steps,
inference, weight decoding, state loading) to a thread, and turns every
exception into a gRPC status with :func:`common.errors.to_status`; an
unexpected exception becomes INTERNAL with a correlation id that is also
logged with the traceback. Weight pushes are audit-logged with the peer,
model_id, version, sha256 and the result (``actor_service._serve._push``); the parts of
multi-part pushes are staged and swapped in whole by ``actor_service._serve._parts``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from actor_service._core._state import decode_state, encode_state
from actor_service._core._swap import ReceiveBuffers, Swap, check_base
from actor_service._core._weight_rules import check_newer
from actor_service._serve._collect import CollectSession
from actor_service._serve._convert import describe_to_proto, settings_from_proto
from actor_service._serve._logging import log_event
from actor_service._serve._parts import PartBuffers, PartStaging, StagedPart, decode_part
from actor_service._serve._push import PushCall
from actor_service._serve._runtime import ActorRuntime
from common.errors import (
    ActorBusyError,
    DeadlineError,
    RlfleetError,
    SessionStateError,
    UnknownModelError,
    WeightsError,
    to_status,
)
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import (
    BlobAssembler,
    Part,
    PushForm,
    PushOutcome,
    check_policy_version,
    decode_delta,
    decode_weights,
    default_max_weight_bytes,
    iter_blob_chunks,
    sha256_hex,
    state_nbytes,
)

if TYPE_CHECKING:
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["ActorServicer"]

_OUTCOMES = {
    PushOutcome.APPLIED: pb.PUSH_OUTCOME_APPLIED,
    PushOutcome.STAGED: pb.PUSH_OUTCOME_STAGED,
    PushOutcome.COMPLETED: pb.PUSH_OUTCOME_COMPLETED,
}

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Concurrent ActorService calls; the server admits more RPCs in total, so that
#: health checks always find room (see ``_server``).
MAX_ACTOR_CALLS = 64
# A client stream that goes this long without its next message is dropped, so an
# idle caller cannot hold a call slot or a half-received blob forever.
_IDLE_TIMEOUT = 60.0


def _mapped(handler: F) -> F:
    """Cap concurrent calls and turn exceptions into a status (INTERNAL ones logged with an id)."""

    @functools.wraps(handler)
    async def wrapper(self: ActorServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if self._calls >= MAX_ACTOR_CALLS:
                raise ActorBusyError(
                    f"actor {self._rt.config.worker_id} is serving {self._calls} calls already"
                )
            self._calls += 1
            try:
                return await handler(self, request, context)
            finally:
                self._calls -= 1
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
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
            await context.abort(code, details)

    return wrapper  # type: ignore[return-value]


async def _next(requests: AsyncIterator[Any], rpc: str) -> Any:
    """The next message of a client stream, or None at its end.

    Raises:
        DeadlineError: Nothing arrived within the idle timeout.
    """
    try:
        return await asyncio.wait_for(anext(requests, None), _IDLE_TIMEOUT)
    except TimeoutError:
        raise DeadlineError(f"{rpc}: no message for {_IDLE_TIMEOUT:.0f} s") from None


async def _first(requests: AsyncIterator[Any], kind: str, rpc: str) -> Any:
    """The first message of a client stream, which must be of ``kind``."""
    first = await _next(requests, rpc)
    got = "no message" if first is None else (first.WhichOneof("kind") or "an empty message")
    if got != kind:
        raise SessionStateError(f"{rpc} must start with `{kind}`, got {got}")
    return getattr(first, kind)


async def _blob(requests: AsyncIterator[Any], assembler: BlobAssembler, rpc: str) -> Any:
    """Add every following ``chunk`` message to ``assembler``; return the whole blob."""
    while (request := await _next(requests, rpc)) is not None:
        if request.WhichOneof("kind") != "chunk":
            raise SessionStateError(f"{rpc}: only `chunk` messages may follow the header")
        assembler.add(request.chunk)
    return assembler.finish()


async def _drain(requests: AsyncIterator[Any], max_bytes: int, rpc: str) -> None:
    """Read and drop the rest of a refused client stream, so the refusal reaches the caller.

    A server that answers a client stream before reading it to the end races the
    client's next write, and gRPC's asyncio client then reports INTERNAL ("Internal
    error from Core") in place of the answer (grpc/grpc#36066). Bounded: at most
    ``max_bytes`` of chunks (what the actor would have accepted) and the idle timeout
    per message; anything else than a chunk ends the drain.
    """
    seen = 0
    while seen < max_bytes:
        try:
            request = await _next(requests, rpc)
        except DeadlineError:
            return
        if request is None or request.WhichOneof("kind") != "chunk":
            return
        seen += len(request.chunk)


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
        self._buffers = ReceiveBuffers()
        self._part_buffers = PartBuffers()
        self._parts = PartStaging(runtime.config.part_deadline_s, self._release_parts)

    @_mapped
    async def Collect(
        self, request_iterator: AsyncIterator[pb.CollectRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """A collection session (see the proto for the message order)."""
        requests = aiter(request_iterator)
        request = await _first(requests, "open", "Collect")
        self._rt.require_core()  # UNAVAILABLE while the actor starts
        settings = settings_from_proto(request.settings)
        stream = CollectSession(self._rt, request, settings, context.peer())
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
        requests = aiter(request_iterator)
        header = await _first(requests, "header", "PushWeights")
        push = PushCall(header, context.peer(), self._metrics)
        try:
            self._admit(push)
        except RlfleetError as exc:
            push.audit(exc)
            await _drain(requests, self._drain_budget(push), "PushWeights")
            raise
        try:
            blob = await self._receive_weights(requests, push)
        except BaseException as exc:
            push.audit(exc)
            self._give_back(push, applied=False)
            raise
        if push.part is not None:
            stage = self._rt.run_side(self._stage_part, blob, push, push.part)
            reply = await asyncio.shield(stage)
            if reply.outcome == pb.PUSH_OUTCOME_STAGED:  # drop it if the rest never comes
                asyncio.get_running_loop().call_later(self._parts.deadline, self._parts.expire)
            return reply
        swap = await asyncio.shield(self._rt.run_side(self._apply_weights, blob, push))
        self._parts.settle(push.model_id, swap.version)
        return self._reply(push, swap.version, swap.pause_seconds)

    def _reply(self, push: PushCall, version: int, pause: float, staged: int = 0) -> Any:
        return pb.PushWeightsResponse(
            worker_id=self._rt.config.worker_id,
            model_id=push.model_id,
            version=version,
            pause_seconds=pause,
            outcome=_OUTCOMES[push.outcome],
            parts_staged=staged,
        )

    def _admit(self, push: PushCall) -> None:
        """Refuse a push from its header alone, before a byte of its blob is buffered."""
        models = self._rt.core.models
        if push.model_id not in models.model_ids:
            raise UnknownModelError(
                f"actor {self._rt.config.worker_id} has no model {push.model_id!r} "
                f"(models: {sorted(models.model_ids)})"
            )
        check_policy_version(push.version, "weights version")
        check_newer(push.model_id, push.version, models.policy_version(push.model_id))
        if push.base_version is not None:
            check_policy_version(push.base_version, "delta base_version")
            check_base(push.model_id, push.base_version, models.policy_version(push.model_id))
        push.read_part()
        if push.part is not None:
            self._parts.admit(push.model_id, push.version, push.part, push.base_version)
        if not push.sha256 and push.crc32c is None:
            raise WeightsError("PushWeights header must carry the blob's crc32c or sha256")

    def _drain_budget(self, push: PushCall) -> int:
        """The bytes of a refused push the actor reads and drops: what it would have accepted."""
        try:
            cap = self._max_bytes([push.model_id])
        except RlfleetError:  # an unknown model, or an actor still starting
            cap = self._rt.config.max_weight_bytes or default_max_weight_bytes(0)
        return push.total_bytes if 0 <= push.total_bytes <= cap else 0

    async def _receive_weights(
        self, requests: AsyncIterator[pb.PushWeightsRequest], push: PushCall
    ) -> bytes | memoryview:
        # A staged part views its buffer until its version is swapped in or dropped.
        pool = self._part_buffers if push.is_part else self._buffers
        push.buffer = pool.take(push.model_id, push.total_bytes)
        assembler = BlobAssembler(
            push.total_bytes,
            max_bytes=self._max_bytes([push.model_id]),
            sha256=push.sha256,
            crc32c=push.crc32c,
            buffer=push.buffer,
        )
        if push.buffer is None:
            push.buffer, push.fresh = assembler.buffer, True
        return await _blob(requests, assembler, "PushWeights")

    def _max_bytes(self, model_ids: Iterable[str]) -> int:
        """The largest blob accepted for these models: the flag, else sized from their bytes."""
        if self._rt.config.max_weight_bytes is not None:
            return self._rt.config.max_weight_bytes
        models = self._rt.core.models
        return default_max_weight_bytes(
            sum(state_nbytes(models.parameters_info(m)) for m in model_ids)
        )

    def _apply_weights(self, blob: bytes | memoryview, push: PushCall) -> Swap:
        # Runs to the end even if the caller cancels: the whole blob arrived, and
        # the swap is atomic, so the audit log tells the outcome.
        try:
            models = self._rt.core.models
            expected = models.parameters_info(push.model_id)
            cap = self._max_bytes([push.model_id])
            if push.base_version is None:
                # swap_weights checks keys, shapes and finiteness: the values are scanned once.
                state, metadata = decode_weights(
                    blob, max_bytes=cap, expected=expected, allow_non_finite=True
                )
                form = PushForm.from_metadata(metadata)  # a subset, a wire dtype (checked)
                swap = models.swap_weights(push.model_id, push.version, state, form)
            else:
                delta = decode_delta(memoryview(blob), expected, max_bytes=cap)
                swap = models.swap_delta(push.model_id, push.base_version, push.version, delta)
        except BaseException as exc:
            push.audit(exc)
            self._give_back(push, applied=False)
            raise
        self._give_back(push, applied=True)  # the decoded tensors were copied into the model
        push.pause = swap.pause_seconds
        push.audit(None)
        return swap

    def _stage_part(
        self, blob: bytes | memoryview, push: PushCall, part: Part
    ) -> pb.PushWeightsResponse:
        # Runs to the end even if the caller cancels, as _apply_weights does.
        try:
            models = self._rt.core.models
            mid, version = push.model_id, push.version
            cap = self._max_bytes([mid])
            staged = decode_part(models, mid, blob, part, push.base_version, cap)
            staged = dataclasses.replace(staged, buffer=push.buffer, lent=not push.fresh)
            # Read once, before staging: another rank's part may complete this version
            # the moment this one is staged, and a STAGED reply names the version that
            # was in force while it staged (older than its own).
            in_force = models.policy_version(mid)
            check_newer(mid, version, in_force)  # a whole push may have won
            info = models.parameters_info(mid)
            count, whole, parts = self._parts.stage(mid, version, staged, info, state_nbytes(info))
            push.buffer = None  # the staging holds it now
            if whole is None:
                push.outcome = PushOutcome.STAGED
                push.audit(None)
                return self._reply(push, in_force, 0.0, count)
            try:
                swap = models.swap_parts(mid, version, whole)
            except RlfleetError as exc:
                self._parts.failed(mid, version, str(exc))
                self._release_parts(mid, parts, False)
                raise
            self._release_parts(mid, parts, True)
        except BaseException as exc:
            push.audit(exc)
            self._give_back(push, applied=False)
            raise
        push.outcome, push.pause = PushOutcome.COMPLETED, swap.pause_seconds
        push.audit(None)
        return self._reply(push, swap.version, swap.pause_seconds, count)

    def _give_back(self, push: PushCall, *, applied: bool) -> None:
        # A buffer of a refused push is kept only if it was lent: a peer cannot make
        # the actor hold memory for sizes it announced but never applied.
        if push.buffer is not None and (applied or not push.fresh):
            if push.is_part:
                budget = self._part_budget(push.model_id)
                self._part_buffers.give_back(push.model_id, [push.buffer], budget)
            else:
                self._buffers.give_back(push.model_id, push.buffer)
        push.buffer = None

    def _release_parts(self, model_id: str, parts: list[StagedPart], applied: bool) -> None:
        """Keep the receive buffers of a swapped-in version's parts (of a dropped one: the lent)."""
        buffers = [p.buffer for p in parts if p.buffer is not None and (applied or p.lent)]
        self._part_buffers.give_back(model_id, buffers, self._part_budget(model_id))

    def _part_budget(self, model_id: str) -> int:
        """The most bytes of spare part buffers a model keeps: twice its bytes (two splits)."""
        try:
            return 2 * state_nbytes(self._rt.core.models.parameters_info(model_id)) + (1 << 20)
        except RlfleetError:  # an actor stopping: keep nothing
            return 0

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
        reply.part_deadline_seconds = self._parts.deadline
        return reply

    @_mapped
    async def GetState(
        self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Stream the actor's state as one safetensors file (header, then chunks)."""
        core = self._rt.core
        blob = await self._rt.run_collect(encode_state, core)
        await context.write(
            pb.StateChunk(header=pb.StateHeader(total_bytes=len(blob), sha256=sha256_hex(blob)))
        )
        for piece in iter_blob_chunks(blob):
            await context.write(pb.StateChunk(chunk=bytes(piece)))

    @_mapped
    async def LoadState(
        self, request_iterator: AsyncIterator[pb.StateChunk], context: grpc.aio.ServicerContext
    ) -> pb.LoadStateResponse:
        """Load a state produced by GetState, all or nothing, audit-logged like a push."""
        requests = aiter(request_iterator)
        header = await _first(requests, "header", "LoadState")
        audit = functools.partial(
            log_event,
            "weights.load_state",
            peer=context.peer(),
            sha256=header.sha256,
            bytes=int(header.total_bytes),
            allow_rollback=header.allow_rollback,
        )
        try:
            changes = await self._load_state(requests, header)
        except BaseException as exc:
            result = "CANCELLED" if isinstance(exc, asyncio.CancelledError) else None
            audit(logging.WARNING, result=result or to_status(exc)[0].name)
            raise
        audit(
            logging.INFO,
            result="OK",
            versions={m: f"{old}->{new}" for m, (old, new) in changes.items()},
        )
        return pb.LoadStateResponse(worker_id=self._rt.config.worker_id)

    async def _load_state(
        self, requests: AsyncIterator[pb.StateChunk], header: pb.StateHeader
    ) -> dict[str, tuple[int, int]]:
        core = self._rt.core
        if not header.sha256:
            raise WeightsError("LoadState header must carry the state blob's sha256")
        models = core.models
        cap = self._max_bytes(models.model_ids)
        assembler = BlobAssembler(header.total_bytes, max_bytes=cap, sha256=header.sha256)
        blob = await _blob(requests, assembler, "LoadState")
        # A state holds every model's tensors and a few more (RNG states): no more are accepted.
        max_keys = sum(len(models.parameters_info(m)) for m in models.model_ids) + 1024
        state = await self._rt.run_side(decode_state, blob, max_bytes=cap, max_keys=max_keys)
        load = functools.partial(core.load_state_dict, allow_rollback=header.allow_rollback)
        return await asyncio.shield(self._rt.run_collect(load, state))

    @_mapped
    async def SetSeed(
        self, request: pb.SetSeedRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetSeedResponse:
        """Seed the env pool, torch and numpy; return the next seed to chain."""
        next_seed, first_seq = await self._rt.reseed(int(request.seed), bool(request.static_seed))
        return pb.SetSeedResponse(next_seed=int(next_seed), first_seq=first_seq)
