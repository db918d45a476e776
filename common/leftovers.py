"""The sweep of what a killed process left behind: entries named after their writer's pid.

A process that writes files others must not keep (an actor's scratch folders, a learner's
shared-memory segments) names each after itself (:func:`writer_tag`: its pid and its PID
namespace); a SIGKILL leaves them in place. The next process of this user removes those whose
writer is gone: entries of another user, and of a live process, are left alone. So are those
of another PID namespace (another container sharing ``/dev/shm``, as a pod's do): a pid is a
process only in its own namespace, and judged here it could be anyone's, or no one's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

__all__ = ["pid_namespace", "process_alive", "sweep_leftovers", "writer_tag"]


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
    here = pid_namespace()
    for entry in names:
        match = name.match(entry)
        path = os.path.join(root, entry)
        if match is None or (match["ns"] is not None and int(match["ns"]) != here):
            continue  # not ours to sweep, or a pid of another namespace
        if process_alive(int(match["pid"])) or not _ours(path):
            continue
        remove(path)
        removed.append(path)
    return removed


def writer_tag() -> str:
    """``<pid>-<pid namespace>``: what names an entry after this process."""
    return f"{os.getpid()}-{pid_namespace()}"


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
