"""Weight pushes across shaped links: push time against the link's floor, one and several actors.

Actors run in network namespaces as hosts (``tests/hosts/testbed.py``: a bridge, one
veth per host, ``tc tbf`` at ``rate`` on both ends of every link, the learner's link
included, so the learner's uplink is shared by every actor). Each actor holds the
``"mlp"`` CartPole policy with two hidden layers of ``--hidden`` (5000: 25,040,002
float32 parameters, 100 MB); the learner, in its own host, times
``update_policy_weights_`` of that policy to one actor and to every actor. A push is
sent to each actor on its own (unicast), so to ``A`` actors behind one uplink its
floor is ``A * bytes / rate``; the table gives each time as a multiple of that floor.

Needs root (network namespaces). Usage:
``python -m bench.hosts [--rates 1gbit,100mbit] [--actors 2] [--hidden 5000] [--reps 2]``.
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


def _bits(rate: str) -> float:
    units = {"k": 1e3, "m": 1e6, "g": 1e9}
    value = rate.lower().removesuffix("bit")
    return float(value[:-1]) * units[value[-1]] if value[-1] in units else float(value)


def _start_actor(bed: Any, host: str, worker_id: int, hidden: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "actor_service", "--host", host, "--port", "50051"]
    argv += ["--worker-id", str(worker_id), "--num-envs", "1", "--policy", "mlp"]
    argv += ["--policy-kwargs", json.dumps({"hidden": [hidden, hidden]})]
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    return bed.run(
        host, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def measure(rate: str, actors: int, hidden: int, reps: int) -> dict[str, Any]:
    """Push times to 1 and to ``actors`` actors over links of ``rate`` (learner's too)."""
    from tests.hosts.testbed import TestBed

    with TestBed(actors, rate=rate, learner_rate=rate) as bed:
        started = [_start_actor(bed, f"host{i}", i, hidden) for i in range(1, actors + 1)]
        for process in started:
            assert process.stdout is not None
            line = process.stdout.readline()
            if "ready" not in line:
                raise RuntimeError(f"an actor did not start: {line!r}")
        targets = ",".join(f"host{i}:50051" for i in range(1, actors + 1))
        learner = bed.run(
            "learner",
            [sys.executable, "-c", _LEARNER, targets, str(hidden), str(reps)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(_ROOT)},
        )
        out, _ = learner.communicate(timeout=1800)
        if learner.returncode:
            raise RuntimeError(f"the learner failed (exit {learner.returncode})")
        return json.loads(out.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the push table and print it (Markdown)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__)
    parser.add_argument("--rates", default="1gbit,100mbit", help="link rates (tc syntax)")
    parser.add_argument("--actors", type=int, default=2, help="actor hosts")
    parser.add_argument("--hidden", type=int, default=5000, help="hidden width of the MLP")
    parser.add_argument("--reps", type=int, default=2, help="timed pushes per row")
    args = parser.parse_args(argv)
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
