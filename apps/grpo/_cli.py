"""The ``rlfleet-grpo`` entry point: parse the flags, train, report, map failures to exit codes.

Exit codes: 0 when training finished (the target accuracy or a budget was reached),
1 with a one-line message on an rlfleet error (an actor that cannot be started or
reached, a rejected weight push...), an OS error, or a missing package (transformers,
or torchrl for ``--loss torchrl``), 2 on bad flags (argparse), 130 on Ctrl-C. SIGTERM
is handled like Ctrl-C, so the local fleet is shut down in order. ``--nproc-per-node N``
(outside torchrun) runs the same command as N data-parallel ranks under
``torch.distributed.run`` (:mod:`apps._job.ranks`); it exits 1 when a rank failed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from apps._job.cli import run_job
from apps._job.ranks import launch_ranks, under_torchrun
from apps.grpo._loop import train
from apps.grpo._settings import PROG, parse_args
from common.errors import RlfleetError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rlfleet-grpo``.

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.

    Returns:
        The process exit code.
    """
    settings = parse_args(argv)
    if settings.nproc_per_node > 1 and not under_torchrun():
        args = sys.argv[1:] if argv is None else argv
        return launch_ranks(PROG, "apps.grpo", settings.nproc_per_node, args)
    return run_job(PROG, settings, train, (RlfleetError, OSError, ImportError))
