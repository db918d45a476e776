"""Pixel env actors with a Nature-CNN policy on CUDA, and a learner receiving onto CUDA.

Workload: :func:`bench.envs.make_pixel_env` (``(4, 84, 84)`` uint8 frame stacks,
trivial dynamics) and the user-style ``bench.policies:nature_cnn_policy``,
``--actors`` (run with 4) actors x ``--num-envs`` (8) envs, sync batches of 32 steps per
env. Systems, in this one run:

- CUDA fleet: actors started with ``--device cuda``; the learner's
  ``GrpcCollector(device="cuda")`` delivers every batch into device memory;
- CPU fleet: the same actors with ``--device cpu`` (``--torch-threads`` each);
- the in-process limit: one process stepping a ``SyncVectorEnv`` of all
  ``actors x num_envs`` envs, the same network on CUDA (observations through
  pinned memory, one copy each way per step), no transport.

Learner delivery: payload bytes of the batches delivered on CUDA per second
of the learner process's CPU time (GB/s per core).

Targets: CUDA fleet >= 1.5x the CPU fleet and >= 0.8x the in-process limit;
learner delivery >= 2 GB/s per core.

Usage: ``python -m bench.gpu_pixels [--quick] [--actors 4] [--reps 2] [--window 8]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch

from bench._common import Report, base_parser, parse, reps_of, time_batches

__all__ = ["main"]

STEPS = 32


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--torch-threads", type=int, default=3, help="per actor")
    parser.add_argument("--window", type=float, default=None, help="seconds (default 8, quick 2)")
    args = parse(parser, argv)
    args.window = args.window or (2.0 if args.quick else 8.0)
    return args


def _payload(batch: Any) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values(True, True))


def fleet_fps(args: argparse.Namespace, device: str, report: Report) -> list[float]:
    """Frames/s of a fleet with the policy on ``device`` (learner on CUDA when available)."""
    from learner_client import GrpcCollector, LocalFleet

    learner_device = "cuda" if torch.cuda.is_available() else None
    extra = ["--torch-threads", str(args.torch_threads), "--device", device]
    extra += ["--env-factory", "bench.envs:make_pixel_env"]
    samples = []
    with (
        LocalFleet(
            args.actors,
            "pixels",
            num_envs=args.num_envs,
            policy="bench.policies:nature_cnn_policy",
            seed=0,
            extra_args=extra,
            start_timeout=300.0,
        ) as fleet,
        GrpcCollector(
            fleet.addresses,
            frames_per_batch=args.actors * args.num_envs * STEPS,
            sync=True,
            device=learner_device,
            connect_timeout=120.0,
            batch_timeout=120.0,
        ) as collector,
    ):
        iterator = iter(collector)
        for _ in range(reps_of(args)):
            cpu = time.process_time()
            wall = time.perf_counter()
            fps, payload = time_batches(iterator, seconds=args.window, warmup=2, extra=_payload)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            samples.append(fps)
            if learner_device is not None and device == "cuda":
                report.figure(
                    f"learner delivery on cuda (rep {len(samples)})",
                    "GB/s per core",
                    [payload * wall / max(cpu, 1e-9) / 1e9],
                )
    return samples


def in_process_fps(args: argparse.Namespace, seconds: float) -> float:
    """The limit: all envs in one process, the CNN on CUDA, one copy each way per step."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from bench.envs import make_pixel_env
    from bench.policies import nature_cnn_policy

    n = args.actors * args.num_envs
    env = SyncVectorEnv([make_pixel_env] * n, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    spaces = env.single_observation_space, env.single_action_space
    network = nature_cnn_policy(*spaces).module.cuda().eval()
    obs, _ = env.reset(seed=0)
    pinned = torch.empty(obs.shape, dtype=torch.uint8, pin_memory=True)
    frames, start = 0, None
    with torch.no_grad():
        while True:
            pinned.copy_(torch.from_numpy(obs))
            scores = network(pinned.to("cuda", non_blocking=True))
            action = scores.argmax(-1).cpu().numpy()
            obs, *_ = env.step(action)
            if start is None:
                start, frames = time.perf_counter(), 0
                continue
            frames += n
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                env.close()
                return frames / elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    report = Report("gpu_pixels", quick=args.quick)
    if not torch.cuda.is_available():
        report.skip("gpu_pixels", "no CUDA device: the CPU fleet alone, as a smoke run")
        report.figure("cpu fleet", "frames/s", fleet_fps(args, "cpu", report))
        return report.emit()
    report.note(f"device: {torch.cuda.get_device_name()}")
    report.figure("cuda fleet", "frames/s", fleet_fps(args, "cuda", report))
    report.figure("cpu fleet", "frames/s", fleet_fps(args, "cpu", report))
    report.figure(
        "in-process limit (cuda)",
        "frames/s",
        [in_process_fps(args, args.window) for _ in range(reps_of(args))],
    )
    vs_cpu = report.ratio("cuda fleet/cpu fleet", "cuda fleet", "cpu fleet")
    vs_limit = report.ratio("cuda fleet/in-process", "cuda fleet", "in-process limit (cuda)")
    report.target("cuda fleet >= 1.5x cpu fleet", vs_cpu, 1.5)
    report.target("cuda fleet >= 0.8x in-process limit", vs_limit, 0.8)
    deliveries = [v["median"] for k, v in report.figures.items() if k.startswith("learner")]
    if deliveries:
        report.target("learner delivery >= 2 GB/s per core", min(deliveries), 2.0)
    return report.emit()


if __name__ == "__main__":
    main()
