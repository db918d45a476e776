"""Weight pushes as the actor serves them: admitted, received, checked, staged, swapped in.

A push is refused from its header alone when it can be (unknown model, stale version,
no checksum), before a byte of its blob is buffered; its blob arrives into a reused
receive buffer while collection goes on, is decoded and checked off the event loop, and
only the swap pauses the model (``actor_service._core._swap``). A part of a multi-part
version is staged until its last part arrives (``_parts``). Every push, whole or one
part, is audit-logged once as the ``weights.push`` event (peer, model_id, version,
sha256, crc32c, base_version, part, bytes, pause, outcome, result) and counted in the
actor's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import torch

from actor_service._core._swap import ReceiveBuffers, Swap, check_base
from actor_service._core._weight_rules import check_newer
from actor_service._serve._logging import log_event
from actor_service._serve._parts import PartBuffers, PartStaging, StagedPart, decode_part
from actor_service._serve._relay import (
    Forwarder,
    Piece,
    RelayInbox,
    check_relay,
    relay_credentials,
    relayed_chunks,
)
from actor_service._serve._runtime import ActorRuntime, Caller
from actor_service._serve._shm import mapped_push, read_push_segment
from actor_service._serve._streams import chunks, drain, first_message, next_message, read_blob
from common.checksum import crc32c
from common.config import CHUNK_BYTES, DEFAULT_MODEL_ID, MAX_MODEL_ID
from common.errors import (
    ActorUnavailableError,
    DataLossError,
    ProtocolError,
    RelayFailedError,
    RlfleetError,
    SessionStateError,
    UnknownModelError,
    WeightsError,
    to_status,
)
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import SegmentMaps, ShmError
from common.weights import (
    BlobAssembler,
    Part,
    PushForm,
    PushOutcome,
    check_blob_size,
    check_digests,
    check_policy_version,
    decode_delta,
    decode_weights,
    default_max_weight_bytes,
    iter_blob_chunks,
    state_nbytes,
)

if TYPE_CHECKING:
    from actor_service._serve._metrics import ActorMetrics

__all__ = ["PushCall", "WeightPushes"]

#: Pushes in flight that Describe lists.
_MAX_LISTED = 16
_OUTCOMES = {
    PushOutcome.APPLIED: pb.PUSH_OUTCOME_APPLIED,
    PushOutcome.STAGED: pb.PUSH_OUTCOME_STAGED,
    PushOutcome.COMPLETED: pb.PUSH_OUTCOME_COMPLETED,
}


class PushCall:
    """One weight push: its header fields, its audit-log line and its metrics.

    Args:
        header: The push's header as received (its part is checked by :meth:`read_part`).
        peer: Who pushed.
        metrics: Where to count it; None counts nothing.
    """

    def __init__(self, header: pb.WeightsHeader, peer: str, metrics: ActorMetrics | None) -> None:
        self.model_id = header.model_id or DEFAULT_MODEL_ID
        self.version = int(header.version)
        self.total_bytes = int(header.total_bytes)
        self.sha256 = header.sha256
        self.crc32c = header.crc32c if header.HasField("crc32c") else None
        self.base_version = header.base_version if header.HasField("base_version") else None
        self._part_fields = (
            (int(header.part.index), int(header.part.count)) if header.HasField("part") else None
        )
        self.part: Part | None = None  # set by read_part once checked
        self.relay = header.relay if header.HasField("relay") else None
        self.outcome = PushOutcome.APPLIED
        self.peer = peer
        self._metrics = metrics
        self.started = time.monotonic()
        self.source = "learner"  # where the bytes come from: learner, relay, shared memory
        self.assembler: BlobAssembler | None = None  # set once the blob is being received
        self.pause = 0.0
        self.buffer: torch.Tensor | None = None  # lent by ReceiveBuffers while in use
        self.fresh = False  # the buffer was allocated for this push, not lent

    @property
    def digest(self) -> str:
        """Which bytes the header names: its checksums (a part staged again is compared)."""
        return f"{self.sha256}:{self.crc32c}"

    @property
    def is_part(self) -> bool:
        """Whether the header names a part of a multi-part push."""
        return self._part_fields is not None

    def read_part(self) -> None:
        """Check the header's part (``common.weights.Part``: WeightsError when out of range)."""
        if self._part_fields is not None:
            self.part = Part(*self._part_fields)

    def audit(self, exc: BaseException | None) -> None:
        """Log who pushed what and the result (OK, CANCELLED or the status code); count it."""
        if exc is None:
            result = "OK"
        elif isinstance(exc, asyncio.CancelledError):
            result = "CANCELLED"
        else:
            result = to_status(exc)[0].name
        if self._metrics is not None:
            model = self._metrics.model_label(self.model_id)
            self._metrics.weight_pushes.labels(model, result).inc()
            if exc is None:
                self._metrics.weight_push_bytes.labels(model).inc(self.total_bytes)
                self._metrics.weight_push_seconds.labels(model).observe(
                    time.monotonic() - self.started
                )
                self._metrics.weight_push_pause_seconds.labels(model).observe(self.pause)
        fields: dict[str, Any] = {"source": self.source}
        if self._part_fields is not None:  # a refused part has no outcome: it was not taken
            fields = {"part": "{}/{}".format(*self._part_fields)}
            if exc is None:
                fields["outcome"] = self.outcome.name
        if self.relay is not None:
            fields["relayed"] = "from a relay" if self.relay.source_ticket else "from the learner"
            fields["forward_to"] = self.relay.forward_to
        log_event(
            "weights.push",
            logging.INFO if exc is None else logging.WARNING,
            peer=self.peer,
            model_id=self.model_id,
            version=self.version,
            sha256=self.sha256,
            crc32c=self.crc32c,
            base_version=self.base_version,
            bytes=self.total_bytes,
            pause_seconds=round(self.pause, 6),
            result=result,
            **fields,
        )


