"""Large observations: moving uint8 ``(4, 84, 84)`` frames, against TorchRL and loopback TCP.

Workload: :func:`bench.envs.make_fresh_pixel_env` (Atari-sized frame stacks
whose every frame is fresh random data, trivial dynamics, so moving bytes
dominates), the user-style policy ``bench.policies:pixel_policy`` (a
``TensorDictModule``: scale, flatten, a small MLP), 2 actors x 4 envs, sync
batches of 256 frames per actor (the yielded batch holds ``observation`` and
``("next", "observation")`` for every frame, about 14.5 MB per actor batch).
Systems:

- rlfleet: ``GrpcCollector`` (sync) over actors started with
  ``--env-factory bench.envs:make_fresh_pixel_env --policy bench.policies:pixel_policy``;
  the actors share the learner's host, so batches travel through shared memory; "rlfleet
  bytes" is the same with ``shared_memory_batches=False`` (every batch over gRPC), and
  "rlfleet prefetch=2" the same as "rlfleet" with ``prefetch=2`` (each actor collects up to
  two batches ahead of the learner's request, as the opt-in prefetching mode does: the
  actors never wait on the round trip); each window on a collector of its own, one after
  the other;
- TorchRL: ``MultiSyncCollector``, 2 workers, each a ``GymWrapper`` around a
  gymnasium ``SyncVectorEnv`` of 4 such envs, the same policy module;
- loopback TCP: one process sending 256 MB to another over a plain socket;
- the single-process limit: one process stepping ``SyncVectorEnv`` of all 8
  envs, the same policy's network on the observation tensor each step, into
  preallocated buffers (no transport);
- the fleet's ceiling on this machine: one such loop of 4 envs per actor, all running
  at once in their own processes, with no transport and no learner (``parallel
  in-process loops``): the most 2 actors x 4 envs can reach here.

Payload MB/s counts the bytes of every tensor in the yielded batches (10**6
bytes per MB), the same measure on both sides; "wire bytes per frame" is what
rlfleet's actors send per frame (each observation once: folded batches).

Targets: rlfleet frames/s >= 2x TorchRL and >= 1.0x the single-process limit. The
prefetching mode is reported beside them, without a target: the headline compares like with
like (TorchRL's sync workers, too, collect only once asked).

Usage: ``python -m bench.large_obs [--quick] [--reps 3] [--window 4]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread, time_batches

__all__ = ["main"]

ENV_FACTORY = "bench.envs:make_fresh_pixel_env"
POLICY = "bench.policies:pixel_policy"
# The fleet's systems: the collector options of each.
FLEET_MODES: dict[str, dict[str, Any]] = {
    "rlfleet": {},
    "rlfleet bytes": {"shared_memory_batches": False},
    "rlfleet prefetch=2": {"prefetch": 2},
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=4)
    parser.add_argument("--frames-per-actor", type=int, default=256, help="frames per actor batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument("--tcp-mb", type=int, default=None, help="MB per loopback TCP transfer")
    args = parse(parser, argv)
    if args.window is None:
        args.window = 0.5 if args.quick else 4.0
    if args.tcp_mb is None:
        args.tcp_mb = 32 if args.quick else 256
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 8 * args.num_envs)
    return args


def payload_bytes(batch: Any) -> int:
    """Bytes of every tensor in a batch."""
    return int(batch.bytes())


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure rlfleet, TorchRL and loopback TCP, interleaved, and record the ratios."""
    from bench import _rlfleet, _torchrl
    from bench.envs import make_fresh_pixel_env
    from bench.policies import pixel_policy

    fpb = args.frames_per_actor * args.actors
    samples: dict[str, list[float]] = {}
    env = make_fresh_pixel_env()
    policy = pixel_policy(env.observation_space, env.action_space)
    with _rlfleet.fleet(
        args.actors, env_factory=ENV_FACTORY, num_envs=args.num_envs, policy=POLICY
    ) as fleet:
        trl = _torchrl.make_collector(
            True,
            _torchrl.pixel_env(args.num_envs, fresh=True),
            policy,
            workers=args.actors,
            frames_per_batch=fpb,
        )
        try:
            trl_iter = iter(trl)
            for _ in range(reps_of(args)):
                _fleet_windows(args, fleet.addresses, samples)
                _anchor_windows(args, trl_iter, policy, samples)
        finally:
            trl.shutdown()
    _record(report, samples)


