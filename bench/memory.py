"""Memory over a long run: learner and actor RSS must not grow with the frames collected.

Workload: CartPole-v1, the ``"mlp"`` policy, 2 actors x 8 envs, an async
``GrpcCollector`` pulling 1024-frame batches for ``--seconds``, with a weight
push (``update_policy_weights_``) every ``--push-every`` batches, as a training
loop does. The RSS of the learner (this process) and of every actor is read
from ``/proc`` about every ``--sample-every`` seconds, beside the frame count.

The first quarter of the run is warm-up (allocator pools, gRPC buffers,
caches filling) and is left out. Over the rest, per process: ``growth`` is the
median of the last 5 samples minus the median of the first 5, and ``slope`` the
least-squares MB per million frames.

Target: growth <= 5 MB for the learner and for every actor (flat within noise).

Usage: ``python -m bench.memory [--quick] [--seconds 90]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench._common import Report, base_parser, median, parse, set_single_thread, slope

__all__ = ["main"]

GROWTH_LIMIT_MB = 5.0
_EDGE = 5


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-batch", type=int, default=1024, help="frames per batch")
    parser.add_argument("--seconds", type=float, default=None, help="length of the run")
    parser.add_argument("--sample-every", type=float, default=None, help="seconds between samples")
    parser.add_argument("--push-every", type=int, default=10, help="batches between weight pushes")
    args = parse(parser, argv)
    if args.reps is not None:
        parser.error("--reps: the memory run is one long run; set its length with --seconds")
    if args.push_every < 1:
        parser.error(f"--push-every must be >= 1 batch, got {args.push_every}")
    if args.seconds is None:
        args.seconds = 4.0 if args.quick else 90.0
    if args.sample_every is None:
        args.sample_every = 0.2 if args.quick else 1.0
    return args


def collect_samples(args: argparse.Namespace) -> tuple[list[float], dict[str, list[float]]]:
    """Run the workload; returns the frame count at each sample and RSS (MB) per process."""
    from bench import _rlfleet
    from bench._rss import descendants, rss_mb
    from bench.cartpole import mlp_policy

    policy = mlp_policy()
    frames_at: list[float] = []
    rss: dict[str, list[float]] = {}
    with _rlfleet.fleet(args.actors, num_envs=args.num_envs, policy="mlp") as fleet:
        processes = {"learner": os.getpid()}
        processes.update({f"actor {i}": pid for i, pid in enumerate(fleet.pids)})
        with _rlfleet.collector(
            fleet.addresses, sync=False, frames_per_batch=args.frames_per_batch
        ) as coll:
            frames = 0
            start = next_sample = time.perf_counter()
            for batches, batch in enumerate(coll, start=1):
                frames += batch.numel()
                if batches % args.push_every == 0:
                    coll.update_policy_weights_(policy)
                now = time.perf_counter()
                if now >= next_sample:
                    next_sample = now + args.sample_every
                    frames_at.append(frames)
                    for name, pid in processes.items():
                        own = rss_mb(pid)
                        if math.isnan(own):  # its samples would end: no growth to judge
                            raise RuntimeError(f"{name} (pid {pid}) exited during the run")
                        # An actor's env subprocesses (async backend) count towards it; one
                        # that exits between the listing and the read counts nothing.
                        children = [rss_mb(c) for c in descendants(pid) if name != "learner"]
                        own += sum(c for c in children if not math.isnan(c))
                        rss.setdefault(name, []).append(own)
                if now - start >= args.seconds:
                    break
    return frames_at, rss


def analyse(frames_at: list[float], rss: dict[str, list[float]], report: Report) -> None:
    """Record first/last/growth/slope per process and the flatness targets."""
    keep = len(frames_at) // 4
    xs = [f / 1e6 for f in frames_at[keep:]]
    report.figure("frames collected", "frames", [frames_at[-1]] if frames_at else [])
    actor_growth: list[float] = []
    for name, values in rss.items():
        kept = values[keep:]
        edge = max(1, min(_EDGE, len(kept) // 3))
        first, last = median(kept[:edge]), median(kept[-edge:])
        report.figure(f"{name} rss first", "MB", [first])
        report.figure(f"{name} rss last", "MB", [last])
        report.figure(f"{name} rss growth", "MB", [last - first])
        report.figure(f"{name} rss slope", "MB/Mframes", [slope(xs, kept)])
        if name != "learner":
            actor_growth.append(last - first)
    report.target(
        "learner RSS growth <= 5 MB",
        report.figures["learner rss growth"]["median"],
        GROWTH_LIMIT_MB,
        higher_is_better=False,
    )
    report.target(
        "actor RSS growth <= 5 MB (worst actor)",
        max(actor_growth, default=math.inf),  # no actor sampled: not met
        GROWTH_LIMIT_MB,
        higher_is_better=False,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("memory", quick=args.quick)
    report.note(
        f"{args.actors} actors x {args.num_envs} envs, async, {args.frames_per_batch} frames per "
        f"batch, {args.seconds:g} s, a weight push every {args.push_every} batches, samples every "
        f"{args.sample_every:g} s, first quarter left out"
    )
    frames_at, rss = collect_samples(args)
    analyse(frames_at, rss, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
