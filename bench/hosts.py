"""Across hosts: collection and pushes over shaped links, against what each link can carry.

Hosts are network namespaces on a bridge (``tests/hosts/testbed.py``): a learner
host and actor hosts, each link shaped by ``tc tbf`` on both ends of its veth; the
learner's link carries every actor's traffic (the fleet's shared uplink) and is
shaped at the same rate as the actors' links. Actors are real ``python -m
actor_service`` processes started inside their hosts; the learner is
:mod:`bench._hosts_learner` inside the learner host, driven by JSON lines, so link
rates change between measurements while every process lives on. In one run:

- collection from ``--actors`` actors (2) at each of ``--rates`` (10gbit, 1gbit,
  100mbit; repetitions interleave the rates): CartPole-v1 with the user-style policy
  ``bench.policies:sequential_policy`` (8 envs per actor) sync (1024 frames per actor
  per batch) and async (1024 per batch), and fresh random pixel frames
  (``bench.envs:make_fresh_pixel_env``, ``bench.policies:pixel_policy``, 4 envs per
  actor) sync (128 frames per actor per batch) and async (128 per batch); by
  ``--workloads``, also ``pixels sync prefetch=2`` (each actor collects ahead). Wire bytes
  are what the learner's ``eth0`` received in the timed window (headers included),
  and "link fraction" is (wire bytes per frame x frames/s) / link rate. A workload is
  *link-bound* at a rate when that link could carry fewer frames/s than the workload
  made at the highest rate (the CPU's figure); only there is the target >= 0.9 of the
  link set, elsewhere the row is noted as CPU-bound;
- collection through ``--delays`` (5 and 25 ms) added each way by
  :mod:`bench._delay_proxy` (a TCP proxy in the learner host: netem is absent), CartPole
  sync with the user policy, ``prefetch`` 1 and 2, at ``--latency-rate`` (1gbit), each
  against the same prefetch through the proxy at 0 ms (target >= 0.9 with prefetch=2);
- ``update_policy_weights_`` of the ``"mlp"`` CartPole policy with two hidden layers
  of ``--hidden`` (5000: 25,040,002 float32 parameters, 100 MB) over ``--push-rate``
  (1gbit) links to 1, 2, 4 and 8 actors on their own hosts behind the learner's link of
  the same rate, each actor sent the bytes (direct: against the link's floor, ``actors x
  bytes / rate``) and relayed down a chain of the actors (sent once), with the share of the
  machine's CPU busy during each push ("cpu busy/all": every host shares the same cores).
  Targets: <= 1.3x the floor for one actor; relayed to 4 actors <= 1.3x, to 8 <= 1.5x the
  push to one.

Needs root (network namespaces); without it the run records one skip and exits 0.
Usage: ``python -m bench.hosts [--quick] [--reps 3] [--window 4] [--rates 1gbit,100mbit]
[--measure links,latency,push]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, base_parser, median, parse, reps_of

__all__ = ["DEFAULT_WORKLOADS", "WORKLOADS", "main"]

#: Relayed push time to N actors, at most this many times the push to one actor.
_RELAY_TARGETS = {4: 1.3, 8: 1.5}

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_HOSTS_TESTS = _ROOT / "tests" / "hosts"
CARTPOLE = ["--env", "CartPole-v1", "--policy", "bench.policies:sequential_policy"]
PIXELS = ["--env-factory", "bench.envs:make_fresh_pixel_env", "--num-envs", "4"]
PIXELS += ["--policy", "bench.policies:pixel_policy"]
#: name -> (actor group, sync, frames per actor per batch (full, quick), prefetch).
WORKLOADS = {
    "cartpole sync": ("cartpole", True, (1024, 32), None),
    "cartpole async": ("cartpole", False, (1024, 32), None),
    "pixels sync": ("pixels", True, (128, 16), None),
    "pixels async": ("pixels", False, (128, 16), None),
    "pixels sync prefetch=2": ("pixels", True, (128, 16), 2),
}
#: What runs unless ``--workloads`` says otherwise.
DEFAULT_WORKLOADS = ["cartpole sync", "cartpole async", "pixels sync", "pixels async"]
_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9}


def rate_bits(rate: str) -> float:
    """Bits per second of a ``tc`` rate such as ``"100mbit"``."""
    value = rate.strip().lower().removesuffix("bit")
    if value and value[-1] in _UNITS:
        return float(value[:-1]) * _UNITS[value[-1]]
    return float(value)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--rates", default=None, help="link rates, comma-separated (tc syntax)")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument("--delays", default=None, help="added ms each way, comma-separated")
    parser.add_argument("--prefetch", default=None, help="prefetch values under latency")
    parser.add_argument("--latency-rate", default=None, help="link rate of the latency runs")
    parser.add_argument("--push-rate", default=None, help="link rate of the push runs")
    parser.add_argument("--hidden", type=int, default=None, help="push policy hidden width")
    parser.add_argument("--push-actors", default=None, help="actor counts pushed to")
    parser.add_argument(
        "--measure", default="links,latency,push", help="of links, latency, push; comma-separated"
    )
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"of {list(WORKLOADS)}, comma-separated",
    )
    args = parse(parser, argv)
    quick = args.quick
    args.rates = (args.rates or ("100mbit" if quick else "10gbit,1gbit,100mbit")).split(",")
    args.window = args.window or (0.5 if quick else 4.0)
    args.delays = [float(d) for d in (args.delays or ("5" if quick else "5,25")).split(",")]
    args.prefetch = [int(p) for p in (args.prefetch or ("2" if quick else "1,2")).split(",")]
    args.latency_rate = args.latency_rate or ("100mbit" if quick else "1gbit")
    args.push_rate = args.push_rate or ("100mbit" if quick else "1gbit")
    args.hidden = args.hidden or (1500 if quick else 5000)  # quick: 9 MB, relayed
    args.push_actors = [
        int(c) for c in (args.push_actors or ("1,2" if quick else "1,2,4,8")).split(",")
    ]
    args.workloads = args.workloads.split(",")
    wrong = sorted(set(args.measure.split(",")) - {"links", "latency", "push"})
    if wrong:
        parser.error(f"unknown --measure {wrong}; known: links, latency, push")
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown --workloads {unknown}; known: {list(WORKLOADS)}")
    for rate in [*args.rates, args.latency_rate, args.push_rate]:
        rate_bits(rate)  # ValueError now, not after minutes of setup
    return args


def set_rate(bed: Any, rate: str) -> None:
    """Shape every link of the bed (both ends of each veth) at ``rate`` with ``tc tbf``."""
    burst = str(max(int(rate_bits(rate)) // 8 // 100, 256 * 1024))  # 10 ms, whole GSO packets
    tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "200ms"]
    for host in bed.hosts.values():
        for argv in (
            ["tc", "qdisc", "replace", "dev", host.link, *tbf],
            ["ip", "netns", "exec", host.ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf],
        ):
            subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)


class Learner:
    """:mod:`bench._hosts_learner` in the learner host: one command, one answer."""

    def __init__(self, bed: Any) -> None:
        from on_hosts import LearnerScript  # type: ignore[import-not-found]  # tests/hosts

        self.script = LearnerScript(bed, "from bench._hosts_learner import main\nmain()\n")
        self.script.read(timeout=300)  # its ready line: torch imported

    def ask(self, timeout: float = 600.0, **cmd: Any) -> dict[str, Any]:
        """Send ``cmd``; its answer (RuntimeError when the learner reports an error)."""
        self.script.say(json.dumps(cmd))
        answer: dict[str, Any] = self.script.read(timeout=timeout)
        if "error" in answer:
            raise RuntimeError(f"learner: {answer['error']}")
        return answer

    def close(self) -> None:
        """Ask it to quit and wait (the bed kills it otherwise)."""
        with contextlib.suppress(Exception):
            self.script.say(json.dumps({"op": "quit"}))
            self.script.process.wait(30)


def start_proxy(bed: Any, delay_ms: float, targets: Sequence[str]) -> list[str]:
    """A :mod:`bench._delay_proxy` in the learner host; the addresses to dial instead."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    argv = [sys.executable, "-m", "bench._delay_proxy", "--delay-ms", str(delay_ms), *targets]
    process = bed.run("learner", argv, stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT)
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"the delay proxy ({delay_ms} ms) did not start")
    return list(json.loads(line))