def _fleet_windows(
    args: argparse.Namespace, addresses: Sequence[str], samples: dict[str, list[float]]
) -> None:
    """One window of each of the fleet's modes, each on a collector of its own."""
    from bench import _rlfleet
    from bench.learner_cost import wire_bytes

    fpb = args.frames_per_actor * args.actors
    for name, options in FLEET_MODES.items():
        with _rlfleet.collector(addresses, sync=True, frames_per_batch=fpb, **options) as coll:
            rl_iter = iter(coll)
            first = next(rl_iter)
            samples["wire bytes per frame"] = [wire_bytes(first, True) / first.numel()]
            samples["payload bytes per frame"] = [payload_bytes(first) / first.numel()]
            fps, bps = time_batches(rl_iter, seconds=args.window, warmup=2, extra=payload_bytes)
        samples.setdefault(f"{name} frames", []).append(fps)
        samples.setdefault(f"{name} payload", []).append(bps / 1e6)


def _anchor_windows(
    args: argparse.Namespace, trl_iter: Any, policy: Any, samples: dict[str, list[float]]
) -> None:
    """One window of TorchRL, loopback TCP, the single-process limit and the two loops."""
    from bench._inprocess import in_process_fps, parallel_in_process_fps
    from bench._loopback import loopback_bandwidth
    from bench.envs import make_fresh_pixel_env

    fps, bps = time_batches(trl_iter, seconds=args.window, warmup=1, extra=payload_bytes)
    samples.setdefault("torchrl frames", []).append(fps)
    samples.setdefault("torchrl payload", []).append(bps / 1e6)
    samples.setdefault("loopback tcp", []).extend(loopback_bandwidth(args.tcp_mb * 10**6, 1))
    steps = args.frames_per_actor // args.num_envs
    samples.setdefault("in-process limit frames", []).append(
        in_process_fps(
            make_fresh_pixel_env,
            num_envs=args.actors * args.num_envs,
            steps_per_batch=steps,
            seconds=args.window,
            policy=policy,
        )
    )
    samples.setdefault("parallel in-process loops frames", []).append(
        parallel_in_process_fps(
            args.actors,
            num_envs=args.num_envs,
            steps_per_batch=steps,
            seconds=args.window,
            env_factory=ENV_FACTORY,
            policy=POLICY,
        )
    )


def _record(report: Report, samples: dict[str, list[float]]) -> None:
    """Record the figures, ratios and targets."""
    for name, values in samples.items():
        unit = "bytes" if "per frame" in name else "frames/s" if name.endswith("frames") else "MB/s"
        report.figure(name, unit, values)
    report.ratio("rlfleet payload/loopback tcp", "rlfleet payload", "loopback tcp")
    report.ratio("shared memory/bytes frames", "rlfleet frames", "rlfleet bytes frames")
    speedup = report.ratio("rlfleet/torchrl frames", "rlfleet frames", "torchrl frames")
    report.target("rlfleet frames/s >= 2x TorchRL", speedup, 2.0)
    report.ratio("torchrl payload/loopback tcp", "torchrl payload", "loopback tcp")
    limit = report.ratio(
        "rlfleet/in-process limit frames", "rlfleet frames", "in-process limit frames"
    )
    report.target("rlfleet frames/s >= 1.0x the single-process limit", limit, 1.0)
    report.ratio(
        "rlfleet prefetch=2/in-process limit frames",
        "rlfleet prefetch=2 frames",
        "in-process limit frames",
    )
    report.ratio(
        "parallel loops/in-process limit frames",
        "parallel in-process loops frames",
        "in-process limit frames",
    )
    for name in ("rlfleet", "rlfleet prefetch=2"):
        report.ratio(
            f"{name}/parallel loops frames", f"{name} frames", "parallel in-process loops frames"
        )
    report.ratio("wire/payload bytes", "wire bytes per frame", "payload bytes per frame")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("large_obs", quick=args.quick)
    report.note(
        f"{args.actors} actors/workers x {args.num_envs} envs, {args.frames_per_actor} frames per "
        f"actor batch, sync, {args.window:g} s windows, {args.tcp_mb} MB loopback transfers"
    )
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
