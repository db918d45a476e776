"""A sharded push from 2 learner ranks against one rank pushing the whole model, same actors.

The model is the CartPole ``mlp`` policy with five hidden layers of 5000 (100M float32
parameters, 400 MB: four 25M matrices, so the keys split into two halves of 200 MB each;
``--quick``: layers of 16). Every learner rank is its own process (``bench._rank``) with
its own collector on the same 2 actors, holding only its tensors:

- ``one rank``: one process pushes every key, a whole push (``version=v``);
- ``two ranks``: two processes each push half of the keys as their part of one version
  (``version=v, part=(rank, 2)``); the actors apply it whole when both parts arrived.

A push is timed from the moment the parent tells the rank(s) to go to the moment the last
of them returned (``time.monotonic`` is one clock for every process on the machine): for
two ranks, until every actor holds the version, whole. Its pause is the longest generation
pause any actor reported (for two ranks, the completing swap). Repetitions interleave the
two systems, alternating which goes first; the ratio is taken pair by pair.

Target: ``two ranks`` <= 1x ``one rank``: splitting a push across ranks costs no time (on a
machine with a core per process and NIC per rank it should save about half; on 2 shared
cores, four busy processes share them, see bench/RESULTS.md).

Usage: ``python -m bench.sharded_push [--quick] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread

__all__ = ["main"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = 5


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=2)
    parser.add_argument("--hidden", type=int, default=None, help="width (default 5000; quick 16)")
    args = parse(parser, argv)
    if args.hidden is None:
        args.hidden = 16 if args.quick else 5000
    return args


class _Rank:
    """A running ``bench._rank`` process and its stdin/stdout lines."""

    def __init__(self, actors: Sequence[str], hidden: int, rank: int, world: int) -> None:
        argv = [sys.executable, "-m", "bench._rank", "--actors", ",".join(actors)]
        argv += ["--hidden", str(hidden), "--layers", str(LAYERS)]
        argv += ["--rank", str(rank), "--world", str(world)]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )

    def line(self) -> str:
        assert self.process.stdout is not None
        text = self.process.stdout.readline()
        if not text:
            raise RuntimeError(f"rank process exited with {self.process.wait(60)}")
        return text.strip()

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send("quit")
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def _ranks(actors: Sequence[str], hidden: int, world: int) -> Iterator[list[_Rank]]:
    ranks = [_Rank(actors, hidden, rank, world) for rank in range(world)]
    try:
        for rank in ranks:
            if rank.line() != "ready":
                raise RuntimeError("a rank process did not get ready")
        yield ranks
    finally:
        for rank in ranks:
            rank.close()


def _push(ranks: list[_Rank], version: int) -> tuple[float, float, str]:
    """Seconds until every rank returned, the longest pause, the ranks' outcomes."""
    start = time.monotonic()
    for rank in ranks:
        rank.send(f"go {version}")
    done = [rank.line().split() for rank in ranks]
    ends, pauses, outcomes = zip(*((float(d[1]), float(d[2]), d[3]) for d in done), strict=True)
    return max(ends) - start, max(pauses), ",".join(outcomes)


def measure(args: argparse.Namespace, report: Report) -> None:
    """Both systems on one fleet, repetitions interleaved."""
    from bench import _rlfleet

    params = sum(s.numel() for s in _shapes(args.hidden).values())
    report.note(f"{params:,} float32 parameters ({4 * params / 1e6:.0f} MB), {args.actors} actors")
    samples: dict[str, list[tuple[float, float]]] = {"one rank": [], "two ranks": []}
    hidden = [args.hidden] * LAYERS
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(
            _rlfleet.fleet(args.actors, num_envs=args.num_envs, policy_kwargs={"hidden": hidden})
        )
        one = stack.enter_context(_ranks(fleet.addresses, args.hidden, 1))
        two = stack.enter_context(_ranks(fleet.addresses, args.hidden, 2))
        systems = {"one rank": one, "two ranks": two}
        version = 1
        _push(one, version)  # warm-up: connections, receive buffers
        for rep in range(reps_of(args)):
            order = list(systems) if rep % 2 == 0 else list(reversed(systems))
            for name in order:
                version += 1
                seconds, pause, outcomes = _push(systems[name], version)
                samples[name].append((seconds, pause))
                if name == "two ranks" and "completed" not in outcomes:
                    raise RuntimeError(f"version {version} did not complete: {outcomes}")
    for name, rows in samples.items():
        report.figure(name, "s", [s for s, _ in rows])
        report.figure(f"{name} pause", "s", [p for _, p in rows])
    ratio = report.ratio("two ranks/one rank", "two ranks", "one rank")
    report.ratio("two ranks pause/one rank pause", "two ranks pause", "one rank pause")
    report.target("two ranks <= 1x one rank (whole model)", ratio, 1.0, higher_is_better=False)


def _shapes(hidden: int) -> dict[str, Any]:
    from bench._rank import shapes

    return shapes(hidden, LAYERS)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("sharded_push", quick=args.quick)
    measure(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