@contextlib.contextmanager
def host_bed(args: argparse.Namespace) -> Iterator[tuple[Any, dict[str, list[str]], Learner]]:
    """The bed, its actors by group (``cartpole``, ``pixels``, ``push``) and the learner."""
    from on_hosts import start_actors_on
    from testbed import TestBed  # type: ignore[import-not-found]  # tests/hosts

    hosts = max(args.actors, *args.push_actors)
    push_flags = ["--env", "CartPole-v1", "--num-envs", "1", "--policy", "mlp"]
    push_flags += ["--policy-kwargs", json.dumps({"hidden": [args.hidden] * 2})]
    cartpole = [*CARTPOLE, "--num-envs", str(args.num_envs)]
    groups = {"cartpole": (cartpole, args.actors), "pixels": (PIXELS, args.actors)}
    groups["push"] = (push_flags, max(args.push_actors))
    with TestBed(hosts, rate=args.rates[0], learner_rate=args.rates[0]) as bed:
        specs, owners = [], []
        for offset, (group, (flags, count)) in enumerate(groups.items()):
            for index in range(1, count + 1):
                wid = ["--worker-id", str(100 * offset + index), "--torch-threads", "1"]
                specs.append((f"host{index}", [*flags, *wid]))
                owners.append(group)
        actors = start_actors_on(bed, specs)
        targets: dict[str, list[str]] = {group: [] for group in groups}
        for group, actor in zip(owners, actors, strict=True):
            targets[group].append(actor.target)
        learner = Learner(bed)
        try:
            yield bed, targets, learner
        finally:
            learner.close()


