"""The console scripts' entry points: a stop while the imports run ends in one line.

``rlfleet-train`` and ``rlfleet-grpo`` import torch, tensordict and gRPC before they parse
a flag (seconds; over ten on a loaded machine). A Ctrl-C meanwhile printed a
``KeyboardInterrupt`` traceback through the import machinery, and a SIGTERM (a container
stopped while it started) ended the process by the default action, with nothing said. Here
both end with one line and exit code 130, as a stop during training does. Only the standard
library is imported at module level, so the handlers are in place before anything slow runs
(``python -m apps.ppo`` imports its package first, so this covers the installed scripts).
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "grpo", "train"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _started(module: str, prog: str) -> Callable[[], int] | None:
    """Import ``module`` and return its ``main``; None when SIGINT or SIGTERM came meanwhile.

    SIGTERM is taken like Ctrl-C over the import and given its default action back after it
    (the job's own handling, :func:`apps._job.cli.run_job`, takes over from there).
    """
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        main: Callable[[], int] = importlib.import_module(module).main
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted while starting\n")
        sys.stderr.flush()
        return None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return main


def _run(module: str, prog: str) -> int:
    main = _started(module, prog)
    return EXIT_INTERRUPTED if main is None else main()


def train() -> int:
    """Run ``rlfleet-train`` (:func:`apps.ppo.main`)."""
    return _run("apps.ppo._cli", "rlfleet-train")


def grpo() -> int:
    """Run ``rlfleet-grpo`` (:func:`apps.grpo.main`)."""
    return _run("apps.grpo._cli", "rlfleet-grpo")
