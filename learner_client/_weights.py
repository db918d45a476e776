"""What a push sends: the encoded weights, how they are encoded, and the book.

:class:`PushOptions` (a wire dtype, ``only_trainable``) shape every encode.
:class:`WeightBook` holds what the learner knows about weights: the version counter per
model_id (never behind any actor's), the last source given per model_id (re-read at every
automatic push, so in-place training is seen), the encoded push each worker should hold (so a
restarted actor gets exactly those bytes back) and the batches each worker delivered since its
last update. :class:`EncodedWeights` is one push, encoded once for all its targets. What a push
is asked for (``update_policy_weights_``'s arguments) is :mod:`learner_client._update_args`'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeAlias, TypeVar

import torch
from tensordict import TensorDictBase
from torch import nn

from common.config import MAX_POLICY_VERSION
from common.errors import SessionStateError
from common.weights import Part, PushForm, adapter_metadata, checksums, encode_weights
from learner_client._slabs import BlobBuffers, BlobSegments

__all__ = ["EncodedWeights", "PushOptions", "WeightBook", "WeightSource"]

WeightSource: TypeAlias = "nn.Module | TensorDictBase | Mapping[str, Any]"
Blob: TypeAlias = "bytes | memoryview"
Allocate: TypeAlias = "Callable[[int], torch.Tensor] | None"


@dataclasses.dataclass(frozen=True)
class PushOptions:
    """How a push is encoded (``update_policy_weights_``'s ``dtype`` and ``only_trainable``).

    Attributes:
        dtype: The wire dtype floating tensors are cast to once, on the learner
            (``common.weights.WIRE_DTYPES``); None sends them as they are.
        only_trainable: Send only the module's parameters with ``requires_grad``.
    """

    dtype: torch.dtype | None = None
    only_trainable: bool = False

    @classmethod
    def given(cls, dtype: object = None, only_trainable: object = False) -> PushOptions | None:
        """Check the public arguments; None when neither was given.

        Raises:
            TypeError: ``dtype`` is not a ``torch.dtype``, ``only_trainable`` not a bool.
            ValueError: A dtype weights cannot travel in (e.g. an integer dtype).
        """
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r:.80}")
        if not isinstance(only_trainable, bool):
            raise TypeError(f"only_trainable must be a bool, got {only_trainable!r:.80}")
        PushForm(wire_dtype=dtype)  # raises ValueError for a dtype that cannot travel
        return None if dtype is None and not only_trainable else cls(dtype, only_trainable)

    def encode(self, source: WeightSource, model_id: str, allocate: Allocate = None) -> Blob:
        """Encode ``source`` for ``model_id``: a module whole, a mapping as a subset.

        A peft LoRA module declares its adapter (``common.weights.adapter_metadata``).

        ``allocate`` gives the host buffer a source on an accelerator is written into.

        Raises:
            TypeError: ``only_trainable`` with a source that is not a module.
        """
        return encode_weights(
            source,
            metadata={"model_id": model_id, **adapter_metadata(source)},
            dtype=self.dtype,
            only_trainable=self.only_trainable,
            subset=not isinstance(source, nn.Module),
            allocate=allocate,
        )


def _next_version(model_id: str, current: int, version: int | None) -> int:
    """``version``, or the one after ``current``; ValueError once the int64 range is spent."""
    if version is not None:
        return version
    if current >= MAX_POLICY_VERSION:
        raise ValueError(
            f"{model_id!r} is at version {current}, the last an actor accepts (int64): "
            "no later version exists, nothing was sent (actors started afresh count from 0)"
        )
    return current + 1


@dataclasses.dataclass(frozen=True)
class EncodedWeights:
    """One push, encoded once and sent to every target.

    Attributes:
        model_id: The model it updates.
        version: The policy version it installs.
        blob: The safetensors bytes.
        sha256: Hex digest of ``blob``, or "" when ``crc32c`` stands for it.
        crc32c: CRC-32C of ``blob``, or None when only ``sha256`` is sent.
        base_version: Set on a sparse delta: the version it applies on top of.
        full: A delta's full equivalent (re-sent to a worker that comes back), built on demand.
        part: The part of a multi-part push this is; None: a whole push.
    """

    model_id: str
    version: int
    blob: Blob
    sha256: str
    crc32c: int | None = None
    base_version: int | None = None
    full: Callable[[], EncodedWeights] | None = dataclasses.field(default=None, compare=False)
    part: Part | None = None


#: ``{model_id: (last weights, per-worker weights, form)}`` (:meth:`WeightBook.given`).
GivenWeights = dict[
    str, tuple["WeightSource | None", dict[int, "WeightSource"], "PushOptions | None"]
]


_T = TypeVar("_T")


def _same_bytes(one: Blob, other: Blob) -> bool:
    """Whether two blobs hold the same bytes (memcmp speed, no copy)."""
    first, second = memoryview(one).cast("B"), memoryview(other).cast("B")
    return first.nbytes == second.nbytes and first == second


def _put(table: dict[str, _T], key: str, value: _T | None) -> None:
    """``table[key] = value``, or no entry for None."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


class WeightBook:
    """What the learner knows about weights, shared by the user thread and the transport.

    Version counters start at the highest version any actor reports (see
    :meth:`observe`), so a restarted learner never pushes a stale version.

    Args:
        checksum: ``"crc32c"`` or ``"sha256"`` (``WeightPushSettings.checksum``).
        segments: Shared memory for the blobs of pushes to actors on this host.
    """

    def __init__(self, checksum: str = "crc32c", segments: BlobSegments | None = None) -> None:
        self.checksum = checksum
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._sources: dict[str, WeightSource] = {}
        self._options: dict[str, PushOptions] = {}  # how each model was last encoded
        # Weights given to one worker alone ({worker_id: weights}), by model_id.
        self._worker_sources: dict[str, dict[int, WeightSource]] = {}
        self._desired: dict[int, dict[str, EncodedWeights]] = {}
        self._applied: dict[int, dict[str, int]] = {}
        self._epochs: dict[int, int] = {}  # the process each worker's versions were observed of
        self._since_update: dict[int, int | None] = {}
        self._blob_buffers = BlobBuffers(segments)  # every push's blob is written into one of them
        # The versions claimed by this thread's encoding (:meth:`taken_back_on_error`).
        self._claims = threading.local()

    def close(self) -> None:
        """Drop every weight and blob held (the collector is shut down: nothing is pushed)."""
        with self._lock:
            self._sources.clear()
            self._worker_sources.clear()
            self._desired.clear()
        self._blob_buffers.clear()

    # ----------------------------------------------------------------- reading

    def versions(self) -> dict[str, int]:
        """The learner's current version per model_id."""
        with self._lock:
            return dict(self._versions)

    def applied(self, worker_id: int) -> dict[str, int]:
        """The version per model_id a worker last reported or acknowledged."""
        with self._lock:
            return dict(self._applied.get(worker_id, {}))

    def should_hold(self, worker_id: int, model_id: str) -> int:
        """The version a worker holds, or should once caught up (a push it missed), of a model.

        An on-demand sync round counts a worker's share only if acted with it.
        """
        with self._lock:
            held = self._applied.get(worker_id, {}).get(model_id, 0)
            desired = self._desired.get(worker_id, {}).get(model_id)
            return held if desired is None else max(held, desired.version)

    def source(self, model_id: str) -> WeightSource:
        """The last weights given for ``model_id``.

        Raises:
            SessionStateError: None were given yet.
        """
        with self._lock:
            if model_id not in self._sources:
                raise SessionStateError(
                    f"no weights were given for model_id {model_id!r} yet; pass a policy or "
                    f"weights to update_policy_weights_ first"
                )
            return self._sources[model_id]

    def has_worker_sources(self, model_id: str) -> bool:
        """Whether some workers were given weights of their own for ``model_id``."""
        with self._lock:
            return bool(self._worker_sources.get(model_id))

    def models_with_sources(self) -> list[str]:
        """Model ids for which weights were given (to all workers or to some)."""
        with self._lock:
            return sorted(set(self._sources) | {m for m, w in self._worker_sources.items() if w})

    def source_for(self, model_id: str, worker_id: int) -> WeightSource:
        """The last weights given to ``worker_id`` for ``model_id`` (its own, else the shared).

        Raises:
            SessionStateError: None were given yet.
        """
        with self._lock:
            own = self._worker_sources.get(model_id, {}).get(worker_id)
        return own if own is not None else self.source(model_id)

    def addressed_to(self, worker_id: int, model_id: str) -> EncodedWeights | None:
        """The push of ``model_id`` a worker should hold (re-sent if it comes back without)."""
        with self._lock:
            return self._desired.get(worker_id, {}).get(model_id)

    def pending(self, worker_id: int, reported: Mapping[str, int]) -> list[EncodedWeights]:
        """The pushes a worker lacks, judged by the versions it reports now.

        A worker that restarted (or missed a push) reports an older version than
        the one last addressed to it; those pushes are returned for a re-send.
        """
        with self._lock:
            desired = self._desired.get(worker_id, {})
            lacking = [
                enc for mid, enc in sorted(desired.items()) if reported.get(mid, 0) < enc.version
            ]
        return [enc.full() if enc.full is not None else enc for enc in lacking]

    def due(self, worker_id: int, interval: int | None) -> bool:
        """Whether an automatic push is due: more than ``interval`` batches since the last one."""
        if interval is None:
            return False
        with self._lock:
            since = self._since_update.get(worker_id)
            return since is None or since > interval

    # ----------------------------------------------------------------- writing

    def given(self, model_ids: Iterable[str]) -> GivenWeights:
        """What :meth:`restore` puts back: the models' last weights and forms."""
        with self._lock:
            return {
                mid: (
                    self._sources.get(mid),
                    dict(self._worker_sources.get(mid, {})),
                    self._options.get(mid),
                )
                for mid in model_ids
            }

    def restore(self, model_id: str, given: GivenWeights) -> None:
        """Undo a push no actor took: ``model_id``'s last weights and form as before.

        Weights every target refused (not finite, another shape...) are not the last weights
        given: a later argument-less push would send them again. The version the push took
        stays spent: parts of it may be staged on actors (a striped push), which refuse the
        same version with other bytes.
        """
        source, own, options = given[model_id]
        with self._lock:
            _put(self._sources, model_id, source)
            _put(self._options, model_id, options)
            self._worker_sources[model_id] = own

    @contextlib.contextmanager
    def taken_back_on_error(self, model_ids: Iterable[str]) -> Iterator[GivenWeights]:
        """Encode a call inside: if it raises, the call took nothing.

        Yields the models' weights as :meth:`given` read them on entry, for a later
        :meth:`restore`.

        Nothing was sent yet, so the versions it claimed go back and the models' last
        weights and forms are as before (a model another push claimed a version of meanwhile
        keeps that push's): a call that raised neither spends a version nor leaves its weights.
        """
        given = self.given(model_ids)
        claims: list[tuple[str, int | None, int]] = []
        self._claims.made = claims
        try:
            yield given
        except BaseException:
            claimed_since = set()  # by another push: its weights stay the last given
            with self._lock:
                for model_id, previous, claimed in reversed(claims):
                    if self._versions.get(model_id) == claimed:
                        _put(self._versions, model_id, previous)
                    else:
                        claimed_since.add(model_id)
            for model_id in given.keys() - claimed_since:
                self.restore(model_id, given)
            raise
        finally:
            self._claims.made = None

    def _claim(self, model_id: str, version: int | None) -> int:
        """Claim the next (or given) version of ``model_id`` (under the lock), for a take-back."""
        current = self._versions.get(model_id)
        version = _next_version(model_id, current or 0, version)
        self._versions[model_id] = max(current or 0, version)
        claims = getattr(self._claims, "made", None)
        if claims is not None:
            claims.append((model_id, current, self._versions[model_id]))
        return version

    def restored(
        self,
        worker_id: int,
        reported: Mapping[str, int],
        weights: Mapping[str, tuple[int, WeightSource]],
        epoch: int = 0,
    ) -> None:
        """An actor (process ``epoch``) loaded a state: it holds, and should hold, what it reports.

        Nothing addressed to it before is re-sent (a checkpoint may take it back); what it
        should hold is the state's ``weights`` (``{model_id: (version, weights)}``), given
        again, whole, if it restarts with its initial weights.
        """
        held = {}
        for model_id, (version, source) in weights.items():
            blob = PushOptions().encode(source, model_id, self._blob_buffers.for_model(model_id))
            digest, crc = checksums(blob, self.checksum)
            encoded = EncodedWeights(model_id, version, blob, digest, crc)
            held[model_id] = self._held_already(encoded)
        with self._lock:
            self._desired[worker_id] = held
        self.observe(worker_id, reported, epoch)

    def _held_already(self, encoded: EncodedWeights) -> EncodedWeights:
        """The same weights another actor should hold already, else ``encoded`` itself.

        A checkpoint restored on N actors usually gives each the same weights: they are
        kept once (an N-fold copy of a large model otherwise), the bytes compared, not
        only the checksum.
        """
        with self._lock:
            candidates = [
                held[encoded.model_id]
                for held in self._desired.values()
                if encoded.model_id in held
            ]
        for other in candidates:
            same = (other.version, other.sha256, other.crc32c, other.part) == (
                encoded.version,
                encoded.sha256,
                encoded.crc32c,
                encoded.part,
            )
            if same and other.base_version is None and _same_bytes(other.blob, encoded.blob):
                return other
        return encoded

    def observe(self, worker_id: int, reported: Mapping[str, int], epoch: int = 0) -> None:
        """Record the versions an actor process (``epoch``) reports; counters keep up with them.

        Replies to pushes are taken from that process only (:meth:`acknowledged`).
        """
        with self._lock:
            if epoch:
                self._epochs[worker_id] = epoch
            self._applied[worker_id] = dict(reported)
            for mid, version in reported.items():
                self._versions[mid] = max(self._versions.get(mid, 0), version)
            self._since_update.setdefault(worker_id, None)

    def options(self, model_id: str, options: PushOptions | None = None) -> PushOptions:
        """``options``, or else those ``model_id`` was last encoded with."""
        if options is not None:
            return options
        with self._lock:
            return self._options.get(model_id, PushOptions())

    def encode(
        self,
        model_id: str,
        source: WeightSource | None,
        options: PushOptions | None = None,
        *,
        version: int | None = None,
        part: Part | None = None,
    ) -> EncodedWeights:
        """Encode one push under the next (or the given) version of ``model_id``.

        A whole push's source becomes the model's last weights (re-read by automatic
        pushes); a part's never does: it is one rank's share of the model.

        Args:
            model_id: The model to update.
            source: The weights; None re-reads the last ones given.
            options: How to encode; None: as ``model_id`` was last encoded.
            version: The version to install; None: the model's next one.
            part: This rank's part of a multi-part push of ``version``.

        Returns:
            The encoded push (the version counter moves only if encoding succeeded).
        """
        given = source is not None and part is None
        if source is None:
            source = self.source(model_id)
        opts = self.options(model_id, options)
        blob = opts.encode(source, model_id, self._blob_buffers.for_model(model_id))
        digest, crc = checksums(blob, self.checksum)
        if part is None:
            self.use_options(model_id, opts)
        version = self.claim_version(model_id, source if given else None, version)
        return EncodedWeights(model_id, version, blob, digest, crc, part=part)

    def use_options(self, model_id: str, options: PushOptions) -> None:
        """Record the form ``model_id`` was encoded in: automatic pushes encode the same way."""
        with self._lock:
            self._options[model_id] = options

    def claim_version(
        self, model_id: str, source: WeightSource | None, version: int | None = None
    ) -> int:
        """The next version of ``model_id``, or ``version`` as given (the counter never falls).

        A given ``source`` becomes the shared last weights.
        """
        with self._lock:
            version = self._claim(model_id, version)
            if source is not None:  # new shared weights replace any given to single workers
                self._sources[model_id] = source
                self._worker_sources.pop(model_id, None)
        return version

    def encode_for(
        self,
        model_id: str,
        sources: Mapping[int, WeightSource | None],
        options: PushOptions | None = None,
        version: int | None = None,
    ) -> dict[int, EncodedWeights]:
        """Encode one push of ``model_id`` in which each worker gets its own weights.

        All workers get the same new version; a source shared by several workers is
        encoded once. The sources are remembered per worker, so a later push of "the
        last weights given" re-sends each worker its own.

        Args:
            model_id: The model to update.
            sources: ``{worker_id: weights}``; None re-reads that worker's last weights.
            options: How to encode; None: as ``model_id`` was last encoded.
            version: The version to install; None: the model's next one.

        Returns:
            ``{worker_id: encoded push}`` (the version is bumped only if every encode succeeded).
        """
        resolved = {
            wid: self.source_for(model_id, wid) if src is None else src
            for wid, src in sources.items()
        }
        opts = self.options(model_id, options)
        blobs: dict[int, tuple[Blob, str, int | None]] = {}
        for src in resolved.values():
            if id(src) not in blobs:
                blob = opts.encode(src, model_id, self._blob_buffers.for_model(model_id))
                blobs[id(src)] = (blob, *checksums(blob, self.checksum))
        with self._lock:
            version = self._claim(model_id, version)
            self._options[model_id] = opts
            own = self._worker_sources.setdefault(model_id, {})
            own.update({wid: src for wid, src in sources.items() if src is not None})
        return {
            wid: EncodedWeights(model_id, version, *blobs[id(src)]) for wid, src in resolved.items()
        }

    def addressed(self, worker_ids: Iterable[int], encoded: EncodedWeights) -> None:
        """Record that ``encoded`` is what these workers should hold from now on.

        Only pushes a worker applied, or could not be reached for, are recorded (re-sending a
        rejected push would keep it out), never over a newer one (another thread's, recorded
        first).
        """
        with self._lock:
            for wid in worker_ids:
                held = self._desired.setdefault(wid, {})
                recorded = held.get(encoded.model_id)
                if recorded is None or recorded.version <= encoded.version:
                    held[encoded.model_id] = encoded

    def forget(self, worker_id: int, model_id: str, version: int) -> None:
        """Stop re-sending ``model_id`` to a worker that rejected ``version`` (not a newer)."""
        with self._lock:
            held = self._desired.get(worker_id, {})
            recorded = held.get(model_id)
            if recorded is not None and recorded.version <= version:
                del held[model_id]

    def acknowledged(self, worker_id: int, model_id: str, version: int, epoch: int = 0) -> bool:
        """Record a push the worker applied; its automatic-update count restarts.

        Never lowers its version: an older push's reply may be recorded after a newer one's.
        Returns False, recording nothing, for a reply from a process (``epoch``) other than
        the one last observed: it died after applying, and its successor holds other weights.
        """
        with self._lock:
            if epoch and self._epochs.get(worker_id, epoch) != epoch:
                return False
            applied = self._applied.setdefault(worker_id, {})
            applied[model_id] = max(applied.get(model_id, 0), version)
            self._versions[model_id] = max(self._versions.get(model_id, 0), version)
            self._since_update[worker_id] = 0
        return True

    def count_batch(self, worker_id: int) -> None:
        """Count one delivered batch of ``worker_id`` towards its next automatic push."""
        with self._lock:
            since = self._since_update.get(worker_id)
            if since is not None:
                self._since_update[worker_id] = since + 1

    def restore_versions(self, versions: Mapping[str, int]) -> None:
        """Raise the counters to at least ``versions`` (checked: ``_restore.check_versions``)."""
        with self._lock:
            for mid, version in versions.items():
                self._versions[mid] = max(self._versions.get(mid, 0), int(version))
