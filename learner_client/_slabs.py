"""The learner's reusable host memory: packet slabs, and the buffers weight pushes fill.

Packet slabs let a sync round be stacked without copying; blob buffers are the page-locked
memory a push is encoded into.

Fresh memory costs a page fault per 4 KiB and page-locked memory is slow to allocate, so
both are reused, by one rule: a buffer is handed out again only once no tensor views it
any more (torch's count of the storage's users is back to the buffer's own,
:func:`storage_users`). A batch or a blob you keep is never overwritten; a dropped one
gives its memory, already paged in, to the next.

*Packet slabs.* A sync batch stacks one packet per actor. When the packets of one round
were received into one storage, at the same distance from each other, every stacked entry
is a strided view of that storage (:func:`learner_client._rounds.combine` checks this per
entry and copies only what does not line up). :class:`PacketSlabs` hands out such buffers:
a slab holds one slot per actor position, and the n-th packet of each actor goes to the
oldest slab whose slot for that actor is free, so rounds line up as long as actors deliver
rounds in order (the sync mailbox makes them). A packet outside any round (async
collection, an actor not yet in the layout) gets a one-slot slab, reused the same way.
Slabs are page-locked when batches go on to a CUDA device (``pin_memory``); otherwise a
large slab asks for transparent huge pages (:func:`host_memory`). Slots never filled (a
missing actor) are never touched, so they cost address space, not memory.

*Blob buffers.* A push is encoded straight into one host buffer: each tensor is copied once
(from its device or its CPU memory) into its place in the blob, which then goes on the wire
as it is (``common.weights.encode_weights``'s ``allocate``). :class:`BlobBuffers`
keeps each model's buffers; a model's last push is kept for re-sends, so two buffers per
model are in use at most. While actors share the learner's host, a model's buffers are
shared-memory segments (:class:`BlobSegments`, ``learner_client._shm``): the blob is
encoded straight into the segment those actors read, and is not copied again to reach them.
"""

from __future__ import annotations

import dataclasses
import mmap
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from common.shm import SharedBuffer

__all__ = ["BlobBuffers", "BlobSegments", "PacketSlabs", "host_memory", "storage_users"]

_ALIGN = 16
# Slabs waiting for a slot to be filled; older ones are let go (their packets simply
# stop lining up, and combine copies them).
_MAX_OPEN = 8
# Filled slabs kept for reuse once their batches are dropped (enough to outlast the batches
# in flight and queued, for two buffer sizes); older ones are let go.
_MAX_FILLED = 16
# An x86-64 / ARM64 transparent huge page.
_HUGE_PAGE = 2 << 20


def storage_users(storage: torch.Tensor) -> int | None:
    """How many tensors (and storage objects) share ``storage``'s memory; None if unknown."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(storage.untyped_storage()._cdata))


def host_memory(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh uint8 memory, in transparent huge pages where the kernel allows.

    A batch of megabytes is copied twice on its way in (out of its segment or chunks, and
    the ``"next"`` entries of a folded batch rebuilt); in 4 KiB pages every copy walks a
    TLB miss per page. Measured on a pixel fleet, the two copies took 6% less CPU in
    2 MiB pages (median of six pairs). Below one huge page, or where the kernel has no
    ``MADV_HUGEPAGE`` (or refuses the mapping or the advice), this is plain
    ``torch.empty``'s memory; either way it is untouched until written, and freed with the
    last tensor that views it.
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < _HUGE_PAGE:
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        # Private (a shared mapping is shmem, which madvise does not put in huge pages),
        # with room to start on a huge page.
        region = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # refused (memory limits): torch's allocator decides, and says why
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        region.madvise(advice)
    except OSError:  # a kernel built without transparent huge pages
        region.close()
        return torch.empty(nbytes, dtype=torch.uint8)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps the region alive
    skip = -whole.data_ptr() % _HUGE_PAGE
    return whole[skip : skip + nbytes]


class _Slab:
    def __init__(self, width: int, slot_bytes: int, pin_memory: bool) -> None:
        self.width = width
        self.slot_bytes = slot_bytes
        nbytes = width * slot_bytes
        self.storage = (
            torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            if pin_memory
            else host_memory(nbytes)
        )
        self.free = set(range(width))
        self._own_users = storage_users(self.storage)

    def idle(self) -> bool:
        """No tensor but the slab's own views its memory (False when torch cannot tell)."""
        users = storage_users(self.storage)
        return users is not None and users == self._own_users

    def fits(self, width: int, slot_bytes: int) -> bool:
        return self.width == width and self.slot_bytes == slot_bytes