def measure_links(
    bed: Any, targets: dict[str, list[str]], learner: Learner, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Every workload at every rate, repetitions interleaving the rates."""
    samples: dict[str, list[float]] = {}
    for _ in range(reps_of(args)):
        for rate in args.rates:
            set_rate(bed, rate)
            for name in args.workloads:
                group, sync, fpa, prefetch = WORKLOADS[name]
                per_actor = fpa[1] if args.quick else fpa[0]
                got = learner.ask(
                    op="collect",
                    targets=targets[group],
                    sync=sync,
                    prefetch=prefetch,
                    frames_per_batch=per_actor * (len(targets[group]) if sync else 1),
                    seconds=args.window,
                    warmup=1 if args.quick else 2,
                )
                fps, rx = got["frames_per_s"], got["rx_bytes_per_s"]
                samples.setdefault(f"{name} @{rate} frames/s", []).append(fps)
                samples.setdefault(f"{name} @{rate} wire bytes/frame", []).append(rx / fps)
                samples.setdefault(f"{name} @{rate} link fraction", []).append(
                    rx * 8 / rate_bits(rate)
                )
                samples.setdefault(f"{name} @{rate} machine cpu busy", []).append(got["cpu_busy"])
    return samples


def record_links(report: Report, samples: dict[str, list[float]], args: argparse.Namespace) -> None:
    """Record the link figures; a target where the link, not the CPU, is the limit."""
    for name, values in samples.items():
        unit = "frames/s" if name.endswith("frames/s") else "B" if "bytes" in name else "share"
        report.figure(name, unit, values)
    top = max(args.rates, key=rate_bits)
    for workload in args.workloads:
        cpu_fps = median(samples[f"{workload} @{top} frames/s"])
        for rate in args.rates:
            per_frame = median(samples[f"{workload} @{rate} wire bytes/frame"])
            carry = rate_bits(rate) / 8 / per_frame
            fraction = median(samples[f"{workload} @{rate} link fraction"])
            if len(args.rates) > 1 and rate != top and carry < cpu_fps:
                report.target(f"{workload} @{rate}: >= 0.9 of the link", fraction, 0.9)
            elif len(args.rates) == 1:
                report.note(
                    f"{workload} @{rate}: {fraction:.3f} of the link (one rate: no CPU figure)"
                )
            else:
                report.note(
                    f"{workload} @{rate}: CPU-bound ({fraction:.3f} of the link; it could carry "
                    f"{carry:,.0f} frames/s, the fleet made {cpu_fps:,.0f} at {top})"
                )


def measure_latency(
    bed: Any, targets: dict[str, list[str]], learner: Learner, args: argparse.Namespace
) -> dict[str, list[float]]:
    """CartPole sync (user policy) through the delay proxy, per prefetch and delay."""
    group, _, fpa, _ = WORKLOADS["cartpole sync"]
    per_actor = fpa[1] if args.quick else fpa[0]
    proxies = {d: start_proxy(bed, d, targets[group]) for d in [0.0, *args.delays]}
    set_rate(bed, args.latency_rate)
    samples: dict[str, list[float]] = {}
    for _ in range(reps_of(args)):
        for prefetch in args.prefetch:
            for delay, addresses in proxies.items():
                got = learner.ask(
                    op="collect",
                    targets=addresses,
                    sync=True,
                    prefetch=prefetch,
                    frames_per_batch=per_actor * len(addresses),
                    seconds=args.window,
                    warmup=1 if args.quick else 3,
                )
                name = f"cartpole sync prefetch={prefetch} delay={delay:g}ms frames/s"
                samples.setdefault(name, []).append(got["frames_per_s"])
    return samples


def record_latency(
    report: Report, samples: dict[str, list[float]], args: argparse.Namespace
) -> None:
    """Each delay as a fraction of 0 ms through the same proxy, same prefetch."""
    for name, values in samples.items():
        report.figure(name, "frames/s", values)
    for prefetch in args.prefetch:
        base = f"cartpole sync prefetch={prefetch} delay=0ms frames/s"
        for delay in args.delays:
            name = f"cartpole sync prefetch={prefetch} delay={delay:g}ms frames/s"
            ratio = report.ratio(f"prefetch={prefetch} {delay:g}ms/0ms", name, base)
            if prefetch >= 2:
                report.target(
                    f"prefetch={prefetch}, {delay:g} ms each way: >= 0.9x 0 ms", ratio, 0.9
                )


def measure_push(
    bed: Any, targets: dict[str, list[str]], learner: Learner, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Push times to each of ``--push-actors``, direct and relayed, and their floors."""
    set_rate(bed, args.push_rate)
    samples: dict[str, list[float]] = {}
    for _ in range(reps_of(args)):
        got = learner.ask(
            timeout=1200.0,
            op="push",
            targets=targets["push"],
            hidden=args.hidden,
            counts=args.push_actors,
            relay=[False, True],
        )
        for route in ("direct", "relayed"):
            for count in args.push_actors:
                name = f"push to {count} @{args.push_rate} {route}"
                floor = count * got["bytes"] * 8 / rate_bits(args.push_rate)
                samples.setdefault(f"{name} s", []).append(got[route]["seconds"][str(count)])
                samples.setdefault(f"{name} learner/payload bytes", []).append(
                    got[route]["tx_bytes"][str(count)] / got["bytes"]
                )
                samples.setdefault(f"{name} cpu busy/all", []).append(
                    got[route]["cpu_busy"][str(count)]
                )
                if route == "direct":
                    samples.setdefault(f"push to {count} direct floor s", []).append(floor)
            samples.setdefault(f"push {route} fallbacks", []).append(got[route]["fallbacks"])
        samples.setdefault("push payload bytes", []).append(got["bytes"])
    return samples


def record_push(report: Report, samples: dict[str, list[float]], args: argparse.Namespace) -> None:
    """Each push against the push to one actor; the targets.

    Direct: one actor near its link's floor. Relayed: flat in the fleet's size.
    """
    for name, values in samples.items():
        report.figure(name, "s" if name.endswith(" s") else "x" if "/" in name else "B", values)
    one = f"push to 1 @{args.push_rate} direct s"
    report.target(
        f"push to 1 actor @{args.push_rate}: <= 1.3x the floor",
        report.ratio("push to 1 direct/floor", one, "push to 1 direct floor s"),
        1.3,
        higher_is_better=False,
    )
    for count in args.push_actors[1:]:
        for route in ("direct", "relayed"):
            name = f"push to {count} @{args.push_rate} {route} s"
            ratio = report.ratio(f"push to {count} {route}/push to 1", name, one)
            if route == "relayed" and count in _RELAY_TARGETS:
                report.target(
                    f"relayed push to {count} actors: <= {_RELAY_TARGETS[count]}x to 1 actor",
                    ratio,
                    _RELAY_TARGETS[count],
                    higher_is_better=False,
                )
    report.note(
        f"direct: each actor is sent the bytes through the learner's {args.push_rate} link "
        "(floor = actors x bytes / rate); relayed: sent once, down a chain of the actors"
    )


def run(args: argparse.Namespace, report: Report) -> None:
    """Make the bed, measure links, latency and pushes, record everything."""
    parts = {
        "links": (measure_links, record_links),
        "latency": (measure_latency, record_latency),
        "push": (measure_push, record_push),
    }
    chosen = [parts[name] for name in args.measure.split(",")]
    with host_bed(args) as (bed, targets, learner):
        measured = [measure(bed, targets, learner, args) for measure, _ in chosen]
    for (_, record), samples in zip(chosen, measured, strict=True):
        record(report, samples, args)


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    if str(_HOSTS_TESTS) not in sys.path:
        sys.path.insert(0, str(_HOSTS_TESTS))
    from testbed import unavailable

    report = Report("hosts", quick=args.quick)
    reason = unavailable()
    if reason is not None:
        report.skip("hosts", reason)
        return report.emit()
    report.note(
        f"{args.actors} collecting actors, each on its own host; link rates {args.rates} (the "
        f"learner's link at the same rate, shared); {args.window:g} s windows; "
        f"{reps_of(args)} reps; at start: {_load()}"
    )
    run(args, report)
    report.note(f"at end: {_load()}")
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
