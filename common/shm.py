"""Weight blobs and batches in shared memory: a segment written once, read and checked by readers.

The learner writes weight blobs for the actors on its host; an actor writes batches for a
learner on its host (the learner copies them out of its kept mappings,
:meth:`SegmentMaps.reader`, packet by packet). A
segment is a file under ``/dev/shm`` named ``rlfleet-shm-<pid>-<32 hex>`` (the writer's pid,
then 128 random bits), created ``0600`` with ``O_EXCL``: written once (:func:`write_segment`),
or mapped by its writer and filled again push after push (batch after batch), its pages
reserved up front and kept (:class:`SharedBuffer`; :func:`new_buffer` makes one, or warns once
that none can be made, ``/dev/shm`` full, until one can again). The control that travels
elsewhere (name, size, CRC-32C) is all a reader trusts: :func:`read_segment` refuses a name
outside the pattern (no path traversal), a link, a file not owned by this user or readable by
others, a size other than the one announced, and a digest mismatch (:func:`opened_segment`
and :class:`SegmentMaps` check all but the digest, which their caller checks over what it
read). They raise
:class:`ShmError` on any of them, so the caller falls back to the bytes path and applies
nothing (or takes the batch as bytes). :func:`sweep_segments` removes the segments of
writers that are gone (SIGKILL).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from common.checksum import crc32c
from common.errors import fd_limit_hint
from common.leftovers import sweep_leftovers, writer_tag

__all__ = [
    "PROBE_BYTES",
    "SHM_ROOT",
    "ShmError",
    "Segment",
    "SegmentMaps",
    "SharedBuffer",
    "host_identity",
    "new_buffer",
    "opened_segment",
    "read_segment",
    "read_segment_into",
    "remove_segment",
    "sweep_segments",
    "write_segment",
]

log = logging.getLogger(__name__)

#: Where segments live (tmpfs on Linux).
SHM_ROOT = "/dev/shm"
#: The largest segment a reader accepts (64 GiB).
MAX_SEGMENT = 1 << 36
#: The size of the probe a learner names at Describe; an actor reads no other.
PROBE_BYTES = 32
# Bytes SharedBuffer.fill_pieces copies, then checksums while they are in the cache.
_FILL_BLOCK = 256 << 10

# The writer's pid, its PID namespace (left out by writers before it was added), 128
# random bits.
_NAME = re.compile(r"^rlfleet-shm-(?P<pid>\d{1,10})-(?:(?P<ns>\d{1,20})-)?[0-9a-f]{32}$")


def _new_name(root: str) -> str:
    """A fresh segment name of this process in ``root`` (the pattern :data:`_NAME` accepts)."""
    return f"rlfleet-shm-{writer_tag(root)}-{secrets.token_hex(16)}"


class ShmError(Exception):
    """A segment cannot be trusted or read; the caller falls back to the bytes path."""


@dataclass(frozen=True)
class Segment:
    """The control of one segment: what a reader is told, and all it trusts."""

    name: str
    size: int
    crc32c: int


def write_segment(
    blob: bytes | bytearray | memoryview, root: str = SHM_ROOT, crc: int | None = None
) -> Segment:
    """Write ``blob`` once into a new ``0600`` segment under ``root``; its control back.

    ``crc`` is the blob's CRC-32C when the caller has it already (computed otherwise).
    """
    name = _new_name(root)
    path = os.path.join(root, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(blob).cast("B")
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    except BaseException:
        os.close(fd)
        remove_segment(name, root)
        raise
    os.close(fd)
    return Segment(name=name, size=len(view), crc32c=crc32c(view) if crc is None else crc)


class SharedBuffer:
    """A segment its writer keeps mapped and fills again, push after push.

    Its pages are reserved when it is made (``posix_fallocate``: a full ``/dev/shm`` is an
    ``OSError`` here, never a ``SIGBUS`` at a later write) and stay allocated while it
    lives, so filling it again costs one copy and no page faults. Readers open it by name
    as any segment and check what they read against the control; the writer fills it only
    while no reader is told of it. :meth:`close` removes it.

    Args:
        size: Its exact size in bytes (readers check the file's size against the control).
        root: The folder it lives in.

    Raises:
        OSError: The segment cannot be made (``/dev/shm`` full, absent, not writable).
    """

    def __init__(self, size: int, root: str = SHM_ROOT) -> None:
        if size <= 0:
            raise OSError(f"a shared buffer holds at least one byte, not {size}")
        self.root = root
        self.name = _new_name(root)
        self.size = size
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            self._inode = os.fstat(fd).st_ino
            self._memory = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            remove_segment(self.name, root)
            raise
        self._fd: int | None = fd  # kept for the write lock

    def lock_for_writing(self) -> bool:
        """Take the segment's write lock (``flock`` exclusive); False while a reader holds it.

        Readers that apply what they read in place (:class:`SegmentMaps`) hold the shared
        lock from their check to their last read, so the writer fills a segment only while
        it holds this lock, and lets it go (:meth:`unlock`) before it names the segment.
        """
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        """Let go of the write lock: readers may now hold the segment."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @property
    def _path(self) -> str:
        return os.path.join(self.root, self.name)

    def intact(self) -> bool:
        """Whether its name still leads to its own file, private and of its size.

        Another process of this user may remove, replace or open up a segment; a writer
        that asks before filling one again makes a new one instead of naming a spoiled one.
        """
        try:
            info = os.stat(self._path, follow_symlinks=False)
        except OSError:
            return False
        private = stat.S_ISREG(info.st_mode) and not info.st_mode & 0o077
        return private and info.st_ino == self._inode and info.st_size == self.size

    def view(self) -> memoryview:
        """The writer's view of the whole mapping (to encode a blob straight into it).

        While any view lives, :meth:`close` raises ``BufferError``; a writer that hands out
        views lets go with :meth:`remove` instead, and the mapping goes with the last view.
        """
        return memoryview(self._memory)

    def control(self, crc: int) -> Segment:
        """The control of what the segment holds now, of CRC-32C ``crc`` (the writer's)."""
        return Segment(name=self.name, size=self.size, crc32c=crc)

    def remove(self) -> None:
        """Remove the segment's name: no reader opens it again (the mapping stays the writer's)."""
        remove_segment(self.name, self.root)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def fill(self, blob: bytes | bytearray | memoryview, crc: int) -> Segment:
        """Copy ``blob`` (exactly :attr:`size` bytes, of CRC-32C ``crc``) in; its control back."""
        view = memoryview(blob).cast("B")
        if view.nbytes != self.size:
            raise ValueError(f"a blob of {view.nbytes} bytes in a segment of {self.size}")
        self._memory[:] = view
        return self.control(crc)

    def fill_pieces(self, pieces: Iterable[bytes | bytearray | memoryview]) -> Segment:
        """Copy consecutive ``pieces`` (exactly :attr:`size` bytes in all) in, and checksum them.

        Each block of ``_FILL_BLOCK`` bytes is checksummed right after it is copied, from
        the writer's own memory while the copy has left it in the cache: the CRC-32C
        takes no second pass over memory.

        Returns:
            The segment's control, with the pieces' CRC-32C.

        Raises:
            ValueError: The pieces do not add up to :attr:`size` bytes.
        """
        at, crc = 0, 0
        for piece in pieces:
            view = memoryview(piece).cast("B")
            end = at + view.nbytes
            if end > self.size:
                raise ValueError(
                    f"pieces of more than {self.size} bytes in a segment of {self.size}"
                )
            for start in range(0, view.nbytes, _FILL_BLOCK):
                block = view[start : start + _FILL_BLOCK]
                self._memory[at + start : at + start + block.nbytes] = block
                crc = crc32c(block, crc)
            at = end
        if at != self.size:
            raise ValueError(f"pieces of {at} bytes in a segment of {self.size}")
        return self.control(crc)

    def close(self) -> None:
        """Unmap and remove the segment."""
        self._memory.close()
        self.remove()


class _Shortage:
    """Whether this process failed to make its last segment: warned of once, not per batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._short = False

    def failed(self) -> bool:
        """A segment could not be made: whether that is news (the one to warn of)."""
        with self._lock:
            news, self._short = not self._short, True
        return news

    def made(self) -> bool:
        """A segment was made: whether that ends a shortage."""
        with self._lock:
            ended, self._short = self._short, False
        return ended


_shortage = _Shortage()


def new_buffer(size: int, goes: str, root: str = SHM_ROOT) -> SharedBuffer | None:
    """A new :class:`SharedBuffer` of ``size`` bytes, or None when none can be made.

    The first failure is one warning, saying why and ``goes`` (what goes without a
    segment); the next ones are debug lines until a segment is made again (said at
    info): a full ``/dev/shm`` would otherwise warn at every batch and every push.
    """
    try:
        buffer = SharedBuffer(size, root)
    except OSError as exc:
        level = logging.WARNING if _shortage.failed() else logging.DEBUG
        why = f"{exc}{fd_limit_hint(str(exc))}"
        log.log(
            level,
            "%s: no segment of %d bytes can be made under %s (%s); "
            "said once until one can be made again",
            goes,
            size,
            root,
            why,
        )
        return None
    if _shortage.made():
        log.info("segments can be made under %s again", root)
    return buffer


def remove_segment(name: str, root: str = SHM_ROOT) -> None:
    """Remove segment ``name`` (a name outside the pattern, or one gone, is left alone)."""
    if _NAME.match(name) is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, name))


def read_segment(control: Segment, root: str = SHM_ROOT) -> bytes:
    """The bytes of a segment, checked against ``control``; :class:`ShmError` on any doubt."""
    with opened_segment(control, root) as read_at:  # checked before a byte is allocated
        data = bytearray(control.size)
        read_at(memoryview(data), 0)
    if crc32c(data) != control.crc32c:
        raise ShmError(f"segment {control.name} fails its CRC-32C")
    return bytes(data)


def read_segment_into(control: Segment, into: memoryview, root: str = SHM_ROOT) -> None:
    """Read a segment straight into ``into`` (exactly ``control.size`` bytes long).

    Checks everything but the CRC-32C (name, size, owner, mode), which the caller checks
    over ``into``, the private copy (the segment itself may change under a reader).

    Raises:
        ShmError: The segment cannot be read or trusted.
    """
    if _size_ok(control) and into.nbytes != control.size:
        raise ShmError(f"segment size {control.size} differs from the {into.nbytes} bytes expected")
    with opened_segment(control, root) as read_at:
        read_at(into, 0)


@contextlib.contextmanager
def opened_segment(
    control: Segment, root: str = SHM_ROOT
) -> Iterator[Callable[[memoryview, int], None]]:
    """A segment opened and checked against ``control`` (name, size, owner, mode).

    Yields ``read_at(into, offset)``, which fills ``into`` from the segment's byte
    ``offset`` on. The CRC-32C is the caller's to check, over what it read (the segment
    itself may change under a reader).

    Raises:
        ShmError: The segment cannot be opened, trusted or read (also from ``read_at``).
    """
    with _checked_fd(control, root) as (fd, _info):

        def read_at(into: memoryview, offset: int) -> None:
            _check_read(control, into, offset)
            _read_all(fd, into, offset)

        yield read_at


def _check_read(control: Segment, into: memoryview, offset: int) -> None:
    if offset < 0 or offset + into.nbytes > control.size:
        raise ShmError(f"a read of {into.nbytes} bytes at {offset} overruns segment {control.name}")


@contextlib.contextmanager
def _checked_fd(control: Segment, root: str) -> Iterator[tuple[int, os.stat_result]]:
    """The segment's file, opened read-only and checked (name, size, owner, mode), and its stat.

    The one place a reader decides whether a segment named by a peer may be touched.
    """
    if not isinstance(control.name, str) or _NAME.match(control.name) is None:
        raise ShmError(f"segment name {control.name!r} is outside the allowed pattern")
    if not _size_ok(control):
        raise ShmError(f"segment size {control.size} is out of range")
    try:
        # O_NONBLOCK: a FIFO (anyone may make one in /dev/shm) opens at once and is refused.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(os.path.join(root, control.name), flags)
    except OSError as exc:
        why = f"{exc}{fd_limit_hint(str(exc))}"
        raise ShmError(f"segment {control.name} cannot be opened: {why}") from exc
    try:
        info = os.fstat(fd)
        _check_owner(info, control)
        yield fd, info
    finally:
        os.close(fd)


class SegmentMaps:
    """A reader's mappings of the segments it reads again and again, kept for the next read.

    A learner encodes push after push into the same few segments, and an actor fills the
    same few with batch after batch; a reader that keeps their mappings reads them without
    a page fault (:meth:`reader` copies out of one; :meth:`locked` holds one to apply it
    in place). Writers never shrink a segment (:class:`SharedBuffer`); a process of the
    fleet's own user that does can crash a reader (``SIGBUS``), as it can kill it outright.

    :meth:`locked` checks a segment as
    :func:`opened_segment` does and holds its shared lock while the caller reads: the
    writer (:class:`SharedBuffer`) fills a segment only under the exclusive lock, so what
    the caller checks stays what it then applies. Mappings are copy-on-write and never
    written, so they are writable memory (``torch.frombuffer`` views them) that sees the
    writer's later fills. A mapping whose name is gone or leads to another file is dropped
    at the next read, and one of a file since resized is mapped again at the size named;
    its pages go with the last view of them. Reads may come from several
    threads at once (an actor applies two models' pushes side by side).

    Args:
        keep: Mappings kept (a model's pushes alternate between two segments).
        root: The folder segments live in.
    """

    def __init__(self, keep: int = 2, root: str = SHM_ROOT) -> None:
        self._keep = keep
        self._root = root
        self._maps: collections.OrderedDict[tuple[str, int], mmap.mmap] = collections.OrderedDict()
        # Reads may come from several threads at once (an actor applies two models' pushes).
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def locked(self, control: Segment) -> Iterator[memoryview]:
        """The segment's bytes, checked (name, owner, mode, size) and held against its writer.

        The CRC-32C is the caller's to check, over the view it is given, before use.

        Raises:
            ShmError: The segment cannot be opened or trusted, or its writer holds it.
        """
        if control.size == 0:  # nothing to map; every other check is _checked_fd's
            raise ShmError("segment size 0 is out of range for a mapping")
        with _checked_fd(control, self._root) as (fd, info):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ShmError(f"segment {control.name} is being written") from None
            try:
                yield memoryview(self._mapping(fd, control, info.st_ino))
            finally:
                # Explicitly: the mapping's own duplicate of fd would keep the lock held.
                fcntl.flock(fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def reader(self, control: Segment) -> Iterator[Callable[[memoryview, int], None]]:
        """:func:`opened_segment`'s ``read_at``, copying from this reader's kept mapping.

        For segments a writer fills again and again (an actor's batch segments): once
        mapped, a read is a plain copy, with neither a page fault nor a system call a
        piece, about twice as fast as reading the file. The segment is checked as
        :func:`opened_segment` checks it, and the CRC-32C is the caller's to check over
        what it read, as there.

        Raises:
            ShmError: The segment cannot be opened or trusted (also from ``read_at``).
        """
        if control.size == 0:  # nothing to map; every other check is _checked_fd's
            raise ShmError("segment size 0 is out of range for a mapping")
        with _checked_fd(control, self._root) as (fd, info):
            mapping = memoryview(self._mapping(fd, control, info.st_ino))

            def read_at(into: memoryview, offset: int) -> None:
                _check_read(control, into, offset)
                into[:] = mapping[offset : offset + into.nbytes]

            yield read_at

    def _mapping(self, fd: int, control: Segment, inode: int) -> mmap.mmap:
        key = (control.name, inode)
        with self._lock:
            mapping = self._maps.pop(key, None)
            if mapping is None or len(mapping) != control.size:  # a file resized in place
                mapping = _mapped(fd, control)
            self._maps[key] = mapping
            for name, ino in list(self._maps)[:-1]:
                if len(self._maps) > self._keep or not _leads_to(self._root, name, ino):
                    del self._maps[(name, ino)]  # unmapped with its last view, never closed here
        return mapping


def _mapped(fd: int, control: Segment) -> mmap.mmap:
    """A copy-on-write mapping of a checked segment; :class:`ShmError` when none can be made.

    A mapping holds a file descriptor of its own (``mmap`` duplicates ``fd``): a process
    out of them (``ulimit -n``) or of address space reads that segment's data as bytes.
    """
    try:
        return mmap.mmap(fd, control.size, access=mmap.ACCESS_COPY)
    except OSError as exc:
        why = f"{exc}{fd_limit_hint(str(exc))}"
        raise ShmError(f"segment {control.name} cannot be mapped: {why}") from exc


def _leads_to(root: str, name: str, inode: int) -> bool:
    try:
        return os.stat(os.path.join(root, name), follow_symlinks=False).st_ino == inode
    except OSError:
        return False


def _size_ok(control: Segment) -> bool:
    return isinstance(control.size, int) and 0 <= control.size <= MAX_SEGMENT


def _check_owner(info: os.stat_result, control: Segment) -> None:
    """Refuse a segment that is not a regular file of this user, private, of the announced size."""
    if not stat.S_ISREG(info.st_mode):
        raise ShmError(f"segment {control.name} is not a regular file")
    if info.st_uid != os.geteuid():
        raise ShmError(f"segment {control.name} is owned by another user")
    if info.st_mode & 0o077:
        raise ShmError(f"segment {control.name} is readable or writable by others")
    if info.st_size != control.size:
        raise ShmError(f"segment {control.name} holds {info.st_size} bytes, not {control.size}")


def _read_all(fd: int, into: memoryview, offset: int = 0) -> None:
    """Fill ``into`` from ``fd`` at ``offset``; :class:`ShmError` when the file is shorter."""
    done = 0
    while done < into.nbytes:
        got = os.preadv(fd, [into[done:]], offset + done)
        if got == 0:
            raise ShmError(f"segment shrank to {done} of {into.nbytes} bytes while read")
        done += got


def sweep_segments(root: str = SHM_ROOT) -> list[str]:
    """Remove this user's segments whose writer process is gone; the names removed."""
    swept = sweep_leftovers(root, _NAME, lambda path: remove_segment(os.path.basename(path), root))
    return [os.path.basename(path) for path in swept]


def host_identity(root: str = SHM_ROOT) -> str:
    """This host as a user of ``root`` sees it: boot id, host name, ``root``'s device and inode.

    Two processes with equal identities share the kernel, and the same ``/dev/shm`` mount
    (containers that do not share it differ in its device or inode). Empty when any part
    cannot be read: such a host shares nothing.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        info = os.stat(root)
    except OSError:
        return ""
    if not boot:
        return ""
    return f"{boot}/{socket.gethostname()}/{info.st_dev}:{info.st_ino}"
