"""Pushes and collection across shaped links, against what the link can carry.

Actors run in network namespaces as hosts (``tests/hosts/testbed.py``: a bridge, one
veth per host, ``tc tbf`` at ``rate`` on both ends of every link, the learner's link
included, so the learner's uplink is shared by every actor). Each actor holds the
``"mlp"`` CartPole policy with two hidden layers of ``--hidden`` (5000: 25,040,002
float32 parameters, 100 MB); the learner, in its own host, times
``update_policy_weights_`` of that policy to one actor and to every actor. A push is
sent to each actor on its own (unicast), so to ``A`` actors behind one uplink its
floor is ``A * bytes / rate``; the table gives each time as a multiple of that floor.

``--collect``: collection instead, from ``--actors`` actors of 4 pixel envs each
(``bench.envs:make_fresh_pixel_env``: uint8 ``(4, 84, 84)`` frames of fresh random
data, ``bench.policies:pixel_policy``), sync (256 frames per actor per batch) and
async (256 frames per batch), ``--seconds`` each after a warm-up: frames/s, and the
bytes the learner's link received (its interface counters, headers included) as a
fraction of its rate.

Needs root (network namespaces). Usage:
``python -m bench.hosts [--rates 1gbit,100mbit] [--actors 2] [--hidden 5000] [--reps 2]``,
``python -m bench.hosts --collect [--rates 1gbit,100mbit] [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

_ROOT = pathlib.Path(__file__).resolve().parents[1]

_LEARNER = """
import json, sys, time
import gymnasium, torch
from common.policies import make_policy
from learner_client import GrpcCollector
targets, hidden, reps = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
env = gymnasium.make("CartPole-v1")
policy = make_policy("mlp", env.observation_space, env.action_space, hidden=(hidden, hidden))
nbytes = sum(p.numel() * p.element_size() for p in policy.state_dict().values())
with GrpcCollector(targets, frames_per_batch=len(targets) * 2, call_timeout=600) as c:
    c.update_policy_weights_(policy, worker_ids=[c.worker_ids[0]])  # warm-up, not timed
    out = {"bytes": nbytes, "times": {}}
    for count in sorted({1, len(targets)}):
        times = []
        for _ in range(reps):
            with torch.no_grad():
                next(policy.parameters()).add_(1e-3)  # a push nobody may skip
            start = time.perf_counter()
            c.update_policy_weights_(policy, worker_ids=c.worker_ids[:count])
            times.append(time.perf_counter() - start)
        out["times"][count] = times
print(json.dumps(out), flush=True)
"""


_COLLECT = """
import json, sys, time
from learner_client import GrpcCollector
targets, seconds = sys.argv[1].split(","), float(sys.argv[2])
def rx():
    return int(open("/sys/class/net/eth0/statistics/rx_bytes").read())
