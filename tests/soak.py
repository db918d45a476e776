"""The soak: mixed faults for an hour against two real actors; flat memory and fds, a report.

``make soak`` (or ``python tests/soak.py --minutes 60``) starts two actor processes and an
async ``GrpcCollector`` that reaches actor 0 through a :class:`tcp_proxy.FaultProxy`. Every
few seconds it injects one fault at random: a connection reset, a bit flip, a SIGSTOP of
actor 1 for 3 s, a SIGKILL and restart of actor 1, a weight push. Throughout it consumes
batches, fingerprints them (no batch may be delivered twice) and samples the learner's and
the actors' resident memory and open file descriptors. At the end it prints a JSON report
and exits 1 if a batch was duplicated, delivery stopped, or memory or fds grew (the median
of the last five samples against the first five after a warm-up quarter).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import pathlib
import random
import signal
import statistics
import sys
import time

# Run as a script, this folder is first on sys.path, and its learner_client/ (a folder of
# tests, no package) would shadow the package under test: the repository root goes first.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import gymnasium
from helpers import start_actor
from tcp_proxy import FaultProxy

from common.policies import make_policy
from learner_client import GrpcCollector, WeightPushError

_RSS_GROWTH_MB = 20.0
_FD_GROWTH = 10


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _growth(samples: list[float]) -> float:
    kept = samples[len(samples) // 4 :]
    if len(kept) < 10:
        return 0.0
    return statistics.median(kept[-5:]) - statistics.median(kept[:5])


class Soak:
    """The actors, the proxy, the collector and the books of one soak run."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.actors = [start_actor(["--worker-id", str(i), "--num-envs", "2"]) for i in (0, 1)]
        self.proxy = FaultProxy(("127.0.0.1", self.actors[0].port))
        self.collector = GrpcCollector(
            [self.proxy.address, self.actors[1].address], frames_per_batch=64, batch_timeout=5
        )
        self.faults: collections.Counter[str] = collections.Counter()
        self.fingerprints: set[str] = set()
        self.duplicates = 0
        self.samples: dict[str, list[float]] = collections.defaultdict(list)

    def consume(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            batch = self.collector.next()
            digest = hashlib.sha256(batch["observation"].numpy().tobytes())
            digest.update(batch["collector", "traj_ids"].numpy().tobytes())
            key = digest.hexdigest()
            self.duplicates += key in self.fingerprints
            self.fingerprints.add(key)

    def fault(self) -> None:
        kind = self.random.choice(["reset", "flip", "sigstop", "sigkill", "push"])
        self.faults[kind] += 1
        if kind == "reset":
            self.proxy.reset()
        elif kind == "flip":
            self.proxy.corrupt_after(self.random.randrange(20_000))
        elif kind == "sigstop":
            pid = self.actors[1].process.pid
            os.kill(pid, signal.SIGSTOP)
            self.consume(3.0)
            os.kill(pid, signal.SIGCONT)
        elif kind == "sigkill":
            port = self.actors[1].port
            self.actors[1].close()
            self.actors[1] = start_actor(
                ["--worker-id", "1", "--num-envs", "2", "--port", str(port)]
            )
        else:
            env = gymnasium.make("CartPole-v1")
            policy = make_policy("mlp", env.observation_space, env.action_space)
            try:
                self.collector.update_policy_weights_(policy)
            except WeightPushError:
                self.faults["push_refused"] += 1

    def sample(self) -> None:
        self.samples["learner_rss_mb"].append(_rss_mb(os.getpid()))
        self.samples["learner_fds"].append(_fds(os.getpid()))
        self.samples["actor0_rss_mb"].append(_rss_mb(self.actors[0].process.pid))
        self.samples["actor0_fds"].append(_fds(self.actors[0].process.pid))

    def close(self) -> None:
        self.collector.shutdown(timeout=10)
        self.proxy.close()
        for actor in self.actors:
            actor.close()


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its report; 0 when the run stayed healthy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    args = parser.parse_args(argv)
    soak = Soak(args.seed)
    start = time.monotonic()
    end = start + args.minutes * 60
    try:
        soak.consume(5.0)
        while time.monotonic() < end:
            soak.fault()
            soak.consume(min(5.0, max(0.0, end - time.monotonic())))
            soak.sample()
        stats = soak.collector.stats()
    finally:
        soak.close()
    growth = {name: round(_growth(values), 2) for name, values in soak.samples.items()}
    flat = all(
        growth[name] <= (_RSS_GROWTH_MB if name.endswith("_mb") else _FD_GROWTH) for name in growth
    )
    report = {
        "minutes": round((time.monotonic() - start) / 60, 2),
        "faults": dict(soak.faults),
        "batches_delivered": len(soak.fingerprints) + soak.duplicates,
        "duplicates_seen": soak.duplicates,
        "gaps_counted": stats["gaps"],
        "reconnects": stats["reconnects"],
        "failures": stats["failures"],
        "growth": growth,
        "samples": {
            name: [round(v, 1) for v in values[-3:]] for name, values in soak.samples.items()
        },
        "healthy": soak.duplicates == 0 and flat and len(soak.fingerprints) > 0,
    }
    print(json.dumps(report, indent=2))
    return 0 if report["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
