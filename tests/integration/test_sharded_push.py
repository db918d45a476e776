"""Sharded pushes from learner ranks in their own processes to a fleet of actor processes.

Two learner processes (``sharded_rank.py``) each push half of the policy's keys as their
part of one version to both actors of a ``LocalFleet``; every actor must then hold the
union, whole, at that version (read back through GetState). A rank SIGKILLed between its
part and the other's leaves every actor on the old version; the parts expire after the
actors' ``--part-deadline-s``, a late part does not revive them, and the next complete
version applies.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch
from push_policies import actor_weights
from sharded_rank import shard

from learner_client import GrpcCollector, LocalFleet

pytestmark = [pytest.mark.usefixtures("loopback_only"), pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("sharded_rank.py")
DEADLINE = 3.0


@pytest.fixture(scope="module")
def fleet():
    extra = ["--part-deadline-s", str(DEADLINE)]
    with LocalFleet(2, num_envs=2, seed=0, extra_args=extra) as fleet:
        yield fleet


def _rank(fleet: LocalFleet, rank: int, version: int, seed: int, *, hold: bool = False):
    argv = [sys.executable, str(SCRIPT), "--actors", ",".join(fleet.addresses)]
    argv += ["--rank", str(rank), "--world", "2", "--version", str(version), "--seed", str(seed)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [*argv, *(["--hold"] if hold else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def _result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate(timeout=120)
    return json.loads(out.strip().splitlines()[-1])


def _assert_fleet_holds(fleet: LocalFleet, seed: int, version: int) -> None:
    whole = shard(seed, 0, 1)
    with GrpcCollector(fleet.addresses, frames_per_batch=8) as reader:
        for worker_id in reader.worker_ids:
            got_version, weights = actor_weights(reader, worker_id)
            assert got_version == version, worker_id
            assert weights.keys() == whole.keys()
            for key, value in whole.items():
                assert torch.equal(weights[key], value), (worker_id, key)


def _push_both(fleet: LocalFleet, version: int, seed: int) -> list[dict]:
    ranks = [_rank(fleet, rank, version, seed) for rank in (0, 1)]
    return [_result(process) for process in ranks]


def test_parts_from_two_learner_processes_apply_whole_on_every_actor(fleet) -> None:
    results = _push_both(fleet, version=5, seed=11)
    for worker_id in ("0", "1"):
        outcomes = sorted(r[worker_id][0] for r in results)
        assert outcomes == ["COMPLETED", "STAGED"], results  # the later part completes it
        for outcome, in_force, staged in (r[worker_id] for r in results):
            assert (in_force, staged) == ((5, 2) if outcome == "COMPLETED" else (0, 1))
    _assert_fleet_holds(fleet, seed=11, version=5)


def test_a_rank_killed_between_the_parts_leaves_every_actor_on_the_old_version(fleet) -> None:
    _push_both(fleet, version=20, seed=21)
    held = _rank(fleet, 1, version=21, seed=22, hold=True)
    try:
        assert held.stdout is not None
        assert held.stdout.readline().strip() == "ready"
        first = _result(_rank(fleet, 0, version=21, seed=22))
        staged_by = time.monotonic()
        assert {w: r[0] for w, r in first.items()} == {"0": "STAGED", "1": "STAGED"}
        held.send_signal(signal.SIGKILL)
        held.wait(30)
    finally:
        held.kill()
        held.communicate(timeout=30)
    _assert_fleet_holds(fleet, seed=21, version=20)  # nothing of version 21
    # Version 21 began staging before rank 0 returned: past the deadline it expired.
    time.sleep(max(0.0, staged_by + DEADLINE + 0.5 - time.monotonic()))
    late = _result(_rank(fleet, 1, version=21, seed=22))
    assert late["failed"] == [0, 1], late
    assert "ABORTED" in late["error"]
    assert "expired" in late["error"]
    _assert_fleet_holds(fleet, seed=21, version=20)
    _push_both(fleet, version=22, seed=23)
    _assert_fleet_holds(fleet, seed=23, version=22)
