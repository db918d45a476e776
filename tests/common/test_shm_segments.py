"""Shared-memory segments: written once, read back checked, refused on doubt, swept on SIGKILL."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common import checksum
from common import shm as shm_module
from common.checksum import crc32c
from common.errors import DataLossError
from common.shm import (
    Segment,
    SegmentMaps,
    SharedBuffer,
    ShmError,
    opened_segment,
    read_segment,
    read_segment_into,
    remove_segment,
    sweep_segments,
    write_segment,
)
from common.weights import BlobAssembler


def test_round_trip_private_and_removed(tmp_path: Path) -> None:
    blob = os.urandom(1 << 20)
    seg = write_segment(blob, str(tmp_path))
    assert (os.stat(tmp_path / seg.name).st_mode & 0o777) == 0o600
    assert read_segment(seg, str(tmp_path)) == blob
    remove_segment(seg.name, str(tmp_path))
    assert not (tmp_path / seg.name).exists()


def test_corrupt_missing_and_resized_are_refused(tmp_path: Path) -> None:
    seg = write_segment(b"x" * 4096, str(tmp_path))
    with open(tmp_path / seg.name, "r+b") as f:
        f.write(b"y")
    with pytest.raises(ShmError, match="CRC"):
        read_segment(seg, str(tmp_path))
    with pytest.raises(ShmError, match="bytes, not"):
        read_segment(replace(seg, size=10), str(tmp_path))
    os.unlink(tmp_path / seg.name)
    with pytest.raises(ShmError, match="cannot be opened"):
        read_segment(seg, str(tmp_path))


def test_read_into_a_buffer_and_the_assembler_checks_the_private_copy(tmp_path: Path) -> None:
    blob = os.urandom(3 << 20)
    seg = write_segment(blob, str(tmp_path))
    into = memoryview(bytearray(len(blob)))
    read_segment_into(seg, into, str(tmp_path))
    assert into == blob
    with pytest.raises(ShmError, match="differs from the 10 bytes expected"):
        read_segment_into(seg, into[:10], str(tmp_path))
    assembler = BlobAssembler(len(blob), crc32c=crc32c(blob))
    with opened_segment(seg, str(tmp_path)) as read_at:
        assembler.add_rest(read_at)
    assert assembler.finish() == blob
    with open(tmp_path / seg.name, "r+b") as f:  # changed after the learner's CRC
        f.write(b"\x00" if blob[0] else b"\x01")
    damaged = BlobAssembler(len(blob), crc32c=crc32c(blob))
    with opened_segment(seg, str(tmp_path)) as read_at:
        damaged.add_rest(read_at)
    with pytest.raises(DataLossError, match="crc32c mismatch"):
        damaged.finish()


@pytest.mark.parametrize(
    "name",
    [
        "../etc/passwd",
        "rlfleet-shm-1-../../x",
        "other",
        "rlfleet-shm-1-" + "0" * 31,
        "/dev/shm/rlfleet-shm-1-" + "0" * 32,
    ],
)
def test_names_outside_the_pattern_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ShmError, match="outside"):
        read_segment(Segment(name=name, size=0, crc32c=0), str(tmp_path))


def test_a_name_that_goes_on_past_a_segment_name_is_never_opened_or_removed(
    tmp_path: Path,
) -> None:
    """A valid name followed by more (``/../victim``) would lead out of the segment folder."""
    prefix = "rlfleet-shm-1-" + "0" * 32
    (tmp_path / prefix).mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    victim.chmod(0o600)
    name = prefix + "/../victim"
    with pytest.raises(ShmError, match="outside"):
        read_segment(Segment(name=name, size=4, crc32c=crc32c(b"kept")), str(tmp_path))
    remove_segment(name, str(tmp_path))
    assert victim.read_bytes() == b"kept"


def test_huge_size_and_shared_mode_and_links_are_refused(tmp_path: Path) -> None:
    seg = write_segment(b"abc", str(tmp_path))
    with pytest.raises(ShmError, match="out of range"):
        read_segment(replace(seg, size=2**64 - 1), str(tmp_path))
    os.chmod(tmp_path / seg.name, 0o644)
    with pytest.raises(ShmError, match="others"):
        read_segment(seg, str(tmp_path))
    link = "rlfleet-shm-1-" + "a" * 32
    os.symlink(tmp_path / seg.name, tmp_path / link)
    with pytest.raises(ShmError, match="cannot be opened"):
        read_segment(replace(seg, name=link), str(tmp_path))


def test_a_fifo_is_refused_at_once_and_a_missing_huge_segment_allocates_nothing(
    tmp_path: Path,
) -> None:
    name = "rlfleet-shm-1-" + "b" * 32
    os.mkfifo(tmp_path / name, 0o600)
    with pytest.raises(ShmError, match="not a regular file"):  # used to block in open()
        read_segment(Segment(name=name, size=4, crc32c=0), str(tmp_path))
    missing = Segment(name="rlfleet-shm-1-" + "c" * 32, size=1 << 36, crc32c=0)
    with pytest.raises(ShmError, match="cannot be opened"):  # was a 64 GiB bytearray first
        read_segment(missing, str(tmp_path))


def test_sweep_removes_a_killed_writers_segment(tmp_path: Path) -> None:
    code = (
        "import sys, time; from common.shm import write_segment;"
        f" print(write_segment(b'z' * 100, {str(tmp_path)!r}).name, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    mine = write_segment(b"live", str(tmp_path))
    assert sweep_segments(str(tmp_path)) == []
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert sweep_segments(str(tmp_path)) == [name]
    assert set(os.listdir(tmp_path)) == {mine.name, own_mark()}  # the writer's mark went too


def own_mark() -> str:
    """This process's mark: what tells sweepers of other PID namespaces it lives."""
    return f"rlfleet-live-{os.getpid()}-{os.stat('/proc/self/ns/pid').st_ino}"


