"""Sync round: what one round of a sync collector costs beyond collecting its frames.

Workload: CartPole-v1, the ``"mlp"`` policy, 2 actors / workers, sync. Two shapes, each
on a fleet and a collector of its own, measured in turn:

- ``tiny``: 1 env and 1 frame per actor a round, so the round is nearly all overhead:
  milliseconds a round, and CPU milliseconds a round of the learner process and of each
  actor (``/proc/<pid>/stat``), against TorchRL's ``MultiSyncCollector`` with the same
  layout (each worker a ``GymEnv`` of one CartPole);
- ``cartpole``: ``--num-envs`` (8) envs and ``--frames-per-actor`` (1024) frames per actor,
  against the in-process limit: one process stepping the same envs and policy into
  preallocated buffers (``bench._inprocess``). ``round / in-process`` is how much longer a
  fleet round takes than one actor's share of it in-process (1.0: the round costs nothing).

Target: the tiny round no slower than TorchRL's. The rest locates the sync overhead that
keeps ``bench.cartpole``'s sync fleet short of its ceiling (two in-process loops at once).

Usage: ``python -m bench.sync_round [--quick] [--reps 3] [--window 4]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread
from bench._rss import cpu_seconds

__all__ = ["main"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-actor", type=int, default=1024, help="frames per actor batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    args = parse(parser, argv)
    if args.window is None:
        args.window = 0.5 if args.quick else 4.0
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 8 * args.num_envs)
    return args


def _time_rounds(rounds: Iterator[Any], seconds: float, pids: Sequence[int]) -> dict[str, float]:
    """Milliseconds a round, and CPU milliseconds a round of this process and of ``pids``."""
    for _ in range(3):  # warm-up
        next(rounds)
    actors0, own0 = [cpu_seconds(pid) for pid in pids], time.process_time()
    start, count = time.perf_counter(), 0
    while count < 2 or time.perf_counter() - start < seconds:
        next(rounds)
        count += 1
    elapsed = time.perf_counter() - start
    actors = [cpu_seconds(pid) - before for pid, before in zip(pids, actors0, strict=True)]
    per_round = 1000.0 / count
    out = {"round": elapsed * per_round, "learner cpu": (time.process_time() - own0) * per_round}
    if actors:
        out["actor cpu"] = sum(actors) / len(actors) * per_round
    return out


def rlfleet_rounds(args: argparse.Namespace, num_envs: int, frames: int) -> dict[str, float]:
    """A sync ``GrpcCollector`` over a fresh fleet: see :func:`_time_rounds`."""
    from bench import _rlfleet

    with _rlfleet.fleet(args.actors, num_envs=num_envs, policy="mlp") as fleet:
        fpb = frames * args.actors
        with _rlfleet.collector(fleet.addresses, sync=True, frames_per_batch=fpb) as coll:
            return _time_rounds(iter(coll), args.window, fleet.pids)


def torchrl_rounds(args: argparse.Namespace, policy: Any) -> dict[str, float]:
    """TorchRL's ``MultiSyncCollector``, one CartPole and one frame per worker a round."""
    from bench import _torchrl

    env_fn = _torchrl.cartpole_env("gym", 1)
    coll = _torchrl.make_collector(
        True, env_fn, policy, workers=args.actors, frames_per_batch=args.actors
    )
    try:
        return _time_rounds(iter(coll), args.window, [])
    finally:
        coll.shutdown()


def in_process_round_ms(args: argparse.Namespace) -> float:
    """Milliseconds one process takes to collect one actor's share of a round."""
    import gymnasium

    from bench._inprocess import in_process_fps

    fps = in_process_fps(
        lambda: gymnasium.make("CartPole-v1"),
        num_envs=args.num_envs,
        steps_per_batch=max(1, args.frames_per_actor // args.num_envs),
        seconds=args.window,
    )
    return 1000.0 * args.frames_per_actor / fps


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure both shapes, repetition by repetition, and record figures and ratios."""
    from bench.cartpole import mlp_policy

    policy = mlp_policy()
    samples: dict[str, list[float]] = {}
    for _ in range(reps_of(args)):
        for name, value in rlfleet_rounds(args, 1, 1).items():
            samples.setdefault(f"rlfleet tiny {name}", []).append(value)
        samples.setdefault("torchrl tiny round", []).append(torchrl_rounds(args, policy)["round"])
        for name, value in rlfleet_rounds(args, args.num_envs, args.frames_per_actor).items():
            samples.setdefault(f"rlfleet cartpole {name}", []).append(value)
        samples.setdefault("in-process cartpole round", []).append(in_process_round_ms(args))
    for name, values in samples.items():
        report.figure(name, "ms", values)
    tiny = report.ratio("rlfleet/torchrl tiny round", "rlfleet tiny round", "torchrl tiny round")
    report.target(
        "a sync round's fixed cost within TorchRL's (tiny round)", tiny, 1.0, higher_is_better=False
    )
    report.ratio(
        "rlfleet cartpole round/in-process", "rlfleet cartpole round", "in-process cartpole round"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("sync_round", quick=args.quick)
    report.note(
        f"{args.actors} actors/workers, sync; tiny: 1 env, 1 frame per actor a round; cartpole: "
        f"{args.num_envs} envs, {args.frames_per_actor} frames per actor a round; "
        f"{args.window:g} s windows"
    )
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