class WeightPushes:
    """The ``PushWeights`` calls of one actor: admitted, received, staged or swapped in.

    Args:
        runtime: The actor's serving state (its core's models take the pushes).
        metrics: Where to count pushes; None counts nothing.
    """

    def __init__(self, runtime: ActorRuntime, metrics: ActorMetrics | None) -> None:
        self._rt = runtime
        self._metrics = metrics
        self._buffers = ReceiveBuffers()
        self._part_buffers = PartBuffers()
        self._parts = PartStaging(runtime.config.part_deadline_s, self._release_parts)
        self._inbox = RelayInbox()
        self._relay_credentials = relay_credentials(runtime.config)  # TLS to the next actor
        self._in_flight: set[PushCall] = set()
        #: Per model, the last whole push applied, whose bytes its receive buffer still holds.
        self._held: dict[str, HeldBlob] = {}
        self._maps = SegmentMaps()  # segments whole pushes are applied from, kept mapped

    @property
    def part_deadline(self) -> float:
        """Seconds an incomplete multi-part version waits for its last part."""
        return self._parts.deadline

    async def receive(
        self, requests: AsyncIterator[pb.PushWeightsRequest], peer: str, caller: Caller
    ) -> pb.PushWeightsResponse:
        """Receive a safetensors blob (whole, a delta or a part) and apply it, all or nothing.

        The collection goes on while the blob arrives and is checked; it pauses only
        for the in-memory swap, whose length the response reports. ``caller``: who pushes,
        refused while another learner's session is in force; a part of a multi-part push is
        not (every rank sends its part to every actor, those other ranks' sessions hold).
        """
        header = await first_message(requests, "header", "PushWeights")
        push = PushCall(header, peer, self._metrics)
        try:
            if not header.HasField("part"):  # a part goes to other ranks' actors too
                self._rt.check_caller(caller, "pushes weights")
            self._admit(push)
        except RlfleetError as exc:
            push.audit(exc)
            await drain(requests, self._drain_budget(push), "PushWeights")
            raise
        self._in_flight.add(push)
        try:
            if header.HasField("shm") and push.part is None and push.base_version is None:
                return await self._apply_in_place(requests, header, push)
            return await self._take_in(requests, header, push)
        finally:
            self._in_flight.discard(push)

    async def _apply_in_place(
        self,
        requests: AsyncIterator[pb.PushWeightsRequest],
        header: pb.WeightsHeader,
        push: PushCall,
    ) -> pb.PushWeightsResponse:
        """A whole push through shared memory: checked and applied where it lies."""
        push.source = "shared memory"
        try:
            if await next_message(requests, "PushWeights") is not None:
                raise SessionStateError(
                    "PushWeights: no chunk may follow a header naming a segment"
                )
        except BaseException as exc:
            push.audit(exc)
            raise
        try:  # any other failure is audited where it happens
            swap = await asyncio.shield(self._rt.run_side(self._apply_segment, header, push))
        except ShmError as exc:
            return self._shm_refused(push, exc)
        self._parts.settle(push.model_id, swap.version)
        return self._reply(push, swap.version, swap.pause_seconds)

    def _apply_segment(self, header: pb.WeightsHeader, push: PushCall) -> Swap:
        """Check a push's segment in place and apply it, holding it against the learner.

        Off the event loop. The digests are checked over the segment itself before anything
        is applied; the learner cannot fill it again until the copy into the model is done.

        Raises:
            ShmError: The segment cannot be trusted, held, or fails its digests.
        """
        cap = self.max_bytes([push.model_id])
        try:
            check_blob_size(push.total_bytes, cap)  # as a chunked push's, before the segment
        except RlfleetError as exc:
            push.audit(exc)
            raise
        with mapped_push(header, self._rt.config.shared_memory, self._maps) as view:
            blob = self._check_in_place(view, cap, header, push)
            return self._apply_weights(blob, push)

    def _check_in_place(
        self, view: memoryview, cap: int, header: pb.WeightsHeader, push: PushCall
    ) -> memoryview | bytes:
        """The segment's bytes once their digests match the header's (a failure is audited).

        Raises:
            ShmError: The segment fails its digests (the bytes follow).
        """
        try:
            push.assembler = BlobAssembler(
                push.total_bytes,
                max_bytes=cap,
                sha256=push.sha256,
                crc32c=push.crc32c,
                buffer=torch.frombuffer(view, dtype=torch.uint8),
            )
            push.assembler.add_rest(_in_place)  # digests the segment piece by piece
            return push.assembler.finish()
        except DataLossError as exc:
            raise ShmError(f"segment {header.shm.name} fails its check: {exc}") from exc
        except BaseException as exc:
            push.audit(exc)
            raise

    async def _take_in(
        self,
        requests: AsyncIterator[pb.PushWeightsRequest],
        header: pb.WeightsHeader,
        push: PushCall,
    ) -> pb.PushWeightsResponse:
        """An admitted push: its blob received (by its route), checked, staged or swapped in."""
        try:
            if header.HasField("shm"):
                push.source = "shared memory"
                blob = await self._read_segment(requests, header, push)
            elif push.relay is not None:
                push.source = "relay" if push.relay.source_ticket else "learner"
                blob = await self._receive_relayed(requests, push, push.relay)
            else:
                blob = await self._receive_weights(requests, push)
        except ShmError as exc:
            return self._shm_refused(push, exc)
        except RelayFailedError as exc:
            return self._relay_failed(push, exc)
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

    def in_flight(self) -> list[pb.PushInFlight]:
        """The pushes arriving now, for Describe (at most :data:`_MAX_LISTED`)."""
        now = time.monotonic()
        return [
            pb.PushInFlight(
                model_id=push.model_id,
                version=push.version,
                total_bytes=push.total_bytes,
                received_bytes=push.assembler.received if push.assembler is not None else 0,
                source=push.source,
                seconds=now - push.started,
            )
            for push in list(self._in_flight)[:_MAX_LISTED]
        ]

    def _reply(
        self, push: PushCall, version: int, pause: float, staged: int = 0
    ) -> pb.PushWeightsResponse:
        return pb.PushWeightsResponse(
            worker_id=self._rt.config.worker_id,
            model_id=push.model_id,
            version=version,
            pause_seconds=pause,
            outcome=_OUTCOMES[push.outcome],
            parts_staged=staged,
            epoch=self._rt.book.epoch,
        )

    def _admit(self, push: PushCall) -> None:
        """Refuse a push from its header alone, before a byte of its blob is buffered."""
        models = self._rt.core.models
        if len(push.model_id) > MAX_MODEL_ID:
            raise ProtocolError(
                f"model_id must be at most {MAX_MODEL_ID} characters, got {len(push.model_id)}"
            )
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
        if not push.sha256 and push.crc32c is None:
            raise WeightsError("PushWeights header must carry the blob's crc32c or sha256")
        check_digests(push.sha256, push.crc32c)
        if push.relay is not None:
            check_relay(push.relay, self._rt.config)
        # Last: a part whose index is staged with other checksums drops its version, which
        # a header refused for its own fields must not do.
        if push.part is not None:
            self._parts.admit(
                push.model_id, push.version, push.part, push.base_version, push.digest
            )

    def _drain_budget(self, push: PushCall) -> int:
        """The bytes of a refused push the actor reads and drops: what it would have accepted."""
        try:
            cap = self.max_bytes([push.model_id])
        except RlfleetError:  # an unknown model, or an actor still starting
            cap = self._rt.config.max_weight_bytes or default_max_weight_bytes(0)
        return push.total_bytes if 0 <= push.total_bytes <= cap else 0

    async def _receive_weights(
        self, requests: AsyncIterator[pb.PushWeightsRequest], push: PushCall
    ) -> bytes | memoryview:
        return await read_blob(requests, self._assembler(push), "PushWeights")

    def _assembler(self, push: PushCall) -> BlobAssembler:
        """Where a push's blob is checked (size cap, digests) and reassembled."""
        # A staged part views its buffer until its version is swapped in or dropped.
        pool = self._part_buffers if push.is_part else self._buffers
        push.buffer = pool.take(push.model_id, push.total_bytes)
        held = self._held.get(push.model_id)
        if held is not None and push.buffer is held.buffer:  # about to be overwritten
            del self._held[push.model_id]
        assembler = BlobAssembler(
            push.total_bytes,
            max_bytes=self.max_bytes([push.model_id]),
            sha256=push.sha256,
            crc32c=push.crc32c,
            buffer=push.buffer,
        )
        if push.buffer is None:
            push.buffer, push.fresh = assembler.buffer, True
        push.assembler = assembler
        return assembler

    async def _receive_relayed(
        self, requests: AsyncIterator[pb.PushWeightsRequest], push: PushCall, relay: pb.Relay
    ) -> bytes | memoryview:
        """A relayed push's blob, from the learner or its relay, forwarded as it arrives.

        Raises:
            RelayFailedError: The relay's bytes stopped, ended early or fail the header's digests.
        """
        assembler = self._assembler(push)
        forward = (
            Forwarder(relay, self._rt.config.token, self._relay_credentials)
            if relay.forward_to
            else None
        )
        try:
            if not relay.source_ticket:  # the first of the chain: the learner's chunks
                await _take(_from_learner(requests), assembler, forward)
                return assembler.finish()
            if await next_message(requests, "PushWeights") is not None:
                raise SessionStateError("PushWeights: no chunk may follow a relayed header")
            try:
                async with self._inbox.opened(relay) as inbound:
                    got = relayed_chunks(inbound, push.total_bytes, relay.stall_seconds)
                    await _take(got, assembler, forward)
                return assembler.finish()
            except (DataLossError, WeightsError) as exc:  # too many bytes, or other ones
                raise RelayFailedError(f"the relayed blob fails its check: {exc}") from exc
        except BaseException:
            if forward is not None:
                forward.abandon()
            raise
        finally:
            if forward is not None:
                await forward.close()

    async def relay_in(
        self, opening: pb.RelayOpen, requests: AsyncIterator[pb.RelayRequest]
    ) -> pb.RelayResponse:
        """Take a relay's chunks for the push it names (``RelayWeights``)."""
        inbound = await self._inbox.take(opening)
        return pb.RelayResponse(bytes_received=await self._inbox.fill(inbound, requests))

    async def forward_held(self, request: pb.ForwardRequest) -> pb.ForwardResponse:
        """Forward the blob of the last whole push applied to another actor (``ForwardWeights``).

        Raises:
            ProtocolError: The relay fields are out of range, or name no next actor.
            SessionStateError: This actor no longer holds exactly that blob.
            ActorUnavailableError: The next actor did not take it.
        """
        check_relay(request.relay, self._rt.config)
        if request.relay.source_ticket or not request.relay.forward_to:
            raise ProtocolError("ForwardWeights: relay names a forward_to and no source_ticket")
        mid = request.model_id or DEFAULT_MODEL_ID
        wanted = (int(request.version), int(request.crc32c), int(request.total_bytes))
        held = self._held.get(mid)
        buffer = self._buffers.take(mid, held.nbytes) if held is not None else None
        try:
            if held is None or buffer is not held.buffer or held.key != wanted:
                raise SessionStateError(
                    f"actor {self._rt.config.worker_id} holds no blob of {mid!r} version "
                    f"{wanted[0]} of {wanted[2]} bytes with that CRC-32C"
                )
            view = held.buffer.numpy().data[: held.nbytes]
            if await self._rt.run_side(crc32c, view) != held.crc32c:
                raise SessionStateError(f"the held blob of {mid!r} changed; not forwarded")
            forward = Forwarder(request.relay, self._rt.config.token, self._relay_credentials)
            await _forward(view, forward)
        finally:
            if buffer is not None:
                self._buffers.give_back(mid, buffer)
        log_event(
            "weights.forwarded",
            logging.INFO,
            model_id=mid,
            version=wanted[0],
            bytes=held.nbytes,
            to=request.relay.forward_to,
        )
        return pb.ForwardResponse(bytes_received=held.nbytes)

    def _relay_failed(self, push: PushCall, exc: RelayFailedError) -> pb.PushWeightsResponse:
        """The reply to a relayed push whose bytes did not arrive whole: why, nothing applied."""
        self._give_back(push, applied=False)
        push.audit(exc)
        return pb.PushWeightsResponse(
            worker_id=self._rt.config.worker_id,
            model_id=push.model_id,
            version=self._rt.core.models.policy_version(push.model_id),
            relay_failed=str(exc),
        )

    async def _read_segment(
        self,
        requests: AsyncIterator[pb.PushWeightsRequest],
        header: pb.WeightsHeader,
        push: PushCall,
    ) -> bytes | memoryview:
        """The blob of a push through shared memory, checked as a chunked push's bytes are.

        Raises:
            ShmError: The segment cannot be read or trusted (nothing is applied).
        """
        if await next_message(requests, "PushWeights") is not None:
            raise SessionStateError("PushWeights: no chunk may follow a header naming a segment")
        assembler = self._assembler(push)  # the size cap, before the segment is read
        reading = asyncio.ensure_future(self._rt.run_side(self._fill, header, assembler))
        try:
            return await asyncio.shield(reading)
        except asyncio.CancelledError:
            # The thread writes into the push's lent buffer until it returns: only then
            # may the buffer go back for the next push to assemble its bytes in. Waited
            # for with asyncio.wait, which a second cancellation does not pass on to it.
            while not reading.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({reading})
            raise

    def _fill(self, header: pb.WeightsHeader, assembler: BlobAssembler) -> bytes | memoryview:
        """Read a push's segment into its assembler and check it (off the event loop)."""
        read_push_segment(header, self._rt.config.shared_memory, assembler)
        try:
            return assembler.finish()
        except DataLossError as exc:  # the segment changed or was damaged: the bytes follow
            raise ShmError(f"segment {header.shm.name} fails its check: {exc}") from exc

    def _shm_refused(self, push: PushCall, exc: ShmError) -> pb.PushWeightsResponse:
        """The reply to a push whose segment was not read: why, and nothing applied."""
        self._give_back(push, applied=False)
        log_event(
            "weights.shm_refused",
            logging.WARNING,
            peer=push.peer,
            model_id=push.model_id,
            version=push.version,
            reason=str(exc),
        )
        version = self._rt.core.models.policy_version(push.model_id)
        return pb.PushWeightsResponse(
            worker_id=self._rt.config.worker_id,
            model_id=push.model_id,
            version=version,
            shm_refused=str(exc),
        )

    def max_bytes(self, model_ids: Iterable[str]) -> int:
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
            cap = self.max_bytes([push.model_id])
            if push.base_version is None:
                # swap_weights checks keys, shapes and finiteness: the values are scanned once.
                state, metadata = decode_weights(
                    blob,
                    max_bytes=cap,
                    expected=expected,
                    allow_non_finite=True,
                    adapter=models.adapter,
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
        if push.base_version is None and push.crc32c is not None and push.buffer is not None:
            self._held[push.model_id] = HeldBlob(
                push.version, push.crc32c, push.total_bytes, push.buffer
            )
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
            cap = self.max_bytes([mid])
            staged = decode_part(models, mid, blob, part, push.base_version, cap)
            staged = dataclasses.replace(
                staged,
                buffer=push.buffer,
                lent=not push.fresh,
                digest=push.digest,
                received=memoryview(blob).nbytes,
            )
            # Read once, before staging: another rank's part may complete this version
            # the moment this one is staged, and a STAGED reply names the version that
            # was in force while it staged (older than its own).
            in_force = models.policy_version(mid)
            check_newer(mid, version, in_force)  # a whole push may have won
            info = models.parameters_info(mid)
            count, whole, parts = self._parts.stage(
                mid, version, staged, info, state_nbytes(info), self._rt.config.max_weight_bytes
            )
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


def _in_place(into: memoryview, offset: int) -> None:
    """``BlobAssembler.add_rest``'s reader for a blob already where it is assembled."""


async def _take(
    pieces: AsyncIterator[Piece], assembler: BlobAssembler, forward: Forwarder | None
) -> None:
    """Forward each piece (first, so the next actor is not held up), then assemble it."""
    async for piece, raw in pieces:
        if forward is not None:
            await forward.send(piece, raw)
        assembler.add(piece)


async def _from_learner(requests: AsyncIterator[pb.PushWeightsRequest]) -> AsyncIterator[Piece]:
    """The learner's chunks of a relayed push, as pieces that no relay framed."""
    async for chunk in chunks(requests, "PushWeights"):
        yield chunk, None


async def _forward(blob: memoryview, forward: Forwarder) -> None:
    """Send a held blob down a forward, in chunks; ActorUnavailableError if it fails."""
    try:
        for piece in iter_blob_chunks(blob, CHUNK_BYTES):
            await forward.send(piece)
            if forward.failed is not None:
                break
    finally:
        await forward.close()
    if forward.failed is not None:
        raise ActorUnavailableError(f"forward failed: {forward.failed}")


@dataclasses.dataclass(frozen=True)
class HeldBlob:
    """The bytes of the last whole push of a model, as its receive buffer holds them."""

    version: int
    crc32c: int
    nbytes: int
    buffer: torch.Tensor

    @property
    def key(self) -> tuple[int, int, int]:
        """``(version, crc32c, nbytes)``: what a ``ForwardRequest`` must name."""
        return self.version, self.crc32c, self.nbytes
