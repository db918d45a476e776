"""Weight pushes on the learner, told in one place: from the call to each actor's verdict.

1. ``update_policy_weights_`` is normalised into one request (``learner_client._update_args``).
2. The targets are checked: in the fleet, holding the model, taking parts for a part.
3. Under an explicit version, the learner ranks agree (same version, same weights), a
   rank whose check failed included: it refuses, and the others raise.
4. Each model is encoded once (``learner_client._weights.WeightBook``); with ``delta=True``
   each target gets a delta against what it holds where that is smaller.
5. The fleet streams every push concurrently and returns each actor's reply or error.
6. Here alone, per actor, the verdict: applied (book and ledger record it), transient (kept
   for the actor's re-admission), refused (dropped); a refused delta base: the full, at once.
7. A failure raises ``WeightPushError`` with failures and successes; automatic pushes log
   transient ones. A returning actor is re-sent what it lacks before its data is used.

Automatic pushes (``update_after_each_batch``, ``max_weight_update_interval``, the collector's
``policy=`` module) re-read the last weights given, so in-place training is picked up; an
actor that is down is skipped and receives the weights when it is re-admitted.

*Versions agreed across ranks.* After an optimiser step every data-parallel rank holds the
same weights and pushes them to the actors it owns under one explicit version (the step
count), which must be above what this rank's actors hold (versions only go up). When the
collector's ranks are torch.distributed's, every versioned push gathers each rank's
``(version, digest of the weights)`` through torch.distributed's store
(:class:`~learner_client._agreement.VersionAgreement`) and raises
:class:`~learner_client._errors.VersionConflictError` on every rank when they differ, before
anything is sent; a rank that does not push within ``call_timeout`` makes the others raise
:class:`~common.errors.DeadlineError`. The targets and models are checked before the ranks
agree: a rank that cannot push (an unknown worker_id, a model its actors lack, a stale
version) tells the others, which raise too, instead of pushing alone.

*Deltas.* ``delta=True`` sends each target only the elements that changed since the weights
it holds: :class:`~learner_client._deltas.DeltaTracker` chooses, per worker, a delta or the
full push. A worker that answers a delta with FAILED_PRECONDITION (it holds another version)
gets the full push of the same state and version at once, which the caller never sees as an
error.

*Parts.* When no learner process holds every parameter (FSDP2, tensor or pipeline
parallel), each rank calls ``update_policy_weights_(its_tensors, version=v, part=(rank,
world_size))``. The part takes the same path, every form included, with the part in its
header; each actor stages it and applies version ``v`` whole once every rank's part arrived
(``actor_service._serve._parts``). Per worker the call returns a :class:`PartResult`: the part was
staged, or it completed the version.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from common.checksum import crc32c
from common.errors import (
    ActorBusyError,
    ActorUnavailableError,
    ProtocolError,
    RlfleetError,
    SessionStateError,
    StaleVersionError,
    UnknownModelError,
    UnknownWorkerError,
    is_transient,
)
from common.tensor_bytes import byte_view
from common.weights import (
    Part,
    PushOutcome,
    wire_state,
)
from learner_client._agreement import VersionAgreement
from learner_client._deltas import DeltaTracker
from learner_client._description import ActorDescription
from learner_client._errors import WeightPushError
from learner_client._fleet import Fleet
from learner_client._ledger import Ledger
from learner_client._link import Link
from learner_client._metrics import LearnerMetrics
from learner_client._shared_policy import SharedPolicy, WeightsMark
from learner_client._transport import PushReply
from learner_client._update_args import (
    WeightRequest,
    normalize_update_args,
    resolve_worker_ids,
)
from learner_client._weights import EncodedWeights, PushOptions, WeightBook, WeightSource

__all__ = [
    "PartResult",
    "PushResults",
    "Pusher",
    "push_error",
    "weights_digest",
]

log = logging.getLogger("learner_client")

#: One actor's push: ``(worker_id, the encoded model it gets)``.
Pair: TypeAlias = "tuple[int, EncodedWeights]"
#: What one actor answered a push: its reply, or the error it failed with.
Reply: TypeAlias = "PushReply | BaseException"
#: ``(succeeded, failed)``: ``{model_id: {worker_id: reply}}``, ``{model_id: {worker_id: error}}``.
PushResults: TypeAlias = (
    "tuple[dict[str, dict[int, PushReply]], dict[str, dict[int, BaseException]]]"
)


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What one actor did with this rank's part of a multi-part push.

    Attributes:
        outcome: ``PushOutcome.STAGED`` (checked and held: the version applies when its
            last part arrives, or expires after the actor's part deadline) or
            ``PushOutcome.COMPLETED`` (this part was the last: the version is in force).
        version: The version the part belongs to.
        version_in_force: The actor's version once it took the part: ``version`` when
            completed, the one before while the version stages.
        parts_staged: The parts of ``version`` the actor held once it took this one.

    Example::

        results = collector.update_policy_weights_(shard, version=step, part=(rank, world))
        done = [w for w, r in results.items() if r.outcome is PushOutcome.COMPLETED]
    """

    outcome: PushOutcome
    version: int
    version_in_force: int
    parts_staged: int


