"""A TorchRL env on an rlfleet fleet vs TorchRL's ``MultiSyncCollector``: frames/s and CPU/frame.

Workload (the same factories on both sides): ``TransformedEnv(GymEnv("CartPole-v1"),
Compose(RewardSum(), StepCounter(), DoubleToFloat()))`` (:func:`make_env`) and a
``ProbabilisticActor`` over a 64x64 tanh MLP with a one-hot categorical
(:func:`make_policy`). Systems, interleaved in one run:

- rlfleet: 2 ``--kind torchrl`` actors (``LocalFleet`` subprocesses), each a
  ``SerialEnv`` of 8 envs, under a sync ``GrpcCollector`` (1024 frames per actor batch);
- TorchRL: ``MultiSyncCollector`` with 2 workers, each a ``SerialEnv`` of the same 8
  envs, same policy, 2048 frames per batch. With ``--actors 1`` it is TorchRL's
  ``Collector`` in the benchmark's own process (what a one-env script builds), and its
  CPU per frame is that process's.

Figures: the median frames/s of each, their ratio (target >= 1.0x, goal 1.3x) and each
side's CPU per frame (``/proc`` user+system time of one actor or one TorchRL worker
and its children, over a window, per frame it collected).

Usage: ``python -m bench.torchrl_envs [--quick] [--reps 3] [--window 4]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.modules import OneHotCategorical, ProbabilisticActor

from bench._common import Report, base_parser, parse, reps_of, set_single_thread, time_batches
from bench._rss import cpu_seconds

__all__ = ["main", "make_env", "make_policy"]

ENV_FACTORY = "bench.torchrl_envs:make_env"
POLICY_FACTORY = "bench.torchrl_envs:make_policy"


def make_env() -> EnvBase:
    """CartPole-v1 with the transforms TorchRL's scripts add (the benchmark's env factory)."""
    transforms = Compose(RewardSum(), StepCounter(), DoubleToFloat())
    return TransformedEnv(GymEnv("CartPole-v1"), transforms)


def make_policy(env: EnvBase, seed: int = 0) -> ProbabilisticActor:
    """A ``ProbabilisticActor``: 64x64 tanh MLP → logits → one-hot categorical action."""
    observations, actions = env.observation_spec["observation"].shape[-1], 2
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = nn.Sequential(
            nn.Linear(observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
            nn.Linear(64, actions),
        )  # fmt: skip
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.full_action_spec["action"],
        return_log_prob=True,
    )


def _window(
    iterator: Iterator[Any], processes: int, cpu: Callable[[], float], seconds: float
) -> tuple[float, float]:
    """Frames/s over a window and CPU seconds per frame of one of the ``processes``.

    ``cpu`` gives the CPU seconds those processes used so far, in all.
    """
    next(iterator)  # a warm-up batch, untimed
    before, start = cpu(), time.perf_counter()
    fps, _ = time_batches(iterator, seconds=seconds, warmup=0)
    # Frames one process collected: over the window as it ran (it ends on a whole batch).
    frames_each = fps * (time.perf_counter() - start) / processes
    return fps, (cpu() - before) / processes / frames_each


def _cpu_of(pids: Callable[[], list[int]]) -> tuple[int, Callable[[], float]]:
    """How many processes ``pids`` names, and their CPU seconds (with their children)."""
    return len(pids()), lambda: sum(cpu_seconds(p) for p in pids())


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure both systems, interleaved; record figures, the ratio and CPU per frame."""
    from bench import _rlfleet

    fpb = args.frames_per_actor * args.actors
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(
            _rlfleet.LocalFleet(
                args.actors, num_envs=args.num_envs, policy=POLICY_FACTORY, kind="torchrl",
                env_factory=ENV_FACTORY, seed=1, extra_args=["--torch-threads", "1"],
                start_timeout=180.0,
            )
        )  # fmt: skip
        ours = stack.enter_context(
            _rlfleet.collector(fleet.addresses, sync=True, frames_per_batch=fpb)
        )
        theirs, their_cpu = _anchor(args, fpb)
        stack.callback(theirs.shutdown)
        systems: dict[str, tuple[Iterator[Any], tuple[int, Callable[[], float]]]] = {
            "rlfleet": (iter(ours), _cpu_of(lambda: fleet.pids)),
            "torchrl": (iter(theirs), their_cpu),
        }
        for _ in range(reps_of(args)):
            for name, (iterator, (processes, cpu_so_far)) in systems.items():
                fps, cpu = _window(iterator, processes, cpu_so_far, args.window)
                samples.setdefault(f"{name} frames/s", []).append(fps)
                samples.setdefault(f"{name} CPU us/frame", []).append(cpu * 1e6)
    for name, values in samples.items():
        report.figure(name, "us/frame" if "CPU" in name else "frames/s", values)
    ratio = report.ratio("rlfleet/torchrl", "rlfleet frames/s", "torchrl frames/s")
    anchor = "Collector" if args.actors == 1 else "MultiSyncCollector"
    report.target(f"TorchRL env, sync: rlfleet >= 1.0x TorchRL's {anchor}", ratio, 1.0)
    report.target("TorchRL env, sync: rlfleet >= 1.3x (goal)", ratio, 1.3)
    report.ratio("CPU/frame rlfleet/torchrl", "rlfleet CPU us/frame", "torchrl CPU us/frame")


def _anchor(args: argparse.Namespace, fpb: int) -> tuple[Any, tuple[int, Callable[[], float]]]:
    """TorchRL's collector for the same envs and policy, and its processes' CPU (``_cpu_of``).

    One actor: TorchRL's ``Collector`` in this process, as a one-env script runs it; more:
    a ``MultiSyncCollector`` with a worker process per actor.
    """
    policy = make_policy(make_env())
    if args.actors == 1:
        single = Collector(
            SerialEnv(args.num_envs, make_env), policy, frames_per_batch=fpb, total_frames=-1
        )
        return single, (1, time.process_time)  # this process alone, not the fleet's actors
    pool = functools.partial(SerialEnv, args.num_envs, make_env)  # pickles by reference
    multi = MultiSyncCollector(
        [pool] * args.actors, policy, frames_per_batch=fpb,
        total_frames=-1, num_sub_threads=1, num_threads=1,
    )  # fmt: skip
    return multi, _cpu_of(lambda: [p.pid for p in multi.procs])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-actor", type=int, default=1024, help="frames per actor batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    args = parse(parser, argv)
    if args.window is None:
        args.window = 0.5 if args.quick else 4.0
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 16 * args.num_envs)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("torchrl_envs", quick=args.quick)
    report.note(
        f"{args.actors} actors/workers x SerialEnv({args.num_envs}), {args.frames_per_actor} "
        f"frames per actor batch, {args.window:g} s windows"
    )
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
