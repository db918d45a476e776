"""Scratch folders of an actor process, and the sweep of those a killed actor left behind.

A vLLM-engine actor writes files vLLM loads: a built-in model's checkpoint and each LoRA
adapter a push installs. It removes them when it stops; an actor killed with SIGKILL
cannot. Each folder is named after the process that made it
(``rlfleet-scratch-<pid>-<what>-XXXXXXXX`` in the temporary directory), and every new one
first removes those whose process is gone, so a host that restarts killed actors keeps
at most one set per running actor.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

__all__ = ["scratch_dir", "sweep_scratch"]

log = logging.getLogger("actor_service")

_NAME = re.compile(r"^rlfleet-scratch-(\d+)-")


def scratch_dir(what: str) -> str:
    """A new folder for this process's ``what`` (``vllm``, ``vllm-lora``), after a sweep."""
    sweep_scratch()
    return tempfile.mkdtemp(prefix=f"rlfleet-scratch-{os.getpid()}-{what}-")


def sweep_scratch(root: str | None = None) -> list[str]:
    """Remove the scratch folders in ``root`` (the temporary directory) of processes gone.

    Returns:
        The folders removed. Another user's, and a live process's, are left alone.
    """
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        path = os.path.join(root, name)
        if match is None or _alive(int(match.group(1))) or not _ours(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        log.info("removed %d scratch folders of actors no longer running", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or no pid at all): not ours to judge
    return True


def _ours(path: str) -> bool:
    try:
        return os.path.isdir(path) and os.stat(path).st_uid == os.getuid()
    except OSError:
        return False
