"""Weight pushes as the collector issues them: explicit ones, automatic ones, and their errors.

One path for every push: check the targets hold the model, encode each
model once (:meth:`~learner_client._weights.WeightBook.encode`), stream it to
all targets concurrently (:meth:`~learner_client._fleet.Fleet.push`), then
report per-worker results. A push that failed on some workers raises
:class:`~learner_client._errors.WeightPushError` listing both the failures
and the successes. Automatic pushes (``update_after_each_batch``,
``max_weight_update_interval``) re-read the last weights given, so in-place
training is picked up; an actor that is down is skipped and receives the
weights when it is re-admitted. A ``delta=True`` push sends each target a sparse
delta where it can (:class:`~learner_client._delta_tracker.DeltaTracker`); a target
that refuses its delta with FAILED_PRECONDITION gets the full push of the same
state and version at once, which the caller never sees as an error. A ``part=`` push
(``learner_client._part_pushes``) takes the same path, every form included, with an
explicit version, and reports per worker whether its part was staged or completed the
version.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from common.errors import SessionStateError, UnknownModelError, is_transient
from learner_client._delta_tracker import DeltaTracker
from learner_client._errors import WeightPushError
from learner_client._fleet import Fleet, PushResults
from learner_client._ledger import Ledger
from learner_client._metrics import LearnerMetrics
from learner_client._part_pushes import as_parts, check_parts_accepted, part_result
from learner_client._weight_args import PushOptions, WeightRequest, resolve_worker_ids
from learner_client._weights import EncodedWeights, WeightBook

__all__ = ["Pusher"]

log = logging.getLogger("learner_client")


@dataclasses.dataclass(eq=False)
class Pusher:
    """Issues the collector's weight pushes.

    Attributes:
        fleet: The actors the weights go to.
        book: The weights given, their versions, and which worker is due an update.
        ledger: Counts automatic pushes, bytes, pauses and delta fallbacks.
        metrics: Times every push and counts its outcome, per model.
        deltas: What each worker holds, for ``delta=True`` pushes.
    """

    fleet: Fleet
    book: WeightBook
    ledger: Ledger
    metrics: LearnerMetrics
    deltas: DeltaTracker

    def update(self, request: WeightRequest) -> dict:
        """Carry out one normalised ``update_policy_weights_`` call.

        Returns:
            ``{worker_id: version}``, or ``{model_id: {worker_id: version}}`` when nested.

        Raises:
            UnknownWorkerError: A target not in the fleet.
            UnknownModelError: A target without the model.
            WeightPushError: Some targets failed.
        """
        # A part goes to every member: each actor needs every rank's part of a version.
        known = self.fleet.worker_ids if request.part is None else self.fleet.member_ids
        targets = resolve_worker_ids(request.worker_ids, known)
        self._check_models(request.sources, targets)
        if request.part is not None:
            check_parts_accepted(self.fleet, targets)
        if request.delta:
            return self._update_delta(request, targets)
        pairs: list[tuple[int, EncodedWeights]] = []
        version = request.version
        for mid, src in request.sources.items():
            given = request.options or PushOptions()  # new weights: as the call says
            if request.per_worker is not None:  # TorchRL's {worker_id: weights}
                encoded = self.book.encode_for(mid, request.per_worker, given, version)
                pairs += sorted(encoded.items())
            elif src is None:  # re-send the last weights, in the last form unless told
                sources = dict.fromkeys(targets)
                encoded = self.book.encode_for(mid, sources, request.options, version)
                pairs += sorted(encoded.items())
            else:
                enc = self.book.encode(mid, src, given, version=version, part=request.part)
                pairs += [(wid, enc) for wid in targets]
        succeeded, failed = self._push(pairs)
        return _outcome(succeeded, failed, request)

    def _update_delta(self, request: WeightRequest, targets: list[int]) -> dict:
        """A ``delta=True`` push: deltas where the tracker can, full pushes elsewhere."""
        pairs: list[tuple[int, EncodedWeights]] = []
        for mid, src in request.sources.items():
            sources = {w: src if src is not None else self.book.source_for(mid, w) for w in targets}
            # New weights: as the call says; a re-send of the last ones: as last encoded.
            form = request.options or PushOptions()
            if src is None:
                form = self.book.options(mid, request.options)
            whole = request.part is None  # a part is not the model's last weights
            version = self.book.claim_version(mid, src if whole else None, request.version)
            encoded = self.deltas.encode(mid, sources, version, form)
            pairs += sorted(as_parts(encoded, request.part).items())
            if whole:
                self.book.use_options(mid, form)
        succeeded, failed = self._push(pairs)
        # A target at another version than the delta's base: the full push, at once.
        retry = [
            (w, enc.full())
            for w, enc in pairs
            if enc.full is not None and isinstance(failed[enc.model_id].get(w), SessionStateError)
        ]
        if retry:
            again, still = self._push(retry, fallbacks=len(retry), continues=True)
            for mid in again:
                for wid, reply in again[mid].items():
                    failed[mid].pop(wid, None)
                    succeeded[mid][wid] = reply
                failed[mid].update(still[mid])
        # A part staged or completed: the worker is taken to hold its version.
        part_version = request.version if request.part is not None else None
        for mid in request.sources:
            held = {w: part_version or r.version for w, r in succeeded.get(mid, {}).items()}
            self.deltas.settle(mid, held, failed.get(mid, {}))
        return _outcome(succeeded, failed, request)

    def _check_models(self, sources: dict[str, Any], targets: list[int]) -> None:
        for mid in sources:
            lacking = [w for w in targets if mid not in self.fleet.models_of(w)]
            if lacking:
                have = {w: self.fleet.models_of(w) for w in lacking}
                raise UnknownModelError(
                    f"model_id {mid!r} is not registered on worker_ids {lacking}; they have {have}"
                )

    def auto_update(self, candidates: Sequence[int], interval: int | None) -> None:
        """Push the last weights given to every candidate whose update is due.

        Raises:
            WeightPushError: A reachable worker rejected the push (unreachable ones are
                logged; they get the weights when they are re-admitted).
        """
        models = self.book.models_with_sources()
        if interval is None or not models:
            return
        due = [w for w in candidates if self.fleet.reachable(w) and self.book.due(w, interval)]
        if not due:
            return
        pairs = [
            pair for mid in models for pair in self.book.encode_for(mid, dict.fromkeys(due)).items()
        ]
        succeeded, failed = self._push(pairs)
        self.ledger.add_auto_push()
        fatal = {
            mid: {w: e for w, e in errs.items() if not is_transient(e)}
            for mid, errs in failed.items()
        }
        for mid, errs in failed.items():
            for wid, exc in errs.items():
                log.warning("automatic push of %s to worker_id %d failed: %s", mid, wid, exc)
        if any(fatal.values()):
            versions = {m: {w: r.version for w, r in rs.items()} for m, rs in succeeded.items()}
            raise push_error(versions, fatal, nested=True)

    def _push(
        self, pairs: list[tuple[int, EncodedWeights]], fallbacks: int = 0, continues: bool = False
    ) -> PushResults:
        started = time.monotonic()
        succeeded, failed = self.fleet.push(pairs)
        applied = [enc for w, enc in pairs if w in succeeded.get(enc.model_id, {})]
        pauses = [r.pause_seconds for replies in succeeded.values() for r in replies.values()]
        self.ledger.push_call(
            sum(len(enc.blob) for w, enc in pairs),
            max(pauses, default=0.0),
            deltas=sum(enc.base_version is not None for enc in applied),
            fallbacks=fallbacks,
            continues=continues,
        )
        seconds = time.monotonic() - started
        for model_id in sorted({encoded.model_id for _, encoded in pairs}):
            self.metrics.record_push(model_id, seconds, ok=not failed.get(model_id))
        return succeeded, failed


def _outcome(succeeded: dict, failed: dict, request: WeightRequest) -> dict:
    """What ``update_policy_weights_`` returns, or the error it raises if any target failed.

    Per worker: the version now in force (a whole push), or a :class:`PartResult`.
    """
    results = {
        mid: {wid: part_result(reply, request) for wid, reply in replies.items()}
        for mid, replies in succeeded.items()
    }
    if any(failed.values()):
        raise push_error(results, failed, nested=request.nested)
    return results if request.nested else next(iter(results.values()))


def push_error(succeeded: dict, failed: dict, *, nested: bool) -> WeightPushError:
    """Build the :class:`WeightPushError` of a push with failures (flattened unless nested)."""
    detail = "; ".join(
        f"{mid} on worker_id {w}: {exc}"
        for mid, errs in failed.items()
        for w, exc in sorted(errs.items())
    )
    if not nested:
        succeeded, failed = next(iter(succeeded.values())), next(iter(failed.values()))
    return WeightPushError(
        f"weight push failed ({detail}); succeeded: {succeeded}", succeeded=succeeded, failed=failed
    )