@dataclasses.dataclass(eq=False)
class Pusher:
    """Issues the collector's weight pushes and keeps the verdict on each actor's push.

    Attributes:
        fleet: The actors the weights go to (it makes the calls and returns the replies).
        book: The weights given, their versions, what each worker holds and should hold.
        ledger: Counts automatic pushes, bytes, pauses and delta fallbacks.
        metrics: Times every push and counts its outcome, per model.
        deltas: What each worker holds, for ``delta=True`` pushes.
        agreement: Compares versioned pushes across the learner ranks.
    """

    fleet: Fleet
    book: WeightBook
    ledger: Ledger
    metrics: LearnerMetrics
    deltas: DeltaTracker
    agreement: VersionAgreement
    #: ``{model_id: (version, mark)}``: the weights of the model's last whole push, as read.
    marks: dict[str, tuple[int, WeightsMark]] = dataclasses.field(default_factory=dict)
    #: ``{worker_id: epoch}``: the process described last whose re-sent push was answered
    #: by another epoch (loop thread).
    answered_as_another: dict[int, int] = dataclasses.field(default_factory=dict)

    def unchanged_since_push(self, model_id: str) -> bool:
        """Whether every worker took the last weights given, and they did not change since.

        False when unsure: weights in a form that cannot be followed, a push to some
        workers only, parts, or a push that failed anywhere.
        """
        entry = self.marks.get(model_id)
        if entry is None or self.book.versions().get(model_id) != entry[0]:
            return False
        return entry[1].matches(self.book.source(model_id))

    def _mark(self, request: WeightRequest) -> dict[str, WeightsMark | None]:
        """Each model's mark of what a whole push to every worker is about to read."""
        if request.worker_ids is not None or request.part is not None or request.per_worker:
            return dict.fromkeys(request.sources)
        marks: dict[str, WeightsMark | None] = {}
        for mid, src in request.sources.items():
            if src is None and self.book.has_worker_sources(mid):
                marks[mid] = None  # each worker is re-sent its own weights: not one to follow
                continue
            try:
                marks[mid] = WeightsMark.of(src if src is not None else self.book.source(mid))
            except SessionStateError:
                marks[mid] = None
        return marks

    def update(self, request: WeightRequest) -> dict:
        """Carry out one normalised ``update_policy_weights_`` call.

        Returns:
            ``{worker_id: version}``, or ``{model_id: {worker_id: version}}`` when nested.

        Raises:
            ValueError: An explicit version not above what this rank's actors hold, or
                per-worker weights under one (an agreed version names one set of weights).
            VersionConflictError, DeadlineError: As :meth:`VersionAgreement.check`.
            UnknownWorkerError: A target not in the fleet.
            UnknownModelError: A target without the model.
            WeightPushError: Some targets failed.
        """
        try:
            targets, refusal = self._targets(request), None
        except (UnknownWorkerError, UnknownModelError, SessionStateError) as exc:
            targets, refusal = [], exc
        self._agree(request, refusal)
        marks = self._mark(request)
        with self.book.taken_back_on_error(request.sources) as before:  # all encode, or none
            if request.delta:
                pairs = self._encode_deltas(request, targets)
            else:
                pairs = self._encode(request, targets)
        results = self._push_deltas(request, pairs) if request.delta else self._push(pairs)
        for mid, failures in results[1].items():
            if failures and not results[0].get(mid) and _refusals(failures) == failures:
                self.book.restore(mid, before)  # every target refused: as if never given
        for mid, mark in marks.items():
            if mark is None or results[1].get(mid) or refusal is not None:
                self.marks.pop(mid, None)
            else:
                self.marks[mid] = (self.book.versions().get(mid, 0), mark)
        return _outcome(*results, request)

    def _targets(self, request: WeightRequest) -> list[int]:
        """The push's target worker_ids, checked: in the fleet, holding the models, taking parts.

        A part goes to every member: each actor needs every rank's part of a version.
        """
        known = self.fleet.worker_ids if request.part is None else self.fleet.member_ids
        targets = resolve_worker_ids(request.worker_ids, known, self.fleet.member_ids)
        self._check_models(request.sources, targets)
        if request.part is not None:
            check_parts_accepted(self.fleet, targets)
        return targets

    def _agree(self, request: WeightRequest, refusal: Exception | None) -> None:
        """Agree with the other ranks on an explicit version, or refuse, before anything is sent.

        ``refusal`` is this rank's own (a target check failed); a version not above what
        its actors hold is another. Either is raised after the other ranks learned of it. A
        part of a multi-part push is pushed as is: each rank's part holds other weights on
        purpose, so there is nothing to agree on.
        """
        version = request.version
        if refusal is None and version is not None and request.part is None:
            stale = _refusal(self.book, request, version)
            refusal = ValueError(stale) if stale is not None else None
        if version is not None and request.part is None and self.agreement.active:
            digest = 0 if refusal else _request_digest(self.book, request)
            self.agreement.check(
                version, digest, refused=refusal is not None, model_ids=tuple(request.sources)
            )
        if refusal is not None:
            raise refusal

    def _encode(self, request: WeightRequest, targets: list[int]) -> list[Pair]:
        """Each target's push of a whole (or part) request, each distinct one encoded once."""
        pairs: list[Pair] = []
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
        return pairs

    def _encode_deltas(self, request: WeightRequest, targets: list[int]) -> list[Pair]:
        """Each target's push of a ``delta=True`` request: a delta where the tracker can."""
        pairs: list[Pair] = []
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
        return pairs

    def _push_deltas(self, request: WeightRequest, pairs: list[Pair]) -> PushResults:
        """Push a ``delta=True`` request's pairs; a delta an actor cannot apply: the full push."""
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
            self.deltas.settle(mid, held, failed.get(mid, {}), part=part_version is not None)
        return succeeded, failed

    def _check_models(self, sources: Mapping[str, object], targets: list[int]) -> None:
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
        for mid, errs in failed.items():
            for wid, exc in errs.items():
                log.warning("automatic push of %s to worker_id %d failed: %s", mid, wid, exc)
        fatal = {mid: _refusals(errs) for mid, errs in failed.items()}
        if any(fatal.values()):
            versions = {m: {w: r.version for w, r in rs.items()} for m, rs in succeeded.items()}
            raise push_error(versions, fatal, nested=True)

    def push_shared(self, shared: SharedPolicy | None, model_id: str) -> None:
        """Push the collector's ``policy=`` module to every reachable actor if it is due.

        Each push is a delta where the actors hold the previous one and it is smaller, a
        full push otherwise. An actor that is down gets the weights when it is re-admitted.

        Raises:
            WeightPushError: A reachable actor refused the push (not a transient failure).
        """
        if shared is None or not shared.due():
            return
        targets = [w for w in self.fleet.worker_ids if self.fleet.reachable(w)]
        if not targets:
            return
        shared.mark_pushed()  # before encoding: a change made while it travels is seen next time
        request = normalize_update_args(
            policy=shared.module, model_id=model_id, worker_ids=targets, delta=True
        )
        try:
            self.update(request)
            self.ledger.add_auto_push()
        except WeightPushError as exc:
            shared.forget()
            if _refusals(exc.failed):
                raise
            log.warning(
                "pushing the shared policy to worker_ids %s failed: %s", sorted(exc.failed), exc
            )
        except BaseException:
            shared.forget()  # not sent (a module that cannot travel), or cut off: sent again
            raise
        finally:
            self._address_the_down(model_id, targets)

    def _address_the_down(self, model_id: str, pushed_to: list[int]) -> None:
        """The push just made to ``pushed_to`` is what the actors that were down should hold.

        They were not sent it (each would have cost a connection attempt); a re-admitted one
        is sent it whole, the very bytes the others got under its version, before its data
        is used: with the push it held before, a sync batch would mix two versions.
        """
        down = [w for w in self.fleet.worker_ids if w not in pushed_to]
        version = self.book.versions().get(model_id, 0)
        sent = [self.book.addressed_to(w, model_id) for w in pushed_to]
        latest = [enc for enc in sent if enc is not None and enc.version == version]
        if down and latest:
            self.book.addressed(down, latest[0])

    def address_the_joined(self, worker_ids: Sequence[int]) -> None:
        """Actors that joined should hold each model's latest push, as its targets do.

        The push is sent when a joiner's first session opens (:meth:`admit`), before its
        frames count: with its starting weights it would act with version 0.
        """
        for model_id, version in self.book.versions().items():
            sent = (self.book.addressed_to(w, model_id) for w in self.fleet.worker_ids)
            latest = [
                enc
                for enc in sent
                if enc is not None and enc.version == version and enc.part is None
            ]
            if latest:
                self.book.addressed(worker_ids, latest[0])

    async def admit(self, link: Link, desc: ActorDescription) -> None:
        """Re-send a returning actor what it should hold, before its data is used (loop thread).

        A re-send refused as stale is what it should hold already: the push it missed, held
        back by the outage, reached it after ``desc`` was read.

        Raises:
            RlfleetError: A transient failure, or another learner's session holds the actor
                (:func:`_deferred`): the session is retried, with this push first.
        """
        self.book.observe(link.worker_id, desc.models, desc.epoch)
        for enc in self.book.pending(link.worker_id, desc.models):
            try:
                reply = await self.fleet.push_to(link, enc)
            except StaleVersionError:
                # The push it missed reached it after it was described (an outage held it
                # back): it holds this version or a newer one, which it should still hold.
                self.book.acknowledged(link.worker_id, enc.model_id, enc.version, desc.epoch)
                log.info(
                    "worker_id %d holds %s version %d already",
                    link.worker_id,
                    enc.model_id,
                    enc.version,
                )
                continue
            except RlfleetError as exc:
                if _deferred(exc):  # the session is retried, with this push first
                    raise
                # Retrying a push the actor rejects would keep it out for good.
                self._refused_on_readmission(link.worker_id, enc, exc)
                continue
            self.ledger.pushed(len(enc.blob), reply.pause_seconds)
            if not self.book.acknowledged(link.worker_id, enc.model_id, reply.version, reply.epoch):
                self._answered_by_another(link.worker_id, enc, reply, desc.epoch)
                continue
            self.answered_as_another.pop(link.worker_id, None)
            log.info(
                "pushed %s version %d to worker_id %d before its data is used",
                enc.model_id,
                reply.version,
                link.worker_id,
            )

    def _answered_by_another(
        self, worker_id: int, enc: EncodedWeights, reply: PushReply, epoch: int
    ) -> None:
        """A re-sent push answered by another process than the one just described (``epoch``).

        The first time it restarted in between: its next Describe shows the new process. The
        same process described again answering so once more lies about its epoch: the push is
        refused as a :class:`ProtocolError` and not re-sent, or every catch-up and
        reconnection would send it again, forever.

        Raises:
            ActorUnavailableError: The first time: the actor is re-described and admitted.
        """
        if self.answered_as_another.get(worker_id) != epoch:
            self.answered_as_another[worker_id] = epoch
            raise ActorUnavailableError(
                f"worker_id {worker_id} restarted while it was being admitted"
            )
        error = ProtocolError(
            f"the push of {enc.model_id!r} version {enc.version} was answered twice by epoch "
            f"{reply.epoch}, though Describe gives epoch {epoch} before and after"
        )
        self._refused_on_readmission(worker_id, enc, error)

    def _refused_on_readmission(
        self, worker_id: int, enc: EncodedWeights, error: RlfleetError
    ) -> None:
        """Forget a re-sent push the actor refused (it is not sent again) and log why."""
        self.book.forget(worker_id, enc.model_id, enc.version)
        log.error(
            "worker_id %d rejected %s version %d on re-admission: %s",
            worker_id,
            enc.model_id,
            enc.version,
            error,
        )

    def _push(self, pairs: list[Pair], fallbacks: int = 0, continues: bool = False) -> PushResults:
        """Send every pair concurrently; record each actor's verdict, the call's bytes and time."""
        started = time.monotonic()
        replies = self.fleet.push(pairs)
        succeeded: dict[str, dict[int, PushReply]] = {enc.model_id: {} for _, enc in pairs}
        failed: dict[str, dict[int, BaseException]] = {enc.model_id: {} for _, enc in pairs}
        for (wid, enc), reply in zip(pairs, replies, strict=True):
            self._record(wid, enc, reply)
            if isinstance(reply, BaseException):
                failed[enc.model_id][wid] = reply
            else:
                succeeded[enc.model_id][wid] = reply
        applied = [enc for w, enc in pairs if w in succeeded[enc.model_id]]
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

    def _record(self, worker_id: int, enc: EncodedWeights, reply: Reply) -> None:
        """The verdict on one actor's push: what the book and the ledger keep of it.

        Applied: the actor holds the version its reply says is in force (a part's: the
        version before while the part's version stages, so batches acted with it still
        count), and a whole push is what it should hold from now on; a reply from a process
        the learner has since seen replaced (another epoch) is what it should hold, re-sent
        to its successor, not what that one holds. Deferred (:func:`_deferred`: the actor is
        down, cut off, or held by another learner): a whole push is still what it should hold,
        re-sent when it is re-admitted, or once reachable again if its session outlived the
        outage (:meth:`~learner_client._link.ActorLink.catch_up`). Refused: nothing is
        kept. A part is never re-sent to a returning actor: alone it could not complete its
        version.
        """
        whole = enc.part is None
        if isinstance(reply, BaseException):
            if whole and _deferred(reply):
                self.book.addressed([worker_id], enc)
                self._catch_up(worker_id)
            return
        if whole:
            self.book.addressed([worker_id], enc)
        self.ledger.pushed(len(enc.blob), reply.pause_seconds)
        if not self.book.acknowledged(worker_id, enc.model_id, reply.version, reply.epoch):
            log.info(
                "worker_id %d restarted after applying %s version %d: sent again",
                worker_id,
                enc.model_id,
                reply.version,
            )
            self._catch_up(worker_id)

    def _catch_up(self, worker_id: int) -> None:
        """Have a worker's link re-send what it should hold once reachable (loop thread).

        Its stream may outlive the outage, or belong to a process admitted since: no
        re-admission would follow otherwise (:meth:`~learner_client._link.ActorLink.catch_up`).
        """
        link = self.fleet.member_links().get(worker_id)
        if link is not None:
            self.fleet.loop.call_soon(link.catch_up)


