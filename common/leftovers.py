"""The sweep of what a killed process left behind: entries named after their writer's pid.

A process that writes files others must not keep (an actor's scratch folders, a learner's
shared-memory segments) names each after itself (:func:`writer_tag`: its pid and its PID
namespace); a SIGKILL leaves them in place. The next process of this user removes those whose
writer is gone: entries of another user, and of a live process, are left alone.

A pid is a process only in its own namespace: judged from another (another container sharing
``/dev/shm``, as a pod's do) it could be anyone's, or no one's. So a writer also holds, for its
lifetime, an exclusive ``flock`` on a mark in the folder it names entries in
(``rlfleet-live-<pid>-<pid namespace>``, taken by :func:`writer_tag`); the kernel lets go of
it when the process ends, however it ends. An entry of another namespace is removed only when
its writer's mark can be locked; one without a mark (a writer from before marks) is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import threading
import time
from collections.abc import Callable

__all__ = ["pid_namespace", "process_alive", "sweep_leftovers", "writer_tag"]

# The mark a writer holds locked while it lives, in each folder it names entries in.
_MARK = re.compile(r"^rlfleet-live-(?P<pid>\d{1,10})-(?P<ns>\d{1,20})$")
# {folder: (the mark's path, its fd)} of this process; a fork's child drops its copies.
_held: dict[str, tuple[str, int]] = {}
_held_lock = threading.Lock()


def sweep_leftovers(root: str, name: re.Pattern[str], remove: Callable[[str], None]) -> list[str]:
    """Remove this user's entries of ``root`` whose writer process is gone.

    Args:
        root: The folder to sweep; a folder that cannot be listed is left as it is.
        name: Matches the entries to sweep; its group ``pid`` is the writer's pid, and its
            group ``ns``, when the entry has one, the writer's PID namespace.
        remove: Removes one entry, given its path.

    Returns:
        The paths removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    writers = _Writers(root, names)
    try:
        for entry in names:
            match = name.match(entry)
            path = os.path.join(root, entry)
            if match is None or not writers.gone(match["pid"], match["ns"]) or not _ours(path):
                continue
            remove(path)
            removed.append(path)
        writers.remove_marks()  # after their entries: a new writer of that pid makes a new one
    finally:
        writers.release()
    return removed


class _Writers:
    """The writers of one folder's entries, judged gone or not (the marks of the gone held).

    In this PID namespace by pid; in another by its mark, locked here when its writer is
    gone and held until :meth:`release`, so no new writer of that pid takes it meanwhile.
    """

    def __init__(self, root: str, names: list[str]) -> None:
        self.here = pid_namespace()
        self.gone_marks: dict[tuple[str, str], tuple[str, int | None]] = {}
        for entry in names:
            match = _MARK.match(entry)
            path = os.path.join(root, entry)
            if match is None or not _ours(path):
                continue
            key = (match["pid"], match["ns"])
            if int(match["ns"]) != self.here:
                fd = _locked_if_free(path)
                if fd is not None:
                    self.gone_marks[key] = (path, fd)
            elif not process_alive(int(match["pid"])):
                self.gone_marks[key] = (path, None)

    def gone(self, pid: str, ns: str | None) -> bool:
        """Whether the writer ``pid`` of namespace ``ns`` (None: before namespaces) is gone."""
        if ns is None or int(ns) == self.here:
            return not process_alive(int(pid))
        return (pid, ns) in self.gone_marks  # no mark, or a held one: not ours to judge

    def remove_marks(self) -> None:
        for path, _fd in self.gone_marks.values():
            with contextlib.suppress(OSError):
                os.unlink(path)

    def release(self) -> None:
        for _path, fd in self.gone_marks.values():
            if fd is not None:
                os.close(fd)


def _locked_if_free(path: str) -> int | None:
    """``path`` opened and locked, or None when its writer holds it (or it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def writer_tag(root: str) -> str:
    """``<pid>-<pid namespace>``: what names an entry in ``root`` after this process.

    Takes, once per folder, the mark that tells sweepers of other PID namespaces that this
    writer lives (held until the process ends); where none can be made, entries go without.
    """
    pid, ns = os.getpid(), pid_namespace()
    with _held_lock:
        if root not in _held:
            path = os.path.join(root, f"rlfleet-live-{pid}-{ns}")
            fd = _take_mark(path)
            if fd is not None:
                _held[root] = (path, fd)
    return f"{pid}-{ns}"


def _take_mark(path: str) -> int | None:
    """Open and lock ``path`` for this process's lifetime; None when it cannot be done."""
    for _attempt in range(50):  # a sweeper may hold a gone writer's mark of this pid a moment
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd  # still the file the path names (no sweeper unlinked it meanwhile)
        except OSError:
            pass
        os.close(fd)
        time.sleep(0.01)
    return None


def _drop_marks() -> None:
    """Remove this process's marks as it exits (a SIGKILL leaves them to the sweep)."""
    with _held_lock:
        for path, fd in _held.values():
            with contextlib.suppress(OSError):
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(path)
            os.close(fd)
        _held.clear()


def _forget_marks_in_child() -> None:
    """In a fork's child: close the copies of the marks (the parent's stay held).

    The lock is made anew: another thread may have held the old one at the fork.
    """
    global _held_lock
    _held_lock = threading.Lock()
    for _path, fd in _held.values():
        os.close(fd)
    _held.clear()


atexit.register(_drop_marks)
os.register_at_fork(after_in_child=_forget_marks_in_child)


def pid_namespace() -> int:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``); 0 when unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's, or no pid at all, counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # not ours to judge
    return True


def _ours(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False
