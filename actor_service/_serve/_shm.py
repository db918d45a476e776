"""The actor's side of shared memory (``common.shm``): pushes it reads, batches it writes.

A learner on this host proves it at Describe: it names a probe segment, which the actor
reads back (:func:`probe_ok`), and the actor reports its host identity. A push whose
header names a segment (``WeightsHeader.shm``) has its control checked (name pattern,
owner, mode, size, CRC-32C) before a byte is trusted, and any doubt raises
:class:`~common.shm.ShmError`, which the push answers with ``shm_refused`` and no apply. A
whole push is applied where it lies (:func:`mapped_push`: the segment mapped and held
against the learner's write lock while its digests are checked over it and it is copied
into the model); a part or a delta, which waits for more, is read into a receive buffer of
the actor's own (:func:`read_push_segment`). Either then goes through the same checks and
swap as a chunked push's bytes.

A session opened with ``shm_batches`` (the learner proved it shares this host) gets its
batches written into segments of :class:`BatchSegments`: one per batch, kept unchanged until
the learner acks it (the learner copies a batch out before it acks it), then filled again by
a later batch of the same size (only the acks of the learner a batch was sent to free its
segment: a learner that took the session over frees none of the one it ended, which may not
have read them yet). Segments of batches the learner has not acked stay, at most
``max_credits + 2`` of them (the oldest beyond go: a learner that still wanted one reads
nothing and takes that batch as bytes); a full ``/dev/shm`` sends the batch as bytes.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import (
    PROBE_BYTES,
    Segment,
    SegmentMaps,
    SharedBuffer,
    ShmError,
    host_identity,
    new_buffer,
    opened_segment,
    read_segment,
    sweep_segments,
)
from common.weights import BlobAssembler

__all__ = ["BatchSegments", "identity", "mapped_push", "probe_ok", "read_push_segment"]

#: Acked segments kept for the next batches (a session's batches share one size, mostly).
IDLE_BATCH_SEGMENTS = 4


@functools.cache
def identity() -> str:
    """This host's identity, as Describe reports it (read once per process)."""
    return host_identity()


def probe_ok(request: pb.DescribeRequest, enabled: bool) -> bool:
    """Whether the Describe's probe segment was read back and matched its control."""
    if not enabled or not request.HasField("shm_probe"):
        return False
    if request.shm_probe.size != PROBE_BYTES:  # read on the event loop: a few bytes only
        return False
    try:
        read_segment(_control(request.shm_probe))
    except ShmError:
        return False
    return True


def read_push_segment(header: pb.WeightsHeader, enabled: bool, assembler: BlobAssembler) -> None:
    """Read a push's segment straight into its assembler, checked against the header's control.

    The assembler digests the private copy; :meth:`BlobAssembler.finish` checks it.

    Raises:
        ShmError: Shared memory is off here, or the segment cannot be trusted or read.
    """
    with opened_segment(_push_control(header, enabled)) as read_at:
        assembler.add_rest(read_at)


def mapped_push(
    header: pb.WeightsHeader, enabled: bool, maps: SegmentMaps
) -> AbstractContextManager[memoryview]:
    """A whole push's segment where it lies, held against the learner while it is used.

    The caller checks the digests over the view before it applies anything (the learner
    fills a segment only under its write lock, which the hold keeps off).

    Raises:
        ShmError: Shared memory is off here, or the segment cannot be trusted or held.
    """
    return maps.locked(_push_control(header, enabled))


def _push_control(header: pb.WeightsHeader, enabled: bool) -> Segment:
    """The control of a push's segment, checked against the push's header."""
    if not enabled:
        raise ShmError("this actor takes no pushes through shared memory (--shared-memory false)")
    control = _control(header.shm)
    if control.size != int(header.total_bytes):
        raise ShmError(
            f"segment size {control.size} differs from the push's total_bytes {header.total_bytes}"
        )
    if header.HasField("crc32c") and control.crc32c != header.crc32c:
        raise ShmError("segment crc32c differs from the push's crc32c")
    return control


def _control(message: pb.ShmSegment) -> Segment:
    return Segment(name=message.name, size=int(message.size), crc32c=int(message.crc32c))


class BatchSegments:
    """The segments an actor writes its batches into, reused once the learner acks them.

    Used from the collection thread (:meth:`write`) and the event loop (:meth:`acked`).

    Args:
        held: Most segments of unacked batches kept (the oldest beyond are removed).
    """

    def __init__(self, held: int) -> None:
        self._cap = max(1, held)
        self._held: collections.OrderedDict[tuple[int, int], SharedBuffer] = (
            collections.OrderedDict()
        )
        self._idle: list[SharedBuffer] = []
        self._lock = threading.Lock()
        self._closed = False
        sweep_segments()  # what actors and learners killed on this host left behind

    def write(
        self, key: tuple[int, int], pieces: Iterable[memoryview], nbytes: int
    ) -> Segment | None:
        """Copy batch ``key`` (epoch, seq)'s ``pieces`` into a segment; None if none can be made.

        None also once :meth:`close` ran (a batch its collection thread finished too late).

        The segment's control carries the pieces' CRC-32C, taken as they are copied.
        """
        buffer = self._take(nbytes)
        if buffer is None:
            return None
        segment: Segment | None = buffer.fill_pieces(pieces)
        stale: SharedBuffer | None = None
        with self._lock:
            if self._closed:  # the actor stopped meanwhile: no one would remove it
                stale, segment = buffer, None
            else:
                stale = self._held.pop(key, None)
                self._held[key] = buffer
            while len(self._held) > self._cap:
                self._held.popitem(last=False)[1].close()
        if stale is not None:
            stale.close()
        return segment

    def _take(self, nbytes: int) -> SharedBuffer | None:
        """An acked segment of ``nbytes`` still intact, else a new one (None if none can be)."""
        with self._lock:
            buffer = next((b for b in self._idle if b.size == nbytes), None)
            if buffer is not None:
                self._idle.remove(buffer)
        if buffer is not None and buffer.intact():
            return buffer
        if buffer is not None:
            buffer.close()  # removed, replaced or opened up by another process: never named again
        return new_buffer(nbytes, "a batch goes to the learner as bytes")

    def acked(self, epoch: int, seq: int, first: int = 1) -> None:
        """The learner holds batches ``first`` to ``seq`` of ``epoch``: their segments are free.

        Those before ``first`` were sent to another learner, whose session this one's ended:
        they stay held (until the oldest go), that learner may not have read them yet.
        """
        with self._lock:
            done = [key for key in self._held if key[0] == epoch and first <= key[1] <= seq]
            for key in done:
                self._idle.insert(0, self._held.pop(key))
            extra = self._idle[IDLE_BATCH_SEGMENTS:]
            del self._idle[IDLE_BATCH_SEGMENTS:]
        for buffer in extra:
            buffer.close()

    def close(self) -> None:
        """Remove every segment (the actor is shutting down); a batch written later gets none."""
        with self._lock:
            self._closed = True
            buffers = [*self._held.values(), *self._idle]
            self._held.clear()
            self._idle.clear()
        for buffer in buffers:
            buffer.close()
