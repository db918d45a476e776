"""Start-up: seconds from nothing running to the first batch in hand.

Workload: CartPole-v1, the ``"mlp"`` policy, 2 actors x 8 envs, 1024 frames
per actor batch. Each repetition starts everything afresh (new processes)
and stops it afterwards (not timed):

- rlfleet: ``LocalFleet`` start (actor subprocesses importing torch, building
  env pools and policies, serving) + ``GrpcCollector`` construction
  (Describe on every actor) + the first batch, sync and async;
- TorchRL: ``MultiSyncCollector`` / ``MultiAsyncCollector`` construction
  (spawned workers importing torch and torchrl, building envs) + the first
  batch, with the env layout given by ``--torchrl-layout`` (default
  ``gym_sync``, the quickest to start of the in-worker layouts).

Imports this process needs anyway (torch, torchrl, grpc) are done before timing.

Targets: rlfleet's time to first batch below TorchRL's (sync vs sync), at most 0.8x
TorchRL's (async vs async).

Usage: ``python -m bench.startup [--quick] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread

__all__ = ["main"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-actor", type=int, default=1024, help="frames per actor batch")
    parser.add_argument("--torchrl-layout", default="gym_sync", help="TorchRL env layout")
    args = parse(parser, argv)
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 4 * args.num_envs)
    return args


def rlfleet_first_batch(args: argparse.Namespace, sync: bool) -> float:
    """Seconds to start a fleet, open a collector and receive its first batch."""
    from bench import _rlfleet

    fpb = args.frames_per_actor * (args.actors if sync else 1)
    start = time.perf_counter()
    with _rlfleet.fleet(args.actors, num_envs=args.num_envs, policy="mlp") as fleet:
        coll = _rlfleet.collector(fleet.addresses, sync=sync, frames_per_batch=fpb)
        try:
            next(iter(coll))
            elapsed = time.perf_counter() - start
        finally:
            coll.shutdown()
    return elapsed


def torchrl_first_batch(args: argparse.Namespace, sync: bool, policy: Any) -> float:
    """Seconds to build a TorchRL multi-process collector and receive its first batch."""
    from bench import _torchrl

    fpb = args.frames_per_actor * (args.actors if sync else 1)
    env_fn = _torchrl.cartpole_env(args.torchrl_layout, args.num_envs)
    start = time.perf_counter()
    coll = _torchrl.make_collector(sync, env_fn, policy, workers=args.actors, frames_per_batch=fpb)
    try:
        next(iter(coll))
        return time.perf_counter() - start
    finally:
        coll.shutdown()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    import torchrl.collectors  # noqa: F401

    import learner_client  # noqa: F401  (imports are not part of start-up)
    from bench.cartpole import mlp_policy

    report = Report("startup", quick=args.quick)
    report.note(
        f"{args.actors} actors/workers x {args.num_envs} envs, {args.frames_per_actor} frames per "
        f"actor batch, TorchRL layout {args.torchrl_layout}"
    )
    policy = mlp_policy()
    samples: dict[str, list[float]] = {}
    # Quick mode checks the harness only: sync alone halves its cost.
    modes = (True,) if args.quick else (True, False)
    for _ in range(reps_of(args)):
        for sync in modes:
            mode = "sync" if sync else "async"
            samples.setdefault(f"rlfleet {mode}", []).append(rlfleet_first_batch(args, sync))
            samples.setdefault(f"torchrl {mode}", []).append(
                torchrl_first_batch(args, sync, policy)
            )
    for name, values in samples.items():
        report.figure(name, "s", values)
    for mode in ("sync", "async")[: len(modes)]:
        ratio = report.ratio(f"rlfleet/torchrl {mode}", f"rlfleet {mode}", f"torchrl {mode}")
        bound = 0.8 if mode == "async" else 1.0
        report.target(
            f"{mode}: rlfleet first batch within {bound:g}x TorchRL's time",
            ratio,
            bound,
            higher_is_better=False,
        )
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
