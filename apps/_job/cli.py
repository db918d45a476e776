"""The entry point of a reference learner: train, print the summary, map failures to exit codes.

Exit codes: 0 when training finished, 1 with a one-line message on one of the
errors the job names (an rlfleet error, an OS error...), 2 on bad flags
(argparse, before :func:`run_job` is reached), 130 on Ctrl-C. SIGTERM is handled
like Ctrl-C, so a container stop also shuts a local fleet down in order.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol, TextIO, TypeVar

import numpy as np
import torch

from apps._job.entry import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK
from common.config import check_token

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "FleetMismatchError",
    "RankLostError",
    "SignalsHeld",
    "StoppedAtOnce",
    "learner_token",
    "run_job",
    "seed_everything",
]

S = TypeVar("S")


class FleetMismatchError(Exception):
    """The fleet or the env given does not fit the job.

    Two actors with one worker_id, actors on another env, an env whose spaces the job's
    policy cannot take: :func:`run_job` ends on it with a one-line message and exit code 1.
    """


class RankLostError(RuntimeError):
    """A collective with the other learner ranks failed: one of them failed or left.

    That rank prints its own message (the launcher names it); this one ends with a one-line
    message and exit code 1 through :func:`run_job`, not gloo's traceback.
    """


def learner_token() -> str | None:
    """The job's ``$RLFLEET_TOKEN`` (None: unset or empty), held to the actors' token rule.

    A job reads its token from the environment only (a flag would show in ``ps`` and in
    ``summary.json``); the local fleet it starts inherits it, and its collector sends it.

    Raises:
        FleetMismatchError: Naming the variable, for a token no header carries (a file's
            trailing newline), before any actor is dialled or started with it.
    """
    try:
        return check_token(os.environ.get("RLFLEET_TOKEN") or None)
    except ValueError as exc:
        raise FleetMismatchError(f"RLFLEET_TOKEN: {exc}") from None


class Summary(Protocol):
    """What a job's train function returns: something with a one-line text form."""

    def to_text(self) -> str: ...


class StoppedAtOnce(BaseException):
    """A second SIGINT or SIGTERM came while an update was held: stop where it is.

    Not a KeyboardInterrupt, so no loop takes it for the first signal and writes outputs
    of an update half made; :func:`run_job` ends on it with exit code 130.
    """


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class SignalsHeld:
    """SIGINT and SIGTERM wait out a :meth:`held` block, and raise KeyboardInterrupt after it.

    A loop holds them over an update and its push, so Ctrl-C (or a pod's eviction) stops it
    between two updates, with weights the actors took, which it can then save; outside a held
    block (waiting for a batch) they raise at once. A second signal in the block raises
    :class:`StoppedAtOnce` (the usual second Ctrl-C: no outputs). Use as a context manager
    in the main thread; the previous handlers come back at its end.

    Args:
        prog: The program name that prefixes the line said when a signal is held.
    """

    def __init__(self, prog: str) -> None:
        self._prog = prog
        self._holding = False
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalsHeld:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @contextlib.contextmanager
    def held(self, *, raise_after: bool = True) -> Iterator[None]:
        """Hold the signals over the block; one that came raises KeyboardInterrupt after it.

        Args:
            raise_after: False when the block reads :attr:`pending` itself (the ranks agree
                on it): one that came after its last read is let go.
        """
        self._holding, self._pending = True, None
        try:
            yield
        finally:
            self._holding = False
        if self._pending is not None and raise_after:
            raise KeyboardInterrupt(f"signal {self._pending}")

    @property
    def pending(self) -> int | None:
        """The signal the current :meth:`held` block holds, if one came."""
        return self._pending

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._holding:
            raise KeyboardInterrupt(f"signal {signum}")
        if self._pending is not None:
            raise StoppedAtOnce(f"signal {signum} after signal {self._pending}")
        self._pending = signum
        say(
            f"{self._prog}: stopping after this update (signal again to stop at once, "
            "without outputs)",
            sys.stderr,
        )


def run_job(
    prog: str,
    settings: S,
    train: Callable[[S], Summary],
    errors: tuple[type[BaseException], ...],
) -> int:
    """Run ``train(settings)`` with SIGTERM as Ctrl-C and print its summary.

    Args:
        prog: The program name that prefixes the messages (``rlfleet-train``).
        settings: The parsed settings.
        train: The job's loop.
        errors: What ends the run with a one-line message and exit code 1 (with
            :class:`FleetMismatchError` and :class:`RankLostError`).

    Returns:
        The process exit code.
    """
    caught: tuple[type[BaseException], ...] = (*errors, FleetMismatchError, RankLostError)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = train(settings)
    except KeyboardInterrupt as exc:
        saved = f" ({exc})" if str(exc).startswith("outputs") else ""
        say(f"{prog}: interrupted{saved}", sys.stderr)
        return EXIT_INTERRUPTED
    except StoppedAtOnce:
        say(f"{prog}: stopped at once by a second signal (no outputs written)", sys.stderr)
        return EXIT_INTERRUPTED
    except caught as exc:
        say(f"{prog}: error: {exc}", sys.stderr)
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)
    say(summary.to_text(), sys.stdout)
    return EXIT_OK


def say(line: str, stream: TextIO) -> None:
    """Write ``line`` and its newline in one write.

    Ranks sharing a terminal (``python -u`` under torchrun) otherwise interleave their lines,
    one's text before the other's newline.
    """
    stream.write(line + "\n")
    stream.flush()


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators; one intra-op thread."""
    # Small models gain nothing from intra-op threads, and the actors need the cores.
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
