"""Weight pushes through shared memory to the actors proven to share the learner's host.

At Describe the learner writes a probe segment (``common.shm``) and names it in the
request; an actor that takes shared-memory pushes reads it back and answers with its host
identity. Only an actor whose identity equals the learner's and that read the probe is
*local*. A push to local actors writes its blob once into one segment and sends each of
them only the control (name, size, CRC-32C) in the push's header; every other actor gets
the bytes. An actor that cannot or will not read the segment answers ``shm_refused``,
applies nothing, and is sent the bytes at once. Segments are removed once every reply is
in; those of a learner killed mid-push are swept when the next one starts.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

from common.shm import Segment, host_identity, remove_segment, sweep_segments, write_segment

__all__ = ["ShmRefusedError", "ShmRoute"]

K = TypeVar("K", bound=Hashable)


class ShmRefusedError(Exception):
    """An actor did not read a push's segment and applied nothing; the bytes follow."""


@dataclasses.dataclass(eq=False)
class ShmRoute:
    """Which actors take pushes through shared memory, and the segments of a push.

    Attributes:
        enabled: Use shared memory at all (``WeightPushSettings.shared_memory``).
        identity: This host's identity (``common.shm.host_identity``).
    """

    enabled: bool = True
    identity: str = dataclasses.field(default_factory=host_identity)
    _local: set[int] = dataclasses.field(default_factory=set, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"shm_pushes": 0, "shm_fallbacks": 0}, init=False
    )

    def __post_init__(self) -> None:
        if self.enabled and self.identity:
            sweep_segments()  # leftovers of learners that died mid-push

    def probe(self) -> Segment | None:
        """A fresh probe segment for a Describe, or None when shared memory is off."""
        if not (self.enabled and self.identity):
            return None
        return write_segment(secrets.token_bytes(32))

    def admit(self, worker_id: int, identity: str, probe_ok: bool) -> None:
        """Mark an actor local (same host identity, probe read back) or not."""
        local = self.enabled and bool(self.identity) and identity == self.identity and probe_ok
        with self._lock:
            if local:
                self._local.add(worker_id)
            else:
                self._local.discard(worker_id)

    def is_local(self, worker_id: int) -> bool:
        """Whether pushes to this actor go through shared memory."""
        with self._lock:
            return worker_id in self._local

    def write(self, blobs: Mapping[K, tuple[bytes | memoryview, int | None]]) -> dict[K, Segment]:
        """One segment per ``(blob, its CRC-32C or None)``, each written once.

        On a failure none is left behind.
        """
        segments: dict[K, Segment] = {}
        try:
            for key, (blob, crc) in blobs.items():
                segments[key] = write_segment(blob, crc=crc)
        except BaseException:
            self.release(segments.values())
            raise
        return segments

    @staticmethod
    def release(segments: Iterable[Segment]) -> None:
        """Remove the segments of a push once every reply is in."""
        for segment in segments:
            remove_segment(segment.name)

    def count(self, pushes: int, fallbacks: int) -> None:
        """Count actor pushes that travelled through shared memory, and the refused ones."""
        with self._lock:
            self._counts["shm_pushes"] += pushes
            self._counts["shm_fallbacks"] += fallbacks

    def stats(self) -> dict[str, int]:
        """``shm_pushes`` and ``shm_fallbacks`` (see ``GrpcCollector.stats()``)."""
        with self._lock:
            return dict(self._counts)
