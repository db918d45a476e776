"""Multi-part pushes on an actor: each part checked and staged, the version applied whole.

Learner ranks that each hold some of a model's tensors push them as the parts of one
agreed version (``WeightsHeader.part``, ``common.weights.Part``). Each part is received,
checksummed, decoded and checked against the model like any push, then staged here;
the version is swapped in, under the model's lock and in one pause, when its last part
arrives. Until then the version in force does not change::

    part 0 of v ──check──▶ staged ─┐
    part 1 of v ──check──▶ staged ─┼─ all `count` parts ──▶ swap v whole (COMPLETED)
                                   │
                                   └─ `deadline` after the first part ──▶ expired: dropped

Per model, at most one version stages at a time, and its parts together hold at most
one copy of the model's bytes. The rules, each refusal naming the version and the part:

* a part of a version not newer than the one in force, or than a version whose parts
  were dropped (expired, superseded, failed; the floor is kept per model, the reasons of
  the last few are remembered) is stale: ABORTED. An expired version is never revived;
* a part of an older version than the one staging is stale (ABORTED); a part of a newer
  version drops the staging one, which is superseded;
* a part index staged already is a replay (ABORTED); one whose header names other bytes
  (its checksums) is another push of the version (a learner job restarted between its
  ranks' parts): the version is dropped too, so that it never completes with parts of
  two pushes; a count that differs from the
  staging parts', keys another part holds already, a delta base other than the other
  delta parts' or, once the last part arrives, whole parts that do not cover every key
  of the model (a version with delta parts keeps its base's values for the keys no part
  holds) are INVALID_ARGUMENT; more staged bytes than the model holds, or than the actor's
  ``--max-weight-bytes`` (which caps a version's parts together as it caps a whole push's
  blob), are RESOURCE_EXHAUSTED and drop the version. A refused part leaves the staged ones
  as they were, except that a version that can no longer complete is dropped.

Every drop is logged as ``weights.parts.dropped`` (reason ``expired``, ``superseded``,
``failed``, ``conflict``) with the version, the parts staged and their count.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

import torch

from actor_service._core._protocol import CoreModels
from actor_service._core._swap import StagedParts
from actor_service._serve._logging import log_event
from common.errors import StaleVersionError, WeightsError, WeightsTooLargeError
from common.weights import Delta, Part, PushForm, decode_delta, decode_weights

__all__ = ["PartBuffers", "PartStaging", "StagedPart", "decode_part"]

# Dropped versions whose reasons a model remembers (for the refusals' messages).
_REMEMBERED = 16
_SHOWN = 10


@dataclasses.dataclass(frozen=True)
class StagedPart:
    """One checked part, ready to copy.

    Attributes:
        part: Its index and count.
        tensors: Whole tensors (of a whole part, or a delta part's dense entries), in the
            model's dtypes, on its device.
        delta: A delta part's sparse entries, on the model's device.
        base_version: A delta part's base version; None for a whole part.
        digest: The checksums its header named (which bytes it is).
        buffer: The receive buffer the part's tensors may view, held until its version
            is swapped in or dropped (then :class:`PartBuffers` may keep it).
        lent: ``buffer`` came from :class:`PartBuffers` (else it was allocated for the part).
        received: The bytes of its blob as they arrived (a wire dtype's, before the cast to
            the model's): what ``--max-weight-bytes`` caps, as it caps a whole push's blob.
    """

    part: Part
    tensors: dict[str, torch.Tensor]
    delta: Delta
    base_version: int | None = None
    digest: str = ""
    buffer: torch.Tensor | None = dataclasses.field(default=None, compare=False)
    lent: bool = False
    received: int = 0

    @property
    def keys(self) -> set[str]:
        """The model keys this part writes."""
        return set(self.tensors) | set(self.delta)

    @property
    def nbytes(self) -> int:
        """The bytes it holds (a tensor under several keys counted once)."""
        distinct = {id(t): t for t in self.tensors.values()}
        held = [*distinct.values(), *(t for pair in self.delta.values() for t in pair)]
        return sum(t.numel() * t.element_size() for t in held)


@dataclasses.dataclass
class _Staging:
    """The parts of one version of one model staged so far."""

    version: int
    count: int
    started: float
    parts: dict[int, StagedPart] = dataclasses.field(default_factory=dict)
    base_version: int | None = None  # shared by its delta parts
    keys: set[str] = dataclasses.field(default_factory=set)
    nbytes: int = 0
    received: int = 0  # its parts' blobs' bytes, as they arrived

    def merged(self) -> StagedParts:
        tensors: dict[str, torch.Tensor] = {}
        delta: Delta = {}
        for index in sorted(self.parts):
            tensors.update(self.parts[index].tensors)
            delta.update(self.parts[index].delta)
        return StagedParts(tensors, delta, self.base_version)


def decode_part(
    models: CoreModels,
    model_id: str,
    blob: bytes | memoryview,
    part: Part,
    base_version: int | None,
    max_bytes: int,
) -> StagedPart:
    """Decode and check one part as a push is checked, and stage it; change nothing.

    A whole part is checked like a subset push (keys, shapes, dtypes under its declared
    wire dtype, ties, NaN/Inf after the cast) and cast onto the model's device; a delta
    part (``base_version`` set) like a delta push, its dense entries made whole
    (``ModelBook.stage_delta``), so the staged parts of a version hold at most the
    model's bytes.

    Raises:
        WeightsError: As the push of the same form would be refused.
        WeightsTooLargeError: Over ``max_bytes``.
    """
    expected = models.parameters_info(model_id)
    if base_version is not None:
        delta = decode_delta(memoryview(blob), expected, max_bytes=max_bytes)
        tensors, sparse = models.stage_delta(model_id, delta)
        return StagedPart(part, tensors, sparse, base_version)
    state, metadata = decode_weights(
        blob,
        max_bytes=max_bytes,
        expected=expected,
        allow_non_finite=True,
        subset=True,
        adapter=models.adapter,
    )
    form = dataclasses.replace(PushForm.from_metadata(metadata), subset=True)
    return StagedPart(part, models.validate(model_id, state, form), {})


class PartStaging:
    """The multi-part versions an actor is staging, at most one per model.

    Thread-safe: parts are checked on worker threads and expired from the event loop.

    Args:
        deadline: Seconds from a version's first staged part to its expiry.
        release: Called with ``(model_id, parts, applied=False)`` for the parts of a
            dropped version (their receive buffers may be reused).
        clock: The monotonic clock (tests pass a fake one).
    """

    def __init__(
        self,
        deadline: float,
        release: Callable[[str, list[StagedPart], bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline = deadline
        self._release = release or (lambda model_id, parts, applied: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._staging: dict[str, _Staging] = {}
        self._floor: dict[str, int] = {}  # per model: the newest version dropped or finished
        self._dropped: dict[str, collections.OrderedDict[int, str]] = {}

    # ------------------------------------------------------------------ checks

    def admit(
        self, model_id: str, version: int, part: Part, base_version: int | None, digest: str = ""
    ) -> None:
        """Refuse a part from its header alone, before its bytes are buffered.

        Raises:
            StaleVersionError: A dropped or finished version, one older than the staging
                one, or a part index staged already (with other bytes: ``digest``, the
                version is dropped).
            WeightsError: A count or a delta base that disagrees with the staged parts.
        """
        with self._lock:
            self._expire_locked()
            self._check_locked(model_id, version, part, base_version, digest)

    def _check_locked(
        self, model_id: str, version: int, part: Part, base_version: int | None, digest: str
    ) -> None:
        floor = self._floor.get(model_id)
        if floor is not None and version <= floor:
            remembered = self._dropped.get(model_id)
            why = None if remembered is None else remembered.get(version)
            what = f"version {version} {why}" if why else f"a version up to {floor} ended"
            raise StaleVersionError(
                f"part {part} of version {version} of model {model_id!r} comes too late: "
                f"{what}; no part of it (or of an older version) is accepted now"
            )
        staging = self._staging.get(model_id)
        if staging is None or version > staging.version:
            return
        if version < staging.version:
            raise StaleVersionError(
                f"part {part} of version {version} of model {model_id!r} is older than "
                f"version {staging.version}, whose parts are staging"
            )
        if part.count != staging.count:
            raise WeightsError(
                f"part {part} of version {version} of model {model_id!r} says {part.count} "
                f"parts, but its staged parts say {staging.count}"
            )
        if part.index in staging.parts:
            where = f"part {part} of version {version} of model {model_id!r}"
            if digest != staging.parts[part.index].digest:
                why = f"was dropped: its {where} came again with other bytes (another push)"
                self._drop_locked(model_id, why, "conflict")
                raise StaleVersionError(
                    f"{where} is staged already with other bytes: another push of version "
                    f"{version} (a learner restarted between its ranks' parts?); the version "
                    "is dropped, push a newer one"
                )
            raise StaleVersionError(f"{where} is staged already (a replayed part)")
        if base_version is not None and staging.base_version not in (None, base_version):
            raise WeightsError(
                f"delta part {part} of version {version} of model {model_id!r} applies on "
                f"version {base_version}, but its other delta parts on {staging.base_version}"
            )

    # ----------------------------------------------------------------- staging

    def stage(
        self,
        model_id: str,
        version: int,
        staged: StagedPart,
        model_keys: Mapping[str, object],
        model_bytes: int,
        max_weight_bytes: int | None = None,
    ) -> tuple[int, StagedParts | None, list[StagedPart]]:
        """Add a checked part; return the parts staged and, once all arrived, the whole version.

        A returned version is no longer staging (it is finished: swap it in, then release
        its parts, the third item); a version that can no longer complete (whole parts
        missing keys) is dropped. A part refused here stays the caller's (its buffer too).
        ``max_weight_bytes`` (the actor's ``--max-weight-bytes``) caps a version's parts'
        blobs together (``StagedPart.received``), as it caps the one blob of a whole push.

        Raises:
            StaleVersionError, WeightsError: As :meth:`admit` (checked again: the
                staging may have changed while this part arrived).
            WeightsError: Keys another part holds already, or whole parts that do not
                cover every key of the model.
            WeightsTooLargeError: More staged bytes than the model holds or than
                ``max_weight_bytes``.
        """
        with self._lock:
            self._expire_locked()
            self._check_locked(model_id, version, staged.part, staged.base_version, staged.digest)
            staging = self._staging.get(model_id)
            if staging is None or staging.version < version:
                fresh = _Staging(version, staged.part.count, self._clock())
                self._add_locked(model_id, fresh, staged, model_bytes, max_weight_bytes)
                if staging is not None:  # dropped only once the newer part is accepted
                    self._drop_locked(
                        model_id, f"was superseded by version {version}", "superseded"
                    )
                staging = fresh
            else:
                try:
                    self._add_locked(model_id, staging, staged, model_bytes, max_weight_bytes)
                except WeightsTooLargeError as exc:  # the version can no longer complete
                    self._drop_locked(model_id, f"failed: {exc}", "failed")
                    raise
            self._staging[model_id] = staging
            if len(staging.parts) < staging.count:
                return len(staging.parts), None, []
            parts = list(staging.parts.values())
            return staging.count, self._finish_locked(model_id, model_keys, staged), parts

    def _add_locked(
        self,
        model_id: str,
        staging: _Staging,
        staged: StagedPart,
        model_bytes: int,
        max_weight_bytes: int | None,
    ) -> None:
        where = f"part {staged.part} of version {staging.version} of model {model_id!r}"
        overlap = sorted(staged.keys & staging.keys)
        if overlap:
            more = f" and {len(overlap) - _SHOWN} more" if len(overlap) > _SHOWN else ""
            raise WeightsError(
                f"{where} holds keys another part of it holds already: "
                f"{overlap[:_SHOWN]}{more}; each key travels in one part"
            )
        total = staging.nbytes + staged.nbytes
        if total > model_bytes:
            raise WeightsTooLargeError(
                f"{where} would stage {total} bytes, more than the model's {model_bytes}"
            )
        received = staging.received + staged.received
        if max_weight_bytes is not None and received > max_weight_bytes:
            raise WeightsTooLargeError(
                f"{where}: its version's parts together, {received} bytes exceeds the cap of "
                f"{max_weight_bytes} bytes (--max-weight-bytes caps a push, whole or in parts)"
            )
        staging.parts[staged.part.index] = staged
        staging.keys |= staged.keys
        staging.nbytes += staged.nbytes
        staging.received += staged.received
        if staged.base_version is not None:
            staging.base_version = staged.base_version

    def _finish_locked(
        self, model_id: str, model_keys: Mapping[str, object], last: StagedPart
    ) -> StagedParts:
        staging = self._staging.pop(model_id)
        self._floor[model_id] = max(self._floor.get(model_id, 0), staging.version)
        missing = sorted(set(model_keys) - staging.keys)
        if missing and staging.base_version is None:
            more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
            reason = f"lacked keys {missing[:_SHOWN]}{more} once all {staging.count} parts arrived"
            self._remember(model_id, staging.version, f"failed: it {reason}")
            self._log_drop(model_id, staging, "failed", reason)
            # The refused last part stays its caller's, as on every refusal: the caller
            # gives its buffer back (twice given, the pool would lend it while still read).
            others = [p for p in staging.parts.values() if p is not last]
            self._release(model_id, others, False)
            raise WeightsError(
                f"version {staging.version} of model {model_id!r} {reason}: whole parts must "
                f"hold every key of the model between them; the version is dropped"
            )
        return staging.merged()

    def failed(self, model_id: str, version: int, reason: str) -> None:
        """Record that a complete version could not be swapped in (its swap raised)."""
        with self._lock:
            self._remember(model_id, version, f"failed: {reason}")
        log_event(
            "weights.parts.dropped",
            logging.WARNING,
            model_id=model_id,
            version=version,
            reason="failed",
            detail=reason,
        )

    # ------------------------------------------------------------------- drops

    def settle(self, model_id: str, version: int) -> None:
        """A whole push of ``version`` was applied: drop a staging version not newer."""
        with self._lock:
            staging = self._staging.get(model_id)
            if staging is not None and staging.version <= version:
                why = f"was superseded by a whole push of version {version}"
                self._drop_locked(model_id, why, "superseded")

    def expire(self) -> None:
        """Drop every staging version whose deadline passed (the event loop calls it)."""
        with self._lock:
            self._expire_locked()

    def _expire_locked(self) -> None:
        now = self._clock()
        for model_id, staging in list(self._staging.items()):
            if now - staging.started >= self.deadline:
                why = (
                    f"expired: not all of its {staging.count} parts came within {self.deadline:g} s"
                )
                self._drop_locked(model_id, why, "expired")

    def _drop_locked(self, model_id: str, why: str, reason: str) -> None:
        staging = self._staging.pop(model_id)
        self._floor[model_id] = max(self._floor.get(model_id, 0), staging.version)
        self._remember(model_id, staging.version, why)
        self._log_drop(model_id, staging, reason, why)
        self._release(model_id, list(staging.parts.values()), False)

    def _remember(self, model_id: str, version: int, why: str) -> None:
        dropped = self._dropped.setdefault(model_id, collections.OrderedDict())
        dropped[version] = why
        while len(dropped) > _REMEMBERED:
            dropped.popitem(last=False)

    def _log_drop(self, model_id: str, staging: _Staging, reason: str, detail: str) -> None:
        log_event(
            "weights.parts.dropped",
            logging.WARNING,
            model_id=model_id,
            version=staging.version,
            reason=reason,
            parts=sorted(staging.parts),
            count=staging.count,
            waited_seconds=round(self._clock() - staging.started, 3),
            detail=detail,
        )

    # ---------------------------------------------------------------- reading

    def staging(self) -> dict[str, tuple[int, list[int], int]]:
        """``{model_id: (version, part indices staged, count)}`` of the versions staging now."""
        with self._lock:
            self._expire_locked()
            return {m: (s.version, sorted(s.parts), s.count) for m, s in self._staging.items()}


class PartBuffers:
    """Reusable receive buffers for parts, per model: a pool within a byte budget.

    A part's tensors view its receive buffer until its version is swapped in or
    dropped; then the buffer comes back here, so the next version's parts write into
    memory already mapped (a fresh 200 MB buffer costs ~50,000 page faults). A buffer
    is lent to one part at a time; buffers of an applied version are kept, those of a
    dropped one only if they were lent (a peer cannot make the actor keep memory for
    parts that never applied). The pool of a model never holds more than ``budget``
    bytes: the smallest buffers are let go first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: dict[str, list[torch.Tensor]] = {}

    def take(self, model_id: str, nbytes: int) -> torch.Tensor | None:
        """The smallest spare buffer of ``model_id`` holding ``nbytes`` (no longer spare)."""
        with self._lock:
            fitting = [b for b in self._spare.get(model_id, []) if b.numel() >= nbytes]
            if not fitting:
                return None
            chosen = min(fitting, key=lambda b: b.numel())
            self._spare[model_id] = [b for b in self._spare[model_id] if b is not chosen]
            return chosen

    def give_back(self, model_id: str, buffers: list[torch.Tensor], budget: int) -> None:
        """Keep ``buffers`` for ``model_id``'s next parts, the pool within ``budget`` bytes."""
        with self._lock:
            pool = list(self._spare.get(model_id, []))
            pool += [b for b in buffers if not any(b is held for held in pool)]
            held, total = [], 0
            for buffer in sorted(pool, key=lambda b: -b.numel()):
                if total + buffer.numel() <= budget:
                    held.append(buffer)
                    total += buffer.numel()
            self._spare[model_id] = held
