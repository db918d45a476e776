"""Pushes striped over parallel streams: one push to one actor over 1, 2 and 4 streams.

The model is the CartPole ``mlp`` policy with eight hidden layers of 1800 (seven 13 MB
matrices: a 91 MB push whose keys split evenly; ``--quick``: four layers of 1500, 27 MB).
Systems, all in this one run, each on one actor of its own (an actor subprocess on this
host, pushed as a remote one: ``WeightPushSettings(shared_memory=False, relay=False)``):

- ``1 stream``: the push as one ``PushWeights`` stream (the default);
- ``2 streams``, ``4 streams``: ``WeightPushSettings(streams=K)``: the push cut by keys
  into up to K parts, each a stream on a TCP connection of its own, the version applied
  whole when the last part arrived (``learner_client._stripes``);
- ``raw loopback``: the same number of bytes over one plain socket to one receiver process.

A warm-up push per system is not timed; before every timed push one parameter changes.
Repetitions interleave the systems; ratios are pair by pair.

What it shows: on loopback the learner's and the actor's CPU bound a push, not one
connection, so parallel streams pay only as far as the parts' receiving, checking and
copying overlap on the cores there are (the case they are for, a fast link one connection
cannot fill, needs a 25-100 Gbit NIC). Target: ``4 streams`` no slower than ``1 stream``.

Usage: ``python -m bench.push_streams [--quick] [--reps 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread
from bench.weight_push import _rlfleet_collector, _timed
from learner_client import WeightPushSettings

__all__ = ["STREAMS", "main"]

#: The stream counts compared.
STREAMS = (1, 2, 4)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=1)
    args = parse(parser, argv)
    args.hidden = (1500,) * 4 if args.quick else (1800,) * 8
    return args


def measure(args: argparse.Namespace, report: Report) -> None:
    """Every system on its own actor, repetitions interleaved."""
    from bench._loopback import LoopbackReceivers
    from bench.cartpole import mlp_policy

    policy = mlp_policy(args.hidden)
    nbytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    report.note(f"{sum(p.numel() for p in policy.parameters()):,} parameters, {nbytes:,} B")
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        collectors = {
            _name(k): _rlfleet_collector(
                stack,
                1,
                args.hidden,
                WeightPushSettings(shared_memory=False, relay=False, streams=k),
            )
            for k in STREAMS
        }
        rx = stack.enter_context(LoopbackReceivers(1))
        payload = memoryview(bytearray(nbytes))
        systems: dict[str, Callable[[], Any]] = {
            name: (lambda c=coll: c.update_policy_weights_(policy))
            for name, coll in collectors.items()
        }
        systems["raw loopback"] = lambda: rx.transfer(payload)
        for push in systems.values():
            push()  # warm-up: connections, receive buffers
        for rep in range(reps_of(args)):
            order = list(systems) if rep % 2 == 0 else list(reversed(systems))
            for name in order:
                samples.setdefault(name, []).append(_timed(systems[name], policy))
        for name, coll in collectors.items():
            report.note(f"{name}: {coll.stats()['striped_pushes']} pushes striped")
    for name, values in samples.items():
        report.figure(name, "s", values)
    report.ratio("1 stream/raw loopback", "1 stream", "raw loopback")
    report.ratio("4 streams/raw loopback", "4 streams", "raw loopback")
    vs_one = {k: report.ratio(f"{_name(k)}/1 stream", _name(k), "1 stream") for k in STREAMS[1:]}
    report.target("4 streams <= 1x 1 stream", vs_one[4], 1.0, higher_is_better=False)


def _name(streams: int) -> str:
    return "1 stream" if streams == 1 else f"{streams} streams"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("push_streams", quick=args.quick)
    measure(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
