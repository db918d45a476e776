"""A GRPO learner rank restarted: it takes its LLM actors' sessions back and resumes pushing.

Two LLM actors (worker_ids 0 and 1) serve two ``GrpcLLMCollector`` ranks under one
``learner_id``, as ``rlfleet-grpo --nproc-per-node 2`` builds them: rank 0 in the test
process owns worker 0, rank 1 in a subprocess owns worker 1, and both push the same
versioned weights (the replicated pushes of the reference learner). Rank 1 is stopped (a
hung or partitioned process, its sessions still open) or killed; rank 0 pushes two more
versions; a replacement rank 1 under the same ``learner_id`` takes its actor back, finds it
two versions behind, and brings it to the newest version with one push. Every actor ends on
the newest version, and rank 0 collects throughout without a failure.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from common.llm import build_policy
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import ActorDescription, GrpcLLMCollector, LocalFleet

pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("loopback_only"), pytest.mark.slow]

TINY = {"hidden": 32, "layers": 1, "seed": 0}
SLOTS = 2
ROOT = pathlib.Path(__file__).resolve().parents[2]

# Rank 1 of 2: push the given version to its own actor, collect one batch, report, then wait.
_RANK_ONE = """
import json, sys
import torch
from common.llm import build_policy
from learner_client import GrpcLLMCollector
addresses, version, tiny = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
# argv[4]: the learner_id, the same for a rank and its replacement (torchrun's run id)
model, _ = build_policy("rlfleet:tiny-qwen2", **tiny)
collector = GrpcLLMCollector(addresses, dialog_turns_per_batch=2, sync=True, layout="padded",
                             generation={"max_new_tokens": 2}, rank=1, world_size=2,
                             learner_id=sys.argv[4], batch_timeout=120, connect_timeout=60)
held = collector.policy_version  # what its actors hold when it (re)joins
pushed = collector.update_policy_weights_(model, version=version)
batch = collector.next()
report = {"held": held, "pushed": pushed, "stats": {"failures": collector.stats()["failures"]},
          "workers": sorted(set(batch["collector", "worker_id"].reshape(-1).tolist()))}
print(json.dumps(report), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[LocalFleet]:
    """Two LLM actors, worker_ids 0 (rank 0's) and 1 (rank 1's)."""
    with LocalFleet(
        2,
        kind="llm",
        task="arith",
        policy="rlfleet:tiny-qwen2",
        policy_kwargs=TINY,
        num_envs=SLOTS,
        seed=0,
        grace_period=1.0,
        start_timeout=180.0,  # two LLM actors importing transformers on a loaded machine
    ) as actors:
        yield actors


def _held(fleet: LocalFleet) -> dict[int, int]:
    """Each actor's version of the policy, as it describes itself."""
    held = {}
    for address in fleet.addresses:
        with grpc.insecure_channel(address) as channel:
            reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=30)
        description = ActorDescription.from_response(address, reply)
        held[description.worker_id] = max(description.models.values())
    return held


def _start_rank_one(
    fleet: LocalFleet, version: int, learner_id: str = "job"
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", _RANK_ONE, json.dumps(fleet.addresses), str(version)]
    return subprocess.Popen(
        [*argv, json.dumps(TINY), learner_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _report(process: subprocess.Popen[str]) -> dict:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"rank 1 exited: {process.communicate(timeout=30)[1][-3000:]}")
    return json.loads(line)


@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_restarted_llm_rank_takes_its_sessions_back_and_pushes_the_newest_version(
    fleet: LocalFleet, fault: signal.Signals
) -> None:
    version = max(_held(fleet).values()) + 1
    with GrpcLLMCollector(
        fleet.addresses,
        dialog_turns_per_batch=SLOTS,
        sync=True,
        layout="padded",
        generation={"max_new_tokens": 2},
        rank=0,
        world_size=2,
        learner_id="job",
        batch_timeout=120,
    ) as rank_zero:
        model, _ = build_policy("rlfleet:tiny-qwen2", **TINY)
        assert rank_zero.update_policy_weights_(model, version=version) == {0: version}
        old = _start_rank_one(fleet, version)
        new = None
        try:
            report = _report(old)
            assert report["pushed"] == {"1": version}
            assert report["workers"] == [1]
            os.kill(old.pid, fault)  # rank 1 hangs with its session open, or dies
            for step in (1, 2):  # rank 0 trains and pushes on; worker 1 misses both versions
                assert rank_zero.next() is not None
                rank_zero.update_policy_weights_(model, version=version + step)
            # The replacement, under the same learner_id, takes worker 1 back and brings it
            # from the version it still holds to the newest with one push.
            new = _start_rank_one(fleet, version + 2)
            report = _report(new)
            assert report["held"] == version
            assert report["pushed"] == {"1": version + 2}
            assert report["workers"] == [1]
            assert report["stats"]["failures"] == 0
            log = fleet.stderr_tail(1, 200_000)
            assert "session.taken_over" not in log
            if fault == signal.SIGSTOP:  # its old stream still looked alive to the actor
                assert "session.reconnected" in log
            assert rank_zero.next() is not None
            assert rank_zero.stats()["failures"] == 0
        finally:
            for process in (old, new):
                if process is not None:
                    process.kill()
                    process.communicate(timeout=30)  # reaps it and closes its pipes
    assert _held(fleet) == {0: version + 2, 1: version + 2}
