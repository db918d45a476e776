"""A learner SIGKILLed in the middle of shared-memory pushes: the actor keeps a whole version.

The learner is a process of its own pushing a 4M-parameter policy to a local actor in a loop
(push ``k`` fills every tensor with ``k``), killed the moment one of its segments is under
/dev/shm, the push in flight. The actor must go on serving with every tensor of one pushed
version (never some of ``k`` and some of ``k - 1``); the next learner starting on the host
sweeps the dead one's segments and its pushes apply.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from learner_fleet import cartpole_policy
from test_collector_shm import actor_policy

from common.shm import SHM_ROOT
from learner_client import GrpcCollector, LocalFleet, _shm

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = [2000, 2000]
PREFIX = "models/policy/weights/"

#: The learner: pushes version after version, each tensor filled with the push's number.
LEARNER = """
import sys, torch
sys.path[:0] = {tests!r}
from learner_fleet import cartpole_policy
from learner_client import GrpcCollector
policy = cartpole_policy(hidden={hidden!r})
with GrpcCollector([{address!r}], frames_per_batch=16, sync=False) as collector:
    for k in range(1, 10**6):
        with torch.no_grad():
            for p in policy.parameters():
                p.fill_(float(k))
        collector.update_policy_weights_(policy)
        print(k, flush=True)
"""


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM_ROOT) if n.startswith(f"rlfleet-shm-{pid}-")]


def _kill_mid_push(learner: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _segments_of(learner.pid):
        assert learner.poll() is None, "the learner exited before it was killed"
        assert time.monotonic() < deadline, "the learner never wrote a segment"
        time.sleep(0.001)
    learner.send_signal(signal.SIGKILL)


def _fills(address: str) -> set[float]:
    held = actor_policy(address)
    values: set[float] = set()
    for name, tensor in held.items():
        if name.startswith(PREFIX):
            values |= set(tensor.unique().tolist())
    return values


def test_a_learner_killed_mid_push_leaves_the_actor_with_one_whole_version() -> None:
    with LocalFleet(1, "CartPole-v1", num_envs=1, policy_kwargs={"hidden": HIDDEN}) as fleet:
        (address,) = fleet.addresses
        tests = [str(Path(__file__).parent), str(ROOT / "tests")]
        script = LEARNER.format(tests=tests, hidden=HIDDEN, address=address)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        learner = subprocess.Popen(
            [sys.executable, "-c", script], env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            first = learner.stdout.readline() if learner.stdout else ""
            assert first.strip() == "1", learner.communicate()[1][-3000:]
            _kill_mid_push(learner, timeout=60)
        finally:
            if learner.poll() is None:
                learner.kill()
            learner.communicate()  # reaps it and closes its pipes
        fills = _fills(address)
        assert len(fills) == 1, f"a mixed version was applied: {sorted(fills)}"
        assert fills.pop() >= 1.0
        _shm.ShmRoute(enabled=True)  # the next learner on this host sweeps the dead one's
        assert _segments_of(learner.pid) == []
        policy = cartpole_policy(hidden=HIDDEN)
        with torch.no_grad():
            for param in policy.parameters():
                param.fill_(-7.0)
        with GrpcCollector([address], frames_per_batch=16, sync=False) as collector:
            collector.update_policy_weights_(policy)
            assert collector.stats()["shm_pushes"] >= 1
        assert _fills(address) == {-7.0}
        assert fleet.is_alive(0)
