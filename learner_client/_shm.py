"""Which actors share the learner's host: pushes to them, and their batches, through shared memory.

At Describe the learner writes a probe segment (``common.shm``) and names it in the
request; an actor that takes shared-memory pushes reads it back and answers with its host
identity. Only an actor whose identity equals the learner's and that read the probe is
*local*. A push to local actors copies its blob once into one segment and sends each of
them only the control (name, size, CRC-32C) in the push's header; every other actor gets
the bytes. The CRC-32C is the learner's, computed over its private blob: whatever the
segment holds when read is checked against it. An actor that cannot or will not read the
segment answers ``shm_refused``, applies nothing, and is sent the bytes at once; a segment
that cannot be made (``/dev/shm`` full) sends them the bytes too. Local actors are also asked
for their batches through segments they write, until one of their batches fails to read.

Segments are kept for reuse (``common.shm.SharedBuffer``: pages allocated once). While
some actor is local, a push is encoded straight into a segment (a *blob segment*, made by
:meth:`ShmRoute.make` for ``learner_client._slabs.BlobBuffers``, which reuses it as it
reuses any blob buffer: once nothing views the blob any more): such a blob is named to the
actors as it lies, with no copy. Any other blob is copied into a segment that, once every
reply of its push is in, waits, at most :data:`IDLE_SEGMENTS` of them, for the next push
of the same size. A segment an actor refused, or one found removed or replaced, is never
named again (a blob segment goes on as the blob's private memory). Those of a learner
killed mid-push are swept when the next one starts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Collection, Hashable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from common.checksum import crc32c
from common.errors import fd_limit_hint
from common.shm import (
    PROBE_BYTES,
    Segment,
    SharedBuffer,
    host_identity,
    new_buffer,
    remove_segment,
    sweep_segments,
    write_segment,
)

__all__ = ["IDLE_SEGMENTS", "ShmRefusedError", "ShmRoute"]

log = logging.getLogger(__name__)

#: Segments kept between pushes (one per model pushed in turn, and its parts).
IDLE_SEGMENTS = 4

K = TypeVar("K", bound=Hashable)


class ShmRefusedError(Exception):
    """An actor did not read a push's segment and applied nothing; the bytes follow."""


