"""The learner's weight bookkeeping: versions, the weights given, what each worker should hold.

:class:`WeightBook` holds what the learner knows about weights: the version
counter per model_id (never behind any actor's), the last source given per
model_id (re-read at every automatic push, so in-place training is seen), the
encoded push each worker should hold (so a restarted actor gets exactly those
bytes back) and the batches each worker delivered since its last update.
:class:`EncodedWeights` is one push, encoded once for all its targets. The
arguments of ``update_policy_weights_`` are normalised in ``learner_client._weight_args``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

from common.errors import SessionStateError
from common.weights import Part, checksums
from learner_client._slabs import BlobBuffers
from learner_client._weight_args import PushOptions, WeightSource

__all__ = ["EncodedWeights", "WeightBook"]

Blob: TypeAlias = "bytes | memoryview"


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


class WeightBook:
    """What the learner knows about weights, shared by the user thread and the transport.

    Version counters start at the highest version any actor reports (see
    :meth:`observe`), so a restarted learner never pushes a stale version.
    """

    def __init__(self, checksum: str = "crc32c") -> None:
        self.checksum = checksum
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._sources: dict[str, WeightSource] = {}
        self._options: dict[str, PushOptions] = {}  # how each model was last encoded
        # Weights given to one worker alone ({worker_id: weights}), by model_id.
        self._worker_sources: dict[str, dict[int, WeightSource]] = {}
        self._desired: dict[int, dict[str, EncodedWeights]] = {}
        self._applied: dict[int, dict[str, int]] = {}
        self._since_update: dict[int, int | None] = {}
        self._blob_buffers = BlobBuffers()  # pushes of CUDA modules are written into them

    # ----------------------------------------------------------------- reading

    def versions(self) -> dict[str, int]:
        """The learner's current version per model_id."""
        with self._lock:
            return dict(self._versions)

    def applied(self, worker_id: int) -> dict[str, int]:
        """The version per model_id a worker last reported or acknowledged."""
        with self._lock:
            return dict(self._applied.get(worker_id, {}))

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

    def observe(self, worker_id: int, reported: Mapping[str, int]) -> None:
        """Record the versions an actor reports (Describe); counters never fall behind them."""
        with self._lock:
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
            if source is not None:  # new shared weights replace any given to single workers
                self._sources[model_id] = source
                self._worker_sources.pop(model_id, None)
            current = self._versions.get(model_id, 0)
            version = current + 1 if version is None else version
            self._versions[model_id] = max(current, version)
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
            self._options[model_id] = opts
            own = self._worker_sources.setdefault(model_id, {})
            own.update({wid: src for wid, src in sources.items() if src is not None})
            current = self._versions.get(model_id, 0)
            version = current + 1 if version is None else version
            self._versions[model_id] = max(current, version)
        return {
            wid: EncodedWeights(model_id, version, *blobs[id(src)]) for wid, src in resolved.items()
        }

    def addressed(self, worker_ids: Iterable[int], encoded: EncodedWeights) -> None:
        """Record that ``encoded`` is what these workers should hold from now on.

        Only pushes a worker applied, or could not be reached for, are recorded:
        re-sending a rejected push on re-admission would keep the worker out.
        """
        with self._lock:
            for wid in worker_ids:
                self._desired.setdefault(wid, {})[encoded.model_id] = encoded

    def forget(self, worker_id: int, model_id: str) -> None:
        """Stop re-sending ``model_id`` to a worker (it rejected the push)."""
        with self._lock:
            self._desired.get(worker_id, {}).pop(model_id, None)

    def acknowledged(self, worker_id: int, model_id: str, version: int) -> None:
        """Record a push the worker applied; its automatic-update count restarts."""
        with self._lock:
            self._applied.setdefault(worker_id, {})[model_id] = version
            self._versions[model_id] = max(self._versions.get(model_id, 0), version)
            self._since_update[worker_id] = 0

    def count_batch(self, worker_id: int) -> None:
        """Count one delivered batch of ``worker_id`` towards its next automatic push."""
        with self._lock:
            since = self._since_update.get(worker_id)
            if since is not None:
                self._since_update[worker_id] = since + 1

    def restore_versions(self, versions: Mapping[str, int]) -> None:
        """Raise the counters to at least ``versions`` (from a learner state_dict)."""
        with self._lock:
            for mid, version in versions.items():
                self._versions[mid] = max(self._versions.get(mid, 0), int(version))
