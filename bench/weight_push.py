"""Weight push: one ``update_policy_weights_`` of a ~1M and a ~25M parameter policy to 2 actors.

The policy is the ``"mlp"`` policy for CartPole with two hidden layers of
1000 (1,008,002 float32 parameters, 4 MB) or 5000 (25,040,002, 100 MB).
Systems, all in this one run, each holding 2 workers with that policy:

- rlfleet: ``GrpcCollector.update_policy_weights_(policy)`` to 2 actor
  subprocesses (``--policy mlp --policy-kwargs '{"hidden": [h, h]}'``): encode
  to safetensors straight into a reused shared-memory segment both actors read
  (they share this host), each applying it from there, wait until both applied it;
- rlfleet bytes: the same push to 2 other actors with
  ``WeightPushSettings(shared_memory=False, relay=False)``: the blob streamed in chunks
  over gRPC to each actor;
- rlfleet relayed: the same to 2 other actors with ``WeightPushSettings(shared_memory=False)``:
  the blob streamed once, to the first actor, which forwards it to the second as it
  arrives (the path across hosts; blobs of 8 MiB or more);
- TorchRL ``MultiSyncCollector.update_policy_weights_`` (its default CPU
  scheme, shared memory: the learner's parameters *are* the workers' buffers,
  so a push is a signal plus an ack and moves no bytes);
- TorchRL ``RayCollector.update_policy_weights_`` (needs ``ray``; skipped
  when ``import ray`` fails): weights sent per tensor over a gloo group;
- raw loopback: the same number of bytes sent over plain sockets to 2
  receiver processes at once, until both acked.

A warm-up push per system is not timed (Ray builds its process group on the
first one). Before every timed push one parameter is changed, so no system can
skip an unchanged update.

Targets (25M): rlfleet no slower than RayCollector; rlfleet <= 2x raw loopback.

Usage: ``python -m bench.weight_push [--quick] [--reps 3] [--sizes 1M,25M]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from bench._common import (
    Report,
    base_parser,
    choices,
    init_local_ray,
    parse,
    reps_of,
    set_single_thread,
)
from learner_client import WeightPushSettings

__all__ = ["SIZES", "main"]

#: Hidden widths of the two-layer MLP for each size (CartPole: 4 inputs, 2 actions).
SIZES = {"1M": 1000, "25M": 5000, "tiny": 16}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=1)
    parser.add_argument("--sizes", default=None, help=f"comma-separated, of {sorted(SIZES)}")
    parser.add_argument("--no-ray", action="store_true", help="skip the RayCollector anchor")
    args = parse(parser, argv)
    if args.sizes is None:
        args.sizes = "tiny" if args.quick else "1M,25M"
    args.sizes = choices(parser, "--sizes", args.sizes, SIZES)
    return args


def _perturb(policy: torch.nn.Module) -> None:
    with torch.no_grad():
        next(policy.parameters()).add_(1e-3)


def _timed(push: Callable[[], Any], policy: torch.nn.Module) -> float:
    _perturb(policy)
    start = time.perf_counter()
    push()
    return time.perf_counter() - start


@contextlib.contextmanager
def _ray_collector(env_fn: Any, policy: Any, actors: int) -> Iterator[Any]:
    from torchrl.collectors.distributed import RayCollector

    # Ray is already initialised by _start_ray, so the collector leaves it running.
    coll = RayCollector(
        [env_fn] * actors,
        policy,
        frames_per_batch=32,
        total_frames=-1,
        num_collectors=actors,
        sync=False,
    )
    try:
        yield coll
    finally:
        coll.shutdown()


def _start_ray(args: argparse.Namespace, report: Report) -> bool:
    """Start a local Ray runtime for the RayCollector anchor; False (recorded) when skipped."""
    if args.no_ray or args.quick:
        reason = "disabled by --no-ray" if args.no_ray else "quick mode (Ray starts in ~20 s)"
        report.skip("ray", reason)
        return False
    try:
        import ray
    except ImportError:
        report.skip("ray", "ray not installed")
        return False
    try:
        init_local_ray(
            ray,
            num_cpus=args.actors,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
    except Exception as exc:  # an optional anchor: its failure must not sink the benchmark
        with contextlib.suppress(Exception):
            ray.shutdown()
        report.skip("ray", f"ray failed to start: {type(exc).__name__}: {exc}")
        return False
    return True


def _rlfleet_collector(
    stack: contextlib.ExitStack, actors: int, hidden: tuple[int, ...], push: Any
) -> Any:
    """A collector on a fleet of its own (versions are per collector), pushing as ``push`` says."""
    from bench import _rlfleet

    fleet = stack.enter_context(
        _rlfleet.fleet(actors, num_envs=1, policy_kwargs={"hidden": list(hidden)})
    )
    kwargs = {} if push is None else {"weight_push": push}
    return stack.enter_context(
        _rlfleet.collector(fleet.addresses, sync=False, frames_per_batch=16, **kwargs)
    )


def run_size(size: str, args: argparse.Namespace, report: Report, with_ray: bool) -> None:
    """Measure every system for one policy size, repetitions interleaved."""
    from bench import _torchrl
    from bench._loopback import LoopbackReceivers
    from bench.cartpole import mlp_policy

    hidden = (SIZES[size],) * 2
    policy = mlp_policy(hidden)
    nbytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    report.note(f"{size}: {sum(p.numel() for p in policy.parameters()):,} parameters, {nbytes:,} B")
    env_fn = _torchrl.cartpole_env("gym_sync", 1)
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        coll, bytes_coll, relay_coll = (
            _rlfleet_collector(stack, args.actors, hidden, push)
            for push in (
                None,
                WeightPushSettings(shared_memory=False, relay=False),
                WeightPushSettings(shared_memory=False),
            )
        )
        trl = _torchrl.make_collector(
            True, env_fn, policy, workers=args.actors, frames_per_batch=32
        )
        stack.callback(trl.shutdown)
        rx = stack.enter_context(LoopbackReceivers(args.actors))
        payload = memoryview(bytearray(nbytes))
        systems: dict[str, Callable[[], Any]] = {
            "rlfleet": lambda: coll.update_policy_weights_(policy),
            "rlfleet bytes": lambda: bytes_coll.update_policy_weights_(policy),
            "rlfleet relayed": lambda: relay_coll.update_policy_weights_(policy),
            "torchrl multisync": lambda: trl.update_policy_weights_(policy),
            "raw loopback": lambda: rx.transfer(payload),
        }
        if with_ray:
            ray_coll = stack.enter_context(_ray_collector(env_fn, policy, args.actors))
            systems["torchrl ray"] = lambda: ray_coll.update_policy_weights_(policy)
        for push in systems.values():
            push()  # warm-up: connections, buffers, Ray's process group
        for _ in range(reps_of(args)):
            for name, push in systems.items():
                samples.setdefault(f"{size} {name}", []).append(_timed(push, policy))
    record(size, samples, args, report, with_ray)


def record(
    size: str,
    samples: dict[str, list[float]],
    args: argparse.Namespace,
    report: Report,
    with_ray: bool,
) -> None:
    """Record one size's figures, ratios and (25M, or any size in quick mode) targets."""
    for name, values in samples.items():
        report.figure(name, "s", values)
    raw = report.ratio(f"{size} rlfleet/raw loopback", f"{size} rlfleet", f"{size} raw loopback")
    report.ratio(
        f"{size} rlfleet bytes/raw loopback", f"{size} rlfleet bytes", f"{size} raw loopback"
    )
    relayed = report.ratio(
        f"{size} rlfleet relayed/raw loopback", f"{size} rlfleet relayed", f"{size} raw loopback"
    )
    report.ratio(
        f"{size} rlfleet/torchrl multisync", f"{size} rlfleet", f"{size} torchrl multisync"
    )
    if size == "25M" or args.quick:
        report.target(f"{size}: rlfleet push <= 2x raw loopback", raw, 2.0, higher_is_better=False)
        report.target(
            f"{size}: rlfleet relayed push <= 3x raw loopback",
            relayed,
            3.0,
            higher_is_better=False,
        )
    if with_ray:
        vs_ray = report.ratio(
            f"{size} rlfleet/torchrl ray", f"{size} rlfleet", f"{size} torchrl ray"
        )
        if size == "25M" or args.quick:
            report.target(
                f"{size}: rlfleet push <= RayCollector", vs_ray, 1.0, higher_is_better=False
            )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("weight_push", quick=args.quick)
    with_ray = _start_ray(args, report)
    try:
        for size in args.sizes:
            run_size(size, args, report, with_ray)
    finally:
        if with_ray:
            import ray

            ray.shutdown()
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