@dataclasses.dataclass(eq=False)
class ShmRoute:
    """Which actors take pushes (and send batches) through shared memory; a push's segments.

    Batches are read by each actor's ``CollectStream`` (``learner_client._collect_stream``);
    this route only says which actors are asked for them, and counts them.

    Attributes:
        enabled: Push through shared memory (``WeightPushSettings.shared_memory``).
        identity: This host's identity (``common.shm.host_identity``).
        batches: Ask local actors for batches through shared memory
            (``GrpcCollector(shared_memory_batches=...)``).
    """

    enabled: bool = True
    identity: str = dataclasses.field(default_factory=host_identity)
    batches: bool = False
    _local: set[int] = dataclasses.field(default_factory=set, init=False)
    _bytes_only: set[int] = dataclasses.field(default_factory=set, init=False)
    _idle: list[SharedBuffer] = dataclasses.field(default_factory=list, init=False)
    _busy: dict[str, SharedBuffer] = dataclasses.field(default_factory=dict, init=False)
    # Blob segments by the address of their mapping (the blob encoded into one starts there).
    _blobs: dict[int, SharedBuffer] = dataclasses.field(default_factory=dict, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(
            ("shm_pushes", "shm_fallbacks", "shm_batches", "shm_batch_fallbacks"), 0
        ),
        init=False,
    )

    def __post_init__(self) -> None:
        if self._probing:
            sweep_segments()  # leftovers of learners and actors that died mid-push
        # A learner that exits (or drops its collector) without shutdown() leaves none behind;
        # a forked child exiting leaves the parent's in place.
        weakref.finalize(self, _close_all, os.getpid(), self._idle, self._busy, self._blobs)

    @property
    def _probing(self) -> bool:
        """Whether actors are probed at all (some use of shared memory is on, on a known host)."""
        return (self.enabled or self.batches) and bool(self.identity)

    def probe(self) -> Segment | None:
        """A fresh probe segment for a Describe; None when shared memory is off or unusable.

        A probe that cannot be written (``/dev/shm`` full or absent) proves no actor local:
        those described with none get every push and batch as bytes.
        """
        if not self._probing:
            return None
        try:
            return write_segment(secrets.token_bytes(PROBE_BYTES))
        except OSError as exc:
            log.warning(
                "no shared-memory probe can be written (%s%s): the actors described now "
                "get every push and batch as bytes",
                exc,
                fd_limit_hint(str(exc)),
            )
            return None

    @staticmethod
    def remove_probe(probe: Segment) -> None:
        """Remove a probe segment once its Describes are answered."""
        remove_segment(probe.name)

    def admit(self, worker_id: int, identity: str, probe_ok: bool) -> None:
        """Mark an actor local (same host identity, probe read back) or not."""
        local = self._probing and identity == self.identity and probe_ok
        with self._lock:
            if local:
                self._local.add(worker_id)
            else:
                self._local.discard(worker_id)

    def is_local(self, worker_id: int) -> bool:
        """Whether pushes to this actor go through shared memory."""
        with self._lock:
            return self.enabled and worker_id in self._local

    def batches_from(self, worker_id: int) -> bool:
        """Whether this actor's next session is asked for batches through shared memory."""
        with self._lock:
            return self.batches and worker_id in self._local and worker_id not in self._bytes_only

    def batch_read(self) -> None:
        """Count a batch read from a segment."""
        with self._lock:
            self._counts["shm_batches"] += 1

    def batch_failed(self, worker_id: int) -> None:
        """A batch of this actor could not be read from its segment: it sends bytes from now."""
        with self._lock:
            self._bytes_only.add(worker_id)
            self._counts["shm_batch_fallbacks"] += 1

    def wanted(self) -> bool:
        """Whether pushes now reach local actors (their blobs belong in blob segments)."""
        with self._lock:
            return self.enabled and bool(self._local)

    def make(self, nbytes: int) -> SharedBuffer | None:
        """A new blob segment of ``nbytes``; None when none can be made (plain memory then)."""
        buffer = new_buffer(nbytes, "a push goes to the actors on this host as bytes")
        if buffer is None:
            return None
        buffer.lock_for_writing()  # until write() names it
        with self._lock:
            self._blobs[_address(buffer.view())] = buffer
        return buffer

    def forget(self, buffer: SharedBuffer) -> None:
        """A blob segment no longer kept: its name is removed (its mapping goes with its views)."""
        with self._lock:
            for at in [at for at, kept in self._blobs.items() if kept is buffer]:
                del self._blobs[at]  # in place: the finalizer holds this dict
        buffer.remove()

    def write(self, blobs: Mapping[K, tuple[bytes | memoryview, int | None]]) -> dict[K, Segment]:
        """The segment of each ``(blob, its CRC-32C or None)``, by key: its controls.

        A blob encoded into a blob segment is named as it lies; any other is copied into a
        segment. A blob whose segment cannot be made (``/dev/shm`` full or absent) has none:
        its actors get the bytes. Give every control back to :meth:`release`.
        """
        segments: dict[K, Segment] = {}
        for key, (blob, crc) in blobs.items():
            view = memoryview(blob).cast("B")
            crc = crc32c(view) if crc is None else crc
            lying = self._blob_segment(view)
            if lying is not None:
                lying.unlock()
                segments[key] = lying.control(crc)
            elif (buffer := self._take(view.nbytes)) is not None:
                segments[key] = buffer.fill(view, crc)
                buffer.unlock()
        return segments

    def _blob_segment(self, view: memoryview) -> SharedBuffer | None:
        """The blob segment ``view`` fills exactly, if it is one still intact."""
        with self._lock:
            buffer = self._blobs.get(_address(view)) if self._blobs else None
        if buffer is None or buffer.size != view.nbytes:
            return None
        if not buffer.intact():  # removed, replaced or opened up by another process
            self.forget(buffer)
            return None
        return buffer

    def _take(self, size: int) -> SharedBuffer | None:
        """An idle segment of exactly ``size`` bytes, else a new one (None if none can be made).

        Either is write-locked; an idle one that an actor still reads (past its push's
        deadline) is removed instead.
        """
        with self._lock:
            buffer = next((b for b in self._idle if b.size == size), None)
            if buffer is not None:
                self._idle.remove(buffer)
        if buffer is not None and not buffer.lock_for_writing():
            buffer.close()
            buffer = None
        if buffer is None:
            buffer = new_buffer(size, "a push goes to the actors on this host as bytes")
            if buffer is None:
                return None
            buffer.lock_for_writing()
        with self._lock:
            self._busy[buffer.name] = buffer
        return buffer

    def release(self, segments: Iterable[Segment], spoiled: Collection[str] = ()) -> None:
        """Every reply of a push is in: its segments wait for the next push (or go).

        Args:
            segments: The push's controls, from :meth:`write`.
            spoiled: Names of segments an actor refused: removed, never filled again.
        """
        gone: list[SharedBuffer] = []
        with self._lock:
            for segment in segments:
                buffer = self._busy.pop(segment.name, None)
                if buffer is not None and buffer.name in spoiled:
                    gone.append(buffer)
                elif buffer is not None:
                    self._idle.insert(0, buffer)
            gone += self._idle[IDLE_SEGMENTS:]
            del self._idle[IDLE_SEGMENTS:]
            spoiled_blobs = [b for b in self._blobs.values() if b.name in spoiled]
        for buffer in gone:
            buffer.close()
        for buffer in spoiled_blobs:
            self.forget(buffer)

    def close(self) -> None:
        """Remove every segment (the collector is shutting down)."""
        with self._lock:
            _close_all(os.getpid(), self._idle, self._busy, self._blobs)

    def count(self, pushes: int, fallbacks: int) -> None:
        """Count actor pushes that travelled through shared memory, and the refused ones."""
        with self._lock:
            self._counts["shm_pushes"] += pushes
            self._counts["shm_fallbacks"] += fallbacks

    def stats(self) -> dict[str, int]:
        """``shm_pushes``, ``shm_fallbacks``, ``shm_batches``, ``shm_batch_fallbacks``."""
        with self._lock:
            return dict(self._counts)


def _close_all(
    pid: int,
    idle: list[SharedBuffer],
    busy: dict[str, SharedBuffer],
    blobs: dict[int, SharedBuffer],
) -> None:
    """Remove the segments of ``idle``, ``busy`` and ``blobs`` and forget them (in place).

    Blob segments lose their names only: a blob the caller still holds stays readable.
    Nothing is removed in a process other than ``pid`` (a child forked since: the segments
    are its parent's).
    """
    if os.getpid() != pid:
        return
    for buffer in [*idle, *busy.values()]:
        buffer.close()
    for buffer in blobs.values():
        buffer.remove()
    idle.clear()
    busy.clear()
    blobs.clear()


def _address(view: memoryview) -> int:
    """Where ``view``'s first byte lies in this process's memory."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