class PacketSlabs:
    """Hands out packet buffers so that one round's packets share one storage, evenly spaced.

    Args:
        pin_memory: Allocate page-locked slabs, so batches reach a CUDA device in one
            ``non_blocking`` copy (:class:`learner_client._rounds.Placement`).

    Example::

        slabs = PacketSlabs()
        allocate = slabs.allocator(position=0, width=2)  # the first of two actors
        assembler = PacketAssembler(info.total_bytes, allocate=allocate)
    """

    def __init__(self, pin_memory: bool = False) -> None:
        self.pin_memory = pin_memory
        self._open: list[_Slab] = []
        self._filled: list[_Slab] = []
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}

    def set_layout(self, worker_ids: Sequence[int]) -> None:
        """The workers of a round, in order: each one's packets go to its position."""
        with self._lock:
            self._positions = {w: i for i, w in enumerate(worker_ids)}

    def for_worker(self, worker_id: int) -> Callable[[int], torch.Tensor]:
        """The ``allocate`` of one actor's stream: its slot under the current layout.

        A worker outside the layout (not yet part of a round) gets a one-slot slab.
        """

        def allocate(nbytes: int) -> torch.Tensor:
            with self._lock:
                position, width = self._positions.get(worker_id), len(self._positions)
            if position is None:
                return self.buffer(0, 1, nbytes)
            return self.buffer(position, width, nbytes)

        return allocate

    def allocator(self, position: int, width: int) -> Callable[[int], torch.Tensor]:
        """The ``allocate`` callable of the actor at ``position`` among ``width`` actors.

        Args:
            position: The actor's index in worker_id order.
            width: How many actors a round has.

        Raises:
            ValueError: If ``position`` is not in ``range(width)``.
        """
        if type(position) is not int or type(width) is not int or not 0 <= position < width:
            raise ValueError(f"position must be in range(width), got {position!r} of {width!r}")

        def allocate(nbytes: int) -> torch.Tensor:
            return self.buffer(position, width, nbytes)

        return allocate

    def buffer(self, position: int, width: int, nbytes: int) -> torch.Tensor:
        """An ``nbytes`` uint8 buffer in slot ``position`` of a ``width``-slot slab.

        Nothing else views the buffer: it is new memory or that of a dropped batch.
        """
        slot_bytes = nbytes + -nbytes % _ALIGN
        with self._lock:
            slab = next(
                (s for s in self._open if s.fits(width, slot_bytes) and position in s.free), None
            )
            if slab is None:
                slab = self._reusable(width, slot_bytes) or _Slab(
                    width, slot_bytes, self.pin_memory
                )
                self._open.append(slab)
                del self._open[:-_MAX_OPEN]
            slab.free.discard(position)
            if not slab.free:
                self._open.remove(slab)
                self._filled.append(slab)
                del self._filled[:-_MAX_FILLED]
        start = position * slot_bytes
        return slab.storage[start : start + nbytes]

    def _reusable(self, width: int, slot_bytes: int) -> _Slab | None:
        """A filled slab of this shape whose batches were all dropped, emptied for reuse."""
        for slab in self._filled:
            if slab.fits(width, slot_bytes) and slab.idle():
                self._filled.remove(slab)
                slab.free = set(range(width))
                return slab
        return None


# ------------------------------------------------ blob buffers of weight pushes

# A model's push buffers kept for reuse (its last push is kept for re-sends).
_KEPT_PER_MODEL = 2


class BlobSegments(Protocol):
    """Where blob buffers in shared memory come from (``learner_client._shm.ShmRoute``)."""

    def wanted(self) -> bool:
        """Whether pushes now go to actors that read segments (blobs belong in one)."""

    def make(self, nbytes: int) -> SharedBuffer | None:
        """A new segment of exactly ``nbytes`` for a blob, write-locked; None if none can be."""

    def forget(self, buffer: SharedBuffer) -> None:
        """A blob segment is no longer kept: it is never named to a reader again."""


@dataclasses.dataclass(eq=False)
class _Kept:
    buffer: torch.Tensor
    own_users: int | None
    segment: SharedBuffer | None = None

    def idle(self, nbytes: int, shared: bool) -> bool:
        """Free for a blob of ``nbytes``: nothing else views it, and it is of the kind asked.

        A segment serves only a blob of exactly its size (readers check a segment's size).
        """
        if (self.segment is not None) != shared or self.own_users is None:
            return False
        fits = self.buffer.numel() == nbytes if shared else self.buffer.numel() >= nbytes
        free = fits and storage_users(self.buffer) == self.own_users
        # A segment is written only under its write lock (no actor still reads it).
        return free and (self.segment is None or self.segment.lock_for_writing())


class BlobBuffers:
    """Reusable blob buffers, per model_id (page-locked when CUDA is present; thread-safe).

    Args:
        segments: Gives shared-memory buffers while actors read segments; None: never
            (nor on a learner with CUDA, whose device copies want page-locked memory).
    """

    def __init__(self, segments: BlobSegments | None = None) -> None:
        self._lock = threading.Lock()
        # A learner with CUDA keeps page-locked buffers for its device copies.
        self._segments = None if torch.cuda.is_available() else segments
        self._kept: dict[str, list[_Kept]] = {}

    def for_model(self, model_id: str) -> Callable[[int], torch.Tensor]:
        """The ``allocate`` of ``model_id``'s pushes: a buffer of at least the size asked."""
        return lambda nbytes: self.take(model_id, nbytes)

    def take(self, model_id: str, nbytes: int) -> torch.Tensor:
        """An idle buffer of ``model_id`` holding ``nbytes``, else a new one (kept for reuse)."""
        shared = self._segments is not None and self._segments.wanted()
        with self._lock:
            kept = self._kept.setdefault(model_id, [])
            for entry in kept:
                if entry.idle(nbytes, shared):
                    return entry.buffer
            entry = self._new(nbytes, shared)
            kept.append(entry)
            dropped = kept[:-_KEPT_PER_MODEL]
            del kept[:-_KEPT_PER_MODEL]
        for old in dropped:
            self._let_go(old)
        return entry.buffer

    def clear(self) -> None:
        """Let every kept buffer go (its segment's name first; its memory with its views)."""
        with self._lock:
            kept = [entry for entries in self._kept.values() for entry in entries]
            self._kept = {}
        for entry in kept:
            self._let_go(entry)

    def _new(self, nbytes: int, shared: bool) -> _Kept:
        segment = self._segments.make(nbytes) if shared and self._segments is not None else None
        if segment is not None:
            buffer = torch.frombuffer(segment.view(), dtype=torch.uint8)
        else:
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return _Kept(buffer, storage_users(buffer), segment)

    def _let_go(self, entry: _Kept) -> None:
        if entry.segment is not None and self._segments is not None:
            self._segments.forget(entry.segment)