def _deferred(exc: BaseException) -> bool:
    """Whether a failed push is still what its actor should hold, sent when it is admitted.

    The actor was down or cut off (a transient failure), or another learner's session holds
    it (``ActorBusyError``: it refuses our pushes as it refuses our session, and takes them
    once its session is ours). Any other failure is the actor refusing the weights.
    """
    return is_transient(exc) or isinstance(exc, ActorBusyError)


def _refusals(failed: Mapping[int, BaseException]) -> dict[int, BaseException]:
    """The failures that are not deferred (:func:`_deferred`): the actor refused the push."""
    return {w: e for w, e in failed.items() if not _deferred(e)}


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


# ------------------------------------------------------- versions agreed across ranks


def _request_digest(book: WeightBook, request: WeightRequest) -> int:
    """One digest of every model a request pushes, in the form each is pushed in."""
    digest = 0
    for mid, src in sorted(request.sources.items()):
        if src is None:  # the last weights given, in the form they were last sent
            source, form = book.source(mid), book.options(mid, request.options)
        else:
            source, form = src, request.options or PushOptions()
        digest = crc32c(f"{mid}:{weights_digest(source, form)};".encode(), digest)
    return digest


def _refusal(book: WeightBook, request: WeightRequest, version: int) -> str | None:
    """Why this rank cannot push ``request`` under ``version``, or None."""
    if request.per_worker is not None:
        return "version= takes one set of weights for every actor, not per-worker ones"
    held = book.versions()
    behind = {m: held[m] for m in sorted(request.sources) if held.get(m, 0) >= version}
    if behind:
        return (
            f"version={version} is not above the version this collector's actors hold "
            f"({behind}): versions only go up"
        )
    return None


