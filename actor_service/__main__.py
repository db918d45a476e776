"""``python -m actor_service`` and the ``rlfleet-actor`` command: run one actor server."""

from __future__ import annotations

from actor_service._cli._main import main as _cli_main

__all__ = ["main"]


def main() -> None:
    """Parse flags and ``RLFLEET_*`` variables, serve until SIGTERM/SIGINT, exit with the code."""
    code = _cli_main()
    from actor_service._serve._server import exit_now  # imported by _cli_main already

    exit_now(code)  # within the grace period: no interpreter finalization after the stop


if __name__ == "__main__":
    main()