#: Tests that run a sweeper (or a writer) in a PID namespace of its own, as another container.
NEEDS_UNSHARE = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
#: The environment of the tests' subprocesses: this checkout on their path.
CHECKOUT_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def sweep_from_another_pid_namespace(root: Path) -> str:
    """What ``sweep_segments(root)`` removes when run from a new PID namespace, printed."""
    code = f"from common.shm import sweep_segments; print(sweep_segments({str(root)!r}))"
    swept = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=CHECKOUT_ENV,
    )
    assert swept.returncode == 0, swept.stderr
    return swept.stdout.strip()


@NEEDS_UNSHARE
def test_the_sweep_leaves_the_segments_of_another_pid_namespace(tmp_path: Path) -> None:
    """Containers of one pod share /dev/shm, not their pids: a pid alive in its writer's
    namespace may be no one's in the sweeper's, which used to remove live segments.
    """
    live = write_segment(b"live", str(tmp_path))  # this process, alive in its namespace
    # where this test's pid is no process at all:
    assert sweep_from_another_pid_namespace(tmp_path) == "[]"
    assert set(os.listdir(tmp_path)) == {live.name, own_mark()}


@NEEDS_UNSHARE
def test_a_killed_writer_of_another_pid_namespace_is_swept_by_its_mark(tmp_path: Path) -> None:
    """A container that shares /dev/shm and dies by SIGKILL comes back in a new namespace:
    its segments used to stay for good. Its mark, locked while it lived, says it is gone.
    """
    code = (
        "import time; from common.shm import write_segment;"
        f" print(write_segment(b'z' * 100, {str(tmp_path)!r}).name, flush=True); time.sleep(60)"
    )
    writer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=CHECKOUT_ENV,
    )
    assert writer.stdout is not None
    name = writer.stdout.readline().strip()
    theirs = {n for n in os.listdir(tmp_path) if n.startswith("rlfleet-live-")}
    assert len(theirs) == 1  # the writer's mark (pid 1 of its namespace)
    assert sweep_segments(str(tmp_path)) == []  # alive: its mark is held
    writer.kill()  # unshare, and with it (--kill-child) the writer
    writer.wait()
    writer.stdout.close()
    deadline = time.monotonic() + 10
    while (swept := sweep_segments(str(tmp_path))) == [] and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel lets go of the mark's lock as the writer ends
    assert swept == [name]
    assert os.listdir(tmp_path) == []  # its segment and its mark


