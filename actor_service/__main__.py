"""``python -m actor_service`` and the ``rlfleet-actor`` command: run one actor server."""

from __future__ import annotations

import sys

from actor_service._cli import main as _cli_main

__all__ = ["main"]


def main() -> None:
    """Parse flags and ``RLFLEET_*`` variables, serve until SIGTERM/SIGINT, exit with the code."""
    sys.exit(_cli_main())


if __name__ == "__main__":
    main()
