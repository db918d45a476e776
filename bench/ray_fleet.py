"""The same collection on TorchRL's ``RayCollector`` and on ``RayFleet`` + ``GrpcCollector``.

One local Ray head (``--actors`` CPUs, no dashboard) in this run; both systems place
``--actors`` Ray actors on it, one CPU each, every actor holding ``--num-envs``
CartPole-v1 envs and the same user-style policy (``bench.policies:sequential_policy``,
hidden ``--hidden``):

- TorchRL: ``RayCollector([env_fn] * actors, policy, num_collectors=actors,
  remote_configs={"num_cpus": 1}, sync=...)`` with its default ``Collector`` per actor;
- rlfleet: ``RayFleet(actors, remote_configs={"num_cpus": 1})`` (an actor server in each
  Ray actor, batches over gRPC) and ``GrpcCollector(fleet, sync=...)``.

Per repetition, interleaved: frames/s over a ``--window`` of sync batches, then of async
batches, then the time of one ``update_policy_weights_(policy)`` (one parameter changed
before each, so no push can be skipped; a warm-up push first). Ratios are pair by pair.
``--hidden 1000,1000`` makes the push a 1M-parameter one.

Usage: ``python -m bench.ray_fleet [--quick] [--reps 3] [--actors 2] [--num-envs 8]`` (needs
``ray``: run it in ``.venv-ray``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium
import torch

from bench._common import (
    Report,
    base_parser,
    init_local_ray,
    parse,
    reps_of,
    set_single_thread,
    time_batches,
)

__all__ = ["main"]

#: Frames per actor in one batch (sync batches hold ``actors`` times as many).
FRAMES_PER_ACTOR = 256
#: A frame budget no run reaches.
ENDLESS = 10**12


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--window", type=float, default=None, help="seconds per window (5)")
    parser.add_argument("--hidden", default="64,64", help="the policy's hidden widths")
    args = parse(parser, argv)
    if args.window is None:
        args.window = 1.0 if args.quick else 5.0
    args.hidden = [int(width) for width in args.hidden.split(",")]
    return args


def _policy(hidden: Sequence[int]) -> Any:
    from bench.policies import sequential_policy

    env = gymnasium.make("CartPole-v1")
    return sequential_policy(env.observation_space, env.action_space, hidden=hidden)


def _perturb(policy: torch.nn.Module) -> None:
    with torch.no_grad():
        next(policy.parameters()).add_(1e-3)


def _push_seconds(collector: Any, policy: torch.nn.Module) -> float:
    _perturb(policy)
    start = time.perf_counter()
    collector.update_policy_weights_(policy)
    return time.perf_counter() - start


@contextlib.contextmanager
def _torchrl(args: argparse.Namespace, policy: Any, sync: bool) -> Iterator[Any]:
    from torchrl.collectors.distributed import RayCollector

    from bench._torchrl import cartpole_env

    fpb = FRAMES_PER_ACTOR * (args.actors if sync else 1)
    collector = RayCollector(
        [cartpole_env("gym_sync", args.num_envs)] * args.actors,
        policy,
        frames_per_batch=fpb,
        total_frames=ENDLESS,  # RayCollector yields nothing at -1 (it compares collected < -1)
        num_collectors=args.actors,
        remote_configs={"num_cpus": 1},
        sync=sync,
    )
    try:
        yield collector
    finally:
        collector.shutdown()


@contextlib.contextmanager
def _rlfleet(args: argparse.Namespace, sync: bool) -> Iterator[Any]:
    from learner_client import GrpcCollector, RayFleet

    fleet = RayFleet(
        args.actors,
        "CartPole-v1",
        num_envs=args.num_envs,
        policy="bench.policies:sequential_policy",
        policy_kwargs={"hidden": args.hidden},
        seed=1,
        extra_args=["--torch-threads", "1"],
        remote_configs={"num_cpus": 1},
    )
    fpb = FRAMES_PER_ACTOR * (args.actors if sync else 1)
    with GrpcCollector(
        fleet, frames_per_batch=fpb, total_frames=-1, sync=sync, batch_timeout=120.0
    ) as collector:
        yield collector


def _repetition(args: argparse.Namespace, policy: Any, samples: dict[str, list[float]]) -> None:
    for system in ("torchrl ray", "rlfleet ray"):
        for sync in (True, False):
            mode = "sync" if sync else "async"
            with (
                _torchrl(args, policy, sync)
                if system == "torchrl ray"
                else _rlfleet(args, sync) as collector
            ):
                fps, _ = time_batches(iter(collector), seconds=args.window, warmup=2)
                samples.setdefault(f"{system} {mode}", []).append(fps)
                if sync:
                    collector.update_policy_weights_(policy)  # warm-up
                    pushed = _push_seconds(collector, policy)
                    samples.setdefault(f"{system} push", []).append(pushed)
            print(f"{system} {mode}: {fps:,.0f} frames/s", flush=True)


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure both systems, repetitions interleaved; record figures and ratios."""
    policy = _policy(args.hidden)
    params = sum(p.numel() for p in policy.parameters())
    report.note(f"policy: sequential_policy hidden={args.hidden}, {params:,} parameters")
    report.note(f"{args.actors} Ray actors x {args.num_envs} envs, {FRAMES_PER_ACTOR} frames/actor")
    samples: dict[str, list[float]] = {}
    for _ in range(reps_of(args)):
        _repetition(args, policy, samples)
    for name, values in samples.items():
        report.figure(name, "s" if name.endswith("push") else "frames/s", values)
    for mode in ("sync", "async"):
        report.ratio(f"rlfleet/torchrl ray {mode}", f"rlfleet ray {mode}", f"torchrl ray {mode}")
    push = report.ratio("rlfleet/torchrl ray push time", "rlfleet ray push", "torchrl ray push")
    report.target("push no slower than RayCollector's", push, 1.0, higher_is_better=False)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    try:
        import ray
    except ImportError:
        raise SystemExit(
            "bench.ray_fleet needs Ray: .venv/bin/pip install ray, or run it with "
            ".venv-ray/bin/python (make test-ray builds it)"
        ) from None
    set_single_thread()
    report = Report("ray_fleet", quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as temp_dir:
        init_local_ray(
            ray,
            num_cpus=args.actors,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _temp_dir=temp_dir,
        )
        try:
            run(args, report)
        finally:
            ray.shutdown()
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