@NEEDS_UNSHARE
def test_a_forked_child_does_not_keep_its_parents_mark_held(tmp_path: Path) -> None:
    """A child forked by a writer (an env worker, say) inherits the mark's descriptor: were
    it kept, the parent's segments would outlive it as long as the child lives."""
    code = f"""
import os, signal, time
from common.shm import write_segment
name = write_segment(b"z" * 100, {str(tmp_path)!r}).name
child = os.fork()
if child == 0:  # lets go of the test's pipes, then lives on
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    time.sleep(60)
    os._exit(0)
print(name, child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    writer = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=CHECKOUT_ENV
    )
    name, child = writer.stdout.split()
    try:  # judged by the mark alone: the child lives, the writer is gone
        assert sweep_from_another_pid_namespace(tmp_path) == repr([name])
    finally:
        os.kill(int(child), signal.SIGKILL)


@pytest.mark.parametrize("piece", [7, 1 << 19])
def test_the_assembler_reads_a_segment_in_pieces_each_checked_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    blob = os.urandom((1 << 20) + 3)
    seg = write_segment(blob, str(tmp_path))
    monkeypatch.setattr(checksum, "READ_PIECE", piece)
    reads: list[tuple[int, int]] = []
    assembler = BlobAssembler(len(blob), crc32c=crc32c(blob))
    assembler.add(blob[:5])  # chunks first: the reads go on from there
    with opened_segment(seg, str(tmp_path)) as read_at:

        def recorded(into: memoryview, offset: int) -> None:
            reads.append((offset, into.nbytes))
            read_at(into, offset)

        assembler.add_rest(recorded)
    assert assembler.finish() == blob
    assert reads[0] == (5, min(piece, len(blob) - 5))
    assert all(size <= piece for _, size in reads)
    assert sum(size for _, size in reads) == len(blob) - 5
    assert [o for o, _ in reads] == sorted(o for o, _ in reads)


def _shared(tmp_path: Path, blob: bytes) -> SharedBuffer:
    buffer = SharedBuffer(len(blob), str(tmp_path))
    buffer.fill(blob, crc32c(blob))
    return buffer


def test_pieces_are_checksummed_as_they_are_copied_across_blocks(tmp_path: Path) -> None:
    sizes = [1, 300_000, 256 << 10, 0, 7, (1 << 20) + 3]  # blocks of 256 KiB, cut unevenly
    pieces = [os.urandom(n) for n in sizes]
    blob = b"".join(pieces)
    buffer = SharedBuffer(len(blob), str(tmp_path))
    try:
        control = buffer.fill_pieces(memoryview(p) for p in pieces)
        assert control.crc32c == crc32c(blob)
        assert read_segment(control, str(tmp_path)) == blob
        with pytest.raises(ValueError, match="pieces of"):
            buffer.fill_pieces([blob[:-1]])
        with pytest.raises(ValueError, match="pieces of more than"):
            buffer.fill_pieces([blob, b"x"])
    finally:
        buffer.close()


def test_a_held_segment_is_seen_in_place_and_kept_from_its_writer(tmp_path: Path) -> None:
    blob = os.urandom(1 << 20)
    buffer = _shared(tmp_path, blob)
    control = buffer.control(crc32c(blob))
    maps = SegmentMaps(root=str(tmp_path))
    with maps.locked(control) as view:
        assert view == blob
        assert not view.readonly  # torch.frombuffer views it without a copy
        assert not buffer.lock_for_writing()  # a reader holds it: the writer waits
    assert buffer.lock_for_writing()  # let go when the reader is done
    with pytest.raises(ShmError, match="being written"), maps.locked(control):
        pass
    buffer.fill(blob[::-1], 0)  # the writer fills it again, under its lock
    buffer.unlock()
    with maps.locked(control) as view:
        assert view == blob[::-1]  # the kept mapping sees the new fill
    buffer.close()


def test_kept_mappings_follow_their_files(tmp_path: Path) -> None:
    """A reader keeps mappings for the next reads; one whose name is gone is let go."""
    maps = SegmentMaps(keep=2, root=str(tmp_path))
    buffers = [_shared(tmp_path, bytes([i]) * 4096) for i in range(3)]
    controls = [b.control(0) for b in buffers]
    with maps.locked(controls[0]) as first:
        address = np.frombuffer(first, dtype=np.uint8).ctypes.data
    with maps.locked(controls[0]) as again:
        assert np.frombuffer(again, dtype=np.uint8).ctypes.data == address  # no new mapping
    buffers[0].close()
    with maps.locked(controls[1]):
        pass
    assert [name for name, _ in maps._maps] == [controls[1].name]  # the removed one went
    for control in controls[1:]:
        with maps.locked(control):
            pass
    assert len(maps._maps) == 2
    with pytest.raises(ShmError, match="cannot be opened"), maps.locked(controls[0]):
        pass
    for buffer in buffers[1:]:
        buffer.close()


@pytest.mark.parametrize("use", ["locked", "reader"])
def test_a_reader_keeps_at_most_keep_mappings_of_segments_still_there(
    tmp_path: Path, use: str
) -> None:
    """A peer naming segment after segment, each left in place, is kept in ``keep`` mappings."""
    maps = SegmentMaps(keep=2, root=str(tmp_path))
    buffers = [_shared(tmp_path, bytes([i]) * 4096) for i in range(5)]
    for buffer in buffers:
        with getattr(maps, use)(buffer.control(0)):
            pass
    assert [name for name, _ in maps._maps] == [b.name for b in buffers[-2:]]
    for buffer in buffers:
        buffer.close()


@pytest.mark.parametrize("use", ["locked", "reader"])
@pytest.mark.parametrize(
    ("control", "reason"),
    [
        (Segment("../etc/passwd", 4, 0), "pattern"),
        (Segment(f"rlfleet-shm-1-{'0' * 32}", 2**64 - 1, 0), "out of range"),
        (Segment(f"rlfleet-shm-1-{'0' * 32}", 0, 0), "out of range"),
    ],
)
def test_a_kept_mapping_is_checked_as_any_segment(
    tmp_path: Path, use: str, control: Segment, reason: str
) -> None:
    maps = SegmentMaps(root=str(tmp_path))
    with pytest.raises(ShmError, match=reason), getattr(maps, use)(control):
        pass


def test_a_reader_copies_from_its_kept_mapping_and_sees_each_new_fill(tmp_path: Path) -> None:
    """``reader``: the bytes ``opened_segment`` reads, from one mapping kept across fills."""
    blob = os.urandom(3 << 20)
    buffer = _shared(tmp_path, blob)
    control = buffer.control(crc32c(blob))
    maps = SegmentMaps(keep=2, root=str(tmp_path))
    into = memoryview(bytearray(len(blob)))
    with maps.reader(control) as read_at:
        read_at(into[: 1 << 20], 0)
        read_at(into[1 << 20 :], 1 << 20)
        with pytest.raises(ShmError, match="overruns"):
            read_at(into[:2], len(blob) - 1)
        with pytest.raises(ShmError, match="overruns"):
            read_at(into[:2], -1)
    assert into == blob
    (mapping,) = maps._maps.values()
    assert buffer.lock_for_writing()  # a reader takes no lock: it checks its own copy
    buffer.fill(blob[::-1], 0)  # the writer fills it again
    buffer.unlock()
    with maps.reader(control) as read_at:
        read_at(into, 0)
    assert into == blob[::-1]
    assert list(maps._maps.values()) == [mapping]  # the same mapping, no page fault
    buffer.close()
    with pytest.raises(ShmError, match="cannot be opened"), maps.reader(control):
        pass


@pytest.mark.parametrize("use", ["locked", "reader"])
def test_a_kept_mapping_of_a_file_grown_in_place_is_mapped_again_at_its_new_size(
    tmp_path: Path, use: str
) -> None:
    """A peer grows its segment (same file) and names it at the new size: read whole."""
    buffer = _shared(tmp_path, bytes(4096))
    maps = SegmentMaps(root=str(tmp_path))
    with getattr(maps, use)(buffer.control(0)):
        pass
    blob = os.urandom(3 * 4096)
    with open(tmp_path / buffer.name, "r+b") as file:
        file.truncate(len(blob))
        file.write(blob)
    control = Segment(buffer.name, len(blob), crc32c(blob))
    if use == "locked":
        with maps.locked(control) as view:
            assert view == blob
    else:
        into = memoryview(bytearray(len(blob)))
        with maps.reader(control) as read_at:
            read_at(into, 0)
        assert into == blob
    assert len(maps._maps) == 1  # the mapping of the old size went
    buffer.close()


def test_a_reader_refuses_a_segment_of_another_size_or_opened_up(tmp_path: Path) -> None:
    blob = os.urandom(8192)
    buffer = _shared(tmp_path, blob)
    maps = SegmentMaps(root=str(tmp_path))
    with (
        pytest.raises(ShmError, match="bytes, not"),
        maps.reader(replace(buffer.control(0), size=4096)),
    ):
        pass
    os.chmod(tmp_path / buffer.name, 0o644)
    with (
        pytest.raises(ShmError, match="readable or writable by others"),
        maps.reader(buffer.control(0)),
    ):
        pass
    buffer.close()


def test_kept_mappings_may_be_used_from_several_threads_at_once(tmp_path: Path) -> None:
    """An actor applies two models' pushes at once: their reads share one ``SegmentMaps``.

    Segments are replaced meanwhile (as a learner's are), so kept mappings go stale and are
    let go by whichever thread reads next.
    """
    buffers = [_shared(tmp_path, bytes([i]) * 4096) for i in range(4)]
    maps = SegmentMaps(keep=2, root=str(tmp_path))
    errors: list[BaseException] = []
    done = threading.Event()

    def read_all(first: int) -> None:
        for i in range(3000):
            buffer = buffers[(first + i) % len(buffers)]
            try:
                into = memoryview(bytearray(1))
                with maps.reader(buffer.control(0)) as read_at:
                    read_at(into, 4095)
                with maps.locked(buffer.control(0)):
                    pass
            except ShmError:  # replaced meanwhile: refused, as it should be
                continue
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)
                return

    def replace_segments() -> None:
        while not done.is_set():
            for index, old in enumerate(list(buffers)):
                buffers[index] = _shared(tmp_path, bytes([index]) * 4096)
                old.close()

    readers = [threading.Thread(target=read_all, args=(n,)) for n in range(4)]
    writer = threading.Thread(target=replace_segments)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often: a race shows within the test
    try:
        writer.start()
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
    finally:
        done.set()
        writer.join()
        sys.setswitchinterval(interval)
    assert errors == []
    for buffer in buffers:
        buffer.close()


def test_a_shared_buffer_never_adopts_a_file_at_its_name(tmp_path, monkeypatch) -> None:
    """A file planted at the next name (any mode) is never written into: O_EXCL."""
    name = shm_module._new_name(str(tmp_path))
    planted = tmp_path / name
    planted.write_bytes(b"planted")
    os.chmod(planted, 0o666)
    monkeypatch.setattr(shm_module, "_new_name", lambda root: name)
    with pytest.raises(FileExistsError):
        SharedBuffer(16, root=str(tmp_path))
    assert planted.read_bytes() == b"planted"


def test_segment_names_are_unguessable(tmp_path) -> None:
    """128 random bits a name: no two of 64 lie within 2**64 of each other (p ~ 2**-53)."""
    tails = sorted(
        int(shm_module._new_name(str(tmp_path)).rsplit("-", 1)[1], 16) for _ in range(64)
    )
    assert all(b - a > 2**64 for a, b in itertools.pairwise(tails))


def test_a_segment_its_group_may_read_or_write_is_refused(tmp_path: Path) -> None:
    """Only the fleet's user may touch a segment: group read or write bits refuse it too."""
    for mode in (0o640, 0o620):
        seg = write_segment(b"abc", str(tmp_path))
        os.chmod(tmp_path / seg.name, mode)
        with pytest.raises(ShmError, match="others"):
            read_segment(seg, str(tmp_path))


def test_a_buffer_resized_by_another_process_is_not_intact(tmp_path: Path) -> None:
    """A segment another process resized is not named or reused (a live mapping risks SIGBUS)."""
    buffer = shm_module.SharedBuffer(4096, root=str(tmp_path))
    assert buffer.intact()
    os.truncate(tmp_path / buffer.name, 8192)
    assert not buffer.intact()
    buffer.close()


def test_a_buffer_opened_up_or_replaced_by_another_process_is_not_intact(tmp_path: Path) -> None:
    """A segment made readable by others, or a new file of its size put at its name, is not
    its writer's any more: never named again."""
    opened = shm_module.SharedBuffer(4096, root=str(tmp_path))
    os.chmod(tmp_path / opened.name, 0o640)
    assert not opened.intact()
    opened.close()
    replaced = shm_module.SharedBuffer(4096, root=str(tmp_path))
    os.unlink(tmp_path / replaced.name)
    fd = os.open(tmp_path / replaced.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    assert not replaced.intact()
    replaced.close()


def test_no_bit_of_a_segment_name_follows_from_another(tmp_path) -> None:
    """128 independent random bits: over 64 names each bit varies, and no two bits always
    agree or always differ (a repeated, counted or shortened token fails; p ~ 2**-50)."""
    tails = [int(shm_module._new_name(str(tmp_path)).rsplit("-", 1)[1], 16) for _ in range(64)]
    bits = [[tail >> bit & 1 for tail in tails] for bit in range(128)]
    assert all(0 < sum(column) < len(tails) for column in bits)
    for first, second in itertools.combinations(bits, 2):
        same = sum(a == b for a, b in zip(first, second, strict=True))
        assert 0 < same < len(tails), "two bits of every name agree (or differ) throughout"


def test_a_host_identity_names_the_shm_mount_it_was_taken_of(tmp_path: Path) -> None:
    """Same kernel and host name but another ``/dev/shm`` (a container of its own) is another
    identity: its segments are not the learner's to read."""
    here = shm_module.host_identity()
    elsewhere = shm_module.host_identity(str(tmp_path))
    assert here
    assert elsewhere
    assert here == shm_module.host_identity()
    assert elsewhere != here
    assert elsewhere.rsplit("/", 1)[0] == here.rsplit("/", 1)[0]  # only the mount differs


#: Run in a process of its own: a segment read when one file descriptor is left, the one
#: its open takes, so the mapping's own (``mmap`` duplicates the descriptor) cannot be had.
_READ_WITH_ONE_FD_LEFT = r"""
import os, resource, sys
from common.shm import SegmentMaps, SharedBuffer, ShmError
root, how = sys.argv[1], sys.argv[2]
buffer = SharedBuffer(4096, root)
control = buffer.fill(bytes(4096), 0)
buffer.unlock()
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    os.close(held.pop())
maps = SegmentMaps(root=root)
try:
    if how == "reader":
        with maps.reader(control) as read_at:
            read_at(memoryview(bytearray(4096)), 0)
    else:
        with maps.locked(control):
            pass
except ShmError as exc:
    print("ShmError:", exc)
"""


@pytest.mark.parametrize("how", ["reader", "locked"])
def test_a_segment_that_cannot_be_mapped_is_refused_as_any_other(tmp_path: Path, how: str) -> None:
    """A reader out of file descriptors (``ulimit -n``: a learner of many actors) used to
    raise a bare OSError from the mapping: the learner's link to that actor stopped "on a
    bug" and the collector raised it; the batch (or push) is now taken as bytes instead.
    """
    code = _READ_WITH_ONE_FD_LEFT
    run = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), how],
        capture_output=True,
        text=True,
        timeout=60,
        env=CHECKOUT_ENV,
    )
    assert run.returncode == 0, run.stderr
    assert "cannot be mapped" in run.stdout
    assert "ulimit -n" in run.stdout  # the limit, and how to raise it