def weights_digest(source: WeightSource, options: PushOptions) -> int:
    """CRC-32C of the tensors a push of ``source`` carries: keys, dtypes, shapes and bytes.

    Equal weights in equal form give equal digests on every rank and every machine.
    """
    state = wire_state(source, dtype=options.dtype, only_trainable=options.only_trainable)
    digest = 0
    for key in sorted(state):
        tensor = state[key]
        head = f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode()
        digest = crc32c(head, digest)
        if tensor.numel():
            digest = crc32c(byte_view(tensor).numpy().data, digest)
    return digest


def check_parts_accepted(fleet: Fleet, targets: Sequence[int]) -> None:
    """Refuse a part push before anything is sent if a target cannot stage parts.

    Raises:
        SessionStateError: Naming the workers whose actors predate multi-part pushes
            (an older one would take a part for a whole subset push).
    """
    lacking = [w for w in targets if not fleet.accepts_parts(w)]
    if lacking:
        raise SessionStateError(
            f"worker_ids {lacking} take no multi-part pushes (their Describe gives no part "
            f"deadline): run an rlfleet-actor that does, or push whole weights"
        )


def as_parts(encoded: Mapping[int, EncodedWeights], part: Part | None) -> dict[int, EncodedWeights]:
    """Each worker's push as ``part`` (a delta's full fallback too); unchanged if None."""
    if part is None:
        return dict(encoded)
    return {wid: _as_part(enc, part) for wid, enc in encoded.items()}


def _as_part(enc: EncodedWeights, part: Part) -> EncodedWeights:
    full = enc.full
    if full is None:
        return dataclasses.replace(enc, part=part)
    return dataclasses.replace(enc, part=part, full=lambda: dataclasses.replace(full(), part=part))


def part_result(reply: PushReply, request: WeightRequest) -> int | PartResult:
    """A worker's entry in ``update_policy_weights_``'s result: a version, or a part's result."""
    if request.part is None or request.version is None:
        return reply.version
    return PartResult(reply.outcome, request.version, reply.version, reply.parts_staged)