out = {}
for mode, sync, fpb in (("sync", True, 256 * len(targets)), ("async", False, 256)):
    with GrpcCollector(targets, frames_per_batch=fpb, sync=sync, batch_timeout=120) as c:
        for _ in range(3 * len(targets)):  # warm-up
            c.next()
        frames, bytes0, start = 0, rx(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += c.next().numel()
        elapsed = time.perf_counter() - start
        out[mode] = {"frames_per_s": frames / elapsed, "rx_bytes_per_s": (rx() - bytes0) / elapsed}
print(json.dumps(out), flush=True)
"""


def _bits(rate: str) -> float:
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    value = rate.lower().removesuffix("bit")
    return float(value[:-1]) * units[value[-1]] if value[-1] in units else float(value)


def _start_actor(bed: Any, host: str, worker_id: int, flags: Sequence[str]) -> Any:
    argv = [sys.executable, "-m", "actor_service", "--host", host, "--port", "50051"]
    argv += ["--worker-id", str(worker_id), *flags]
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    return bed.run(
        host, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def _run_on_bed(
    rate: str, actors: int, flags: Sequence[str], script: str, args: Sequence[str]
) -> dict[str, Any]:
    """Start ``actors`` actors with ``flags`` on links of ``rate``, run ``script`` as learner."""
    from tests.hosts.testbed import TestBed

    with TestBed(actors, rate=rate, learner_rate=rate) as bed:
        started = [_start_actor(bed, f"host{i}", i, flags) for i in range(1, actors + 1)]
        for process in started:
            line = process.stdout.readline()
            if "ready" not in line:
                raise RuntimeError(f"an actor did not start: {line!r}")
        targets = ",".join(f"host{i}:50051" for i in range(1, actors + 1))
        learner = bed.run(
            "learner",
            [sys.executable, "-c", script, targets, *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(_ROOT)},
        )
        out, _ = learner.communicate(timeout=1800)
        if learner.returncode:
            raise RuntimeError(f"the learner failed (exit {learner.returncode})")
        return json.loads(out.strip().splitlines()[-1])


def measure(rate: str, actors: int, hidden: int, reps: int) -> dict[str, Any]:
    """Push times to 1 and to ``actors`` actors over links of ``rate`` (learner's too)."""
    flags = ["--num-envs", "1", "--policy", "mlp"]
    flags += ["--policy-kwargs", json.dumps({"hidden": [hidden, hidden]})]
    return _run_on_bed(rate, actors, flags, _LEARNER, [str(hidden), str(reps)])


def collect(rate: str, actors: int, seconds: float) -> dict[str, Any]:
    """Pixel collection, sync and async, from ``actors`` actors over links of ``rate``."""
    flags = ["--num-envs", "4", "--env-factory", "bench.envs:make_fresh_pixel_env"]
    flags += ["--policy", "bench.policies:pixel_policy"]
    return _run_on_bed(rate, actors, flags, _COLLECT, [str(seconds)])


def _collect_table(rates: Sequence[str], actors: int, seconds: float) -> None:
    print("| link (each, and the learner's) | mode | frames/s | learner link MB/s | of the link |")
    print("|---|---|---|---|---|")
    for rate in rates:
        result = collect(rate, actors, seconds)
        for mode, row in result.items():
            share = row["rx_bytes_per_s"] * 8 / _bits(rate)
            print(
                f"| {rate} | {mode} | {row['frames_per_s']:,.0f} | "
                f"{row['rx_bytes_per_s'] / 1e6:.1f} | {share:.2f} |",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the push table and print it (Markdown)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__)
    parser.add_argument("--rates", default="1gbit,100mbit", help="link rates (tc syntax)")
    parser.add_argument("--actors", type=int, default=2, help="actor hosts")
    parser.add_argument("--hidden", type=int, default=5000, help="hidden width of the MLP")
    parser.add_argument("--reps", type=int, default=2, help="timed pushes per row")
    parser.add_argument("--collect", action="store_true", help="collection instead of pushes")
    parser.add_argument("--seconds", type=float, default=10.0, help="collection time per mode")
    args = parser.parse_args(argv)
    if args.collect:
        _collect_table(args.rates.split(","), args.actors, args.seconds)
        return 0
    print(
        "| link (each, and the learner's) | actors | MB | push s (each rep) | floor s | x floor |"
    )
    print("|---|---|---|---|---|---|")
    for rate in args.rates.split(","):
        started = time.monotonic()
        result = measure(rate, args.actors, args.hidden, args.reps)
        megabytes = result["bytes"] / 1e6
        for count, times in sorted(result["times"].items(), key=lambda kv: int(kv[0])):
            floor = int(count) * result["bytes"] * 8 / _bits(rate)
            shown = ", ".join(f"{t:.2f}" for t in times)
            print(
                f"| {rate} | {count} | {megabytes:.0f} | {shown} | {floor:.2f} | "
                f"{min(times) / floor:.2f} |",
                flush=True,
            )
        print(f"<!-- {rate}: {time.monotonic() - started:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
