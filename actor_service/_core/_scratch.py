"""Scratch folders of an actor process, and the sweep of those a killed actor left behind.

A vLLM-engine actor writes files vLLM loads: a built-in model's checkpoint and each LoRA
adapter a push installs. It removes them when it stops; an actor killed with SIGKILL
cannot. Each folder is named after the process that made it
(``rlfleet-scratch-<pid>-<what>-XXXXXXXX`` in the temporary directory), and every new one
first removes those whose process is gone, so a host that restarts killed actors keeps
at most one set per running actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile

from common.leftovers import sweep_leftovers, writer_tag

__all__ = ["scratch_dir", "sweep_scratch"]

log = logging.getLogger("actor_service")

_NAME = re.compile(r"^rlfleet-scratch-(?P<pid>\d+)-(?:(?P<ns>\d+)-)?")


def scratch_dir(what: str) -> str:
    """A new folder for this process's ``what`` (``vllm``, ``vllm-lora``), after a sweep."""
    sweep_scratch()
    root = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=f"rlfleet-scratch-{writer_tag(root)}-{what}-", dir=root)


def sweep_scratch(root: str | None = None) -> list[str]:
    """Remove the scratch folders in ``root`` (the temporary directory) of processes gone.

    Returns:
        The folders removed. Another user's, and a live process's, are left alone.
    """
    root = root or tempfile.gettempdir()
    removed = sweep_leftovers(root, _NAME, _remove_folder)
    if removed:
        log.info("removed %d scratch folders of actors no longer running", len(removed))
    return removed


def _remove_folder(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)
