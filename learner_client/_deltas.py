"""Delta pushes: per worker, a delta against the weights it holds, or the full push.

``delta=True`` sends each target only the elements that changed since the weights
it holds (``common.weights._delta``), with the version they apply on top of.
:class:`DeltaTracker` remembers, per model_id and worker_id, the snapshot each worker was
last sent and applied (a copy of the state at that version *in the form it travelled*,
shared by every worker that got the same push), and chooses per worker a **delta** against
that snapshot when the worker holds one in the form of this push (wire dtype,
``only_trainable``), the version it last acknowledged or reported is the snapshot's, and
fewer than :attr:`WeightPushSettings.full_push_every` deltas followed its last full push; a
**full** push otherwise (first push, a restarted actor, a push the tracker did not see, a
failed push, a change of form, the periodic anchor that bounds drift, or a change so dense
that its indices and values would outweigh the whole state). With a wire dtype
(``dtype=torch.bfloat16``) the snapshot is the state cast to it, and the delta holds the
elements whose *cast* bits changed: after one small optimizer step most bf16 values stay
the same although every fp32 value moved. The actor casts them into its dtype element by
element, as a full push does, so its weights are bit for bit those a full push of the same
state in the same form would give. A worker that answers a delta with FAILED_PRECONDITION
(it holds another version) gets the full push of the same state and version at once,
which the caller never sees as an error; a worker whose push failed loses its snapshot, so
its next push is full. A delta's :attr:`EncodedWeights.full` builds that full push on
demand; it is also what a returning actor is re-sent.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping

import torch
from torch import nn

from common.weights import PushForm, checksums, encode_delta, encode_weights, wire_state
from learner_client._settings import WeightPushSettings
from learner_client._shared_policy import WeightsMark
from learner_client._weights import EncodedWeights, PushOptions, WeightBook, WeightSource

__all__ = ["SNAPSHOT_READS", "DeltaTracker"]

#: Reads of a source changed while it was read, the last one sent whatever happened during it.
SNAPSHOT_READS = 3


@dataclasses.dataclass(frozen=True)
class _Held:
    """What one worker holds: the snapshot it was sent (never modified) at ``version``."""

    version: int
    state: dict[str, torch.Tensor]
    deltas: int  # consecutive deltas since its last full push
    form: PushOptions  # the form ``state`` travelled in (wire dtype, only_trainable)
    # Sent as a part: its version may still stage, or have completed unseen by this rank.
    part: bool = False


class DeltaTracker:
    """The snapshots each worker holds, and the delta or full push each one needs.

    Args:
        book: The learner's weight bookkeeping (versions acknowledged and reported).
        settings: The checksum and the full-push interval.
    """

    def __init__(self, book: WeightBook, settings: WeightPushSettings) -> None:
        self._book = book
        self._settings = settings
        self._lock = threading.Lock()
        self._held: dict[str, dict[int, _Held]] = {}
        self._sent: dict[tuple[str, int], _Held] = {}

    def encode(
        self,
        model_id: str,
        sources: Mapping[int, WeightSource],
        version: int,
        form: PushOptions | None = None,
    ) -> dict[int, EncodedWeights]:
        """One push of ``version``: per worker, a delta against what it holds, or a full push.

        Each distinct source is snapshotted once (in ``form``; None: as it is), each
        distinct (base, source) delta and each full blob encoded once, however many
        workers receive it.
        """
        form = form or PushOptions()
        snapshots: dict[int, dict[str, torch.Tensor]] = {}
        fulls: dict[int, Callable[[], EncodedWeights]] = {}  # encoded only if needed
        deltas: dict[tuple[int, int], EncodedWeights | None] = {}
        out: dict[int, EncodedWeights] = {}
        for wid, src in sources.items():
            if id(src) not in snapshots:
                snapshots[id(src)] = _snapshot(src, form)
            state = snapshots[id(src)]
            if id(state) not in fulls:
                subset = form.only_trainable or not isinstance(src, nn.Module)
                encode = functools.partial(self._full, model_id, version, state, form, subset)
                fulls[id(state)] = functools.cache(encode)
            held = self._usable(model_id, wid, form)
            delta = None
            if held is not None:
                key = (id(held.state), id(state))
                if key not in deltas:
                    deltas[key] = self._delta(model_id, version, held, state, fulls[id(state)])
                delta = deltas[key]
            if held is None or delta is None:  # nothing to build on, or a dense change
                out[wid], sent = fulls[id(state)](), _Held(version, state, 0, form)
            else:
                out[wid], sent = delta, _Held(version, state, held.deltas + 1, form)
            with self._lock:
                self._sent[(model_id, wid)] = sent
        return out

    def settle(
        self,
        model_id: str,
        applied: Mapping[int, int],
        failed: Mapping[int, object],
        *,
        part: bool = False,
    ) -> None:
        """Record the outcome of a push: workers that applied it hold its snapshot; others none.

        A ``part`` taken (staged or completed) counts as held: the next delta part builds on
        it, and an actor whose version never completed refuses that base and gets the
        whole part instead.
        """
        with self._lock:
            held = self._held.setdefault(model_id, {})
            for wid in applied:
                sent = self._sent.pop((model_id, wid), None)
                if sent is not None and sent.version == applied[wid]:
                    held[wid] = dataclasses.replace(sent, part=part)
            for wid in failed:
                self._sent.pop((model_id, wid), None)
                held.pop(wid, None)

    def _usable(self, model_id: str, worker_id: int, form: PushOptions) -> _Held | None:
        with self._lock:
            held = self._held.get(model_id, {}).get(worker_id)
        if held is None or held.deltas >= self._settings.full_push_every or held.form != form:
            return None
        applied = self._book.applied(worker_id).get(model_id, 0)
        if applied != held.version and not (held.part and applied < held.version):
            return None  # restarted, or updated by a push this tracker did not send
        return held

    def _full(
        self,
        model_id: str,
        version: int,
        state: dict[str, torch.Tensor],
        form: PushOptions,
        subset: bool,
    ) -> EncodedWeights:
        """The full push of a snapshot (already in ``form``'s wire dtype), declaring its form."""
        meta = {"model_id": model_id}
        blob = encode_weights(state, metadata=meta, dtype=form.dtype, subset=subset)
        return EncodedWeights(model_id, version, blob, *checksums(blob, self._settings.checksum))

    def _delta(
        self,
        model_id: str,
        version: int,
        held: _Held,
        state: dict[str, torch.Tensor],
        full: Callable[[], EncodedWeights],
    ) -> EncodedWeights | None:
        """The delta from ``held`` to ``state``; None when it would not be smaller than full.

        Also None when the keys, a shape or a dtype changed since ``held`` (e.g. a mapping
        of other keys than the module last sent): there is nothing to diff against.
        """
        if _layout(held.state) != _layout(state):
            return None
        whole = sum({id(t): t.nbytes for t in state.values()}.values())  # a tied one once
        meta = {"model_id": model_id, **PushForm(wire_dtype=held.form.dtype).metadata()}
        blob = encode_delta(held.state, state, metadata=meta, max_bytes=whole)
        if blob is None:
            return None
        digest, crc = checksums(blob, self._settings.checksum)
        return EncodedWeights(
            model_id, version, blob, digest, crc, base_version=held.version, full=full
        )


def _layout(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Size, torch.dtype]]:
    return {key: (tensor.shape, tensor.dtype) for key, tensor in state.items()}


def _snapshot(source: WeightSource, form: PushOptions) -> dict[str, torch.Tensor]:
    """A private copy of the weights as they travel now (training changes the source in place).

    Read tensor by tensor, a copy an optimiser step on another thread changed meanwhile would
    hold some tensors from before the step and others from after it: the source is read
    again while its mark (:class:`~learner_client._shared_policy.WeightsMark`) says it
    changed during the read, up to :data:`SNAPSHOT_READS` reads in all. A step still under
    way as the last read ends leaves the source unlike the mark its push took: a followed
    ``policy=`` module is pushed again before the next batch.
    """
    for _ in range(SNAPSHOT_READS - 1):
        mark = WeightsMark.of(source)
        state = wire_state(source, dtype=form.dtype, only_trainable=form.only_trainable)
        if mark is None or mark.matches(source):
            return state
    return wire_state(source, dtype=form.dtype, only_trainable=form.only_trainable)


# ----------------------------------------------------------------------------- parts
