"""The ``rlfleet-grpo`` entry point: parse the flags, train, report, map failures to exit codes.

Exit codes: 0 when training finished (the target accuracy or a budget was reached),
1 with a one-line message on an rlfleet error (an actor that cannot be started or
reached, a rejected weight push...), an OS error, or a missing package (transformers,
or torchrl for ``--loss torchrl``), 2 on bad flags (argparse), 130 on Ctrl-C. SIGTERM
is handled like Ctrl-C, so the local fleet is shut down in order.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from common.errors import RlfleetError
from learner_client.grpo._loop import train
from learner_client.grpo._settings import parse_args

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rlfleet-grpo``.

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.

    Returns:
        The process exit code.
    """
    settings = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = train(settings)
    except KeyboardInterrupt:
        print("rlfleet-grpo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (RlfleetError, OSError, ImportError) as exc:
        print(f"rlfleet-grpo: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary.to_text())
    return EXIT_OK
