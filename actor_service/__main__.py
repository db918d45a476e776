"""``python -m actor_service`` and the ``rlfleet-actor`` command: run one actor server."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from actor_service._cli._main import main as _cli_main

__all__ = ["main"]


def _stopped_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGTERM/SIGINT before the server's own handlers: nothing runs yet, so exit 0 now.

    The imports (torch, gRPC) take seconds; a container stopped meanwhile would otherwise
    end by the default handler (exit 143, or a KeyboardInterrupt traceback).
    """
    sys.stderr.write(f"rlfleet-actor: stopped by {signal.Signals(signum).name} before serving\n")
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    """Parse flags and ``RLFLEET_*`` variables, serve until SIGTERM/SIGINT, exit with the code."""
    for stop in (signal.SIGTERM, signal.SIGINT):  # replaced by the server's once it starts
        signal.signal(stop, _stopped_while_starting)
    code = _cli_main()
    from actor_service._serve._server import exit_now  # imported by _cli_main already

    exit_now(code)  # within the grace period: no interpreter finalization after the stop


if __name__ == "__main__":
    main()
