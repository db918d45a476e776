"""The sweep of what a killed process left behind: entries named after their writer's pid.

A process that writes files others must not keep (an actor's scratch folders, a learner's
shared-memory segments) names each after itself; a SIGKILL leaves them in place. The next
process of this user removes those whose writer is gone: entries of another user, and of a
live process, are left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

__all__ = ["process_alive", "sweep_leftovers"]


def sweep_leftovers(root: str, name: re.Pattern[str], remove: Callable[[str], None]) -> list[str]:
    """Remove this user's entries of ``root`` whose writer process is gone.

    Args:
        root: The folder to sweep; a folder that cannot be listed is left as it is.
        name: Matches the entries to sweep; its first group is the writer's pid.
        remove: Removes one entry, given its path.

    Returns:
        The paths removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for entry in names:
        match = name.match(entry)
        path = os.path.join(root, entry)
        if match is None or process_alive(int(match.group(1))) or not _ours(path):
            continue
        remove(path)
        removed.append(path)
    return removed


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
