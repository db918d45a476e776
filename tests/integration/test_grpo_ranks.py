"""``rlfleet-grpo --nproc-per-node 2``: data-parallel GRPO, two ranks sharing a local LLM fleet.

The real entry point runs the ranks under ``torch.distributed.run`` (gloo on the CPU); each
rank starts its own 2 LLM actors, updates through DDP and pushes agreed versions: the whole
model to its own actors, or (``--shard-pushes``) its half of the keys to all 4. At the end
each rank reads its actors back (GetState) into ``ranks/rank<r>.json``: every actor must hold
the last version and the learner's final weights.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.long

pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2
TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--prompts-per-step", "2"]
TINY += ["--group-size", "2", "--eval-problems", "4", "--no-progress"]


def _grpo(out: pathlib.Path, *args: str) -> list[dict]:
    command = [sys.executable, "-m", "apps.grpo", "--nproc-per-node", "2", "--num-actors", "4"]
    command += [*TINY, "--max-steps", str(STEPS), "--out", str(out), *args]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())  # written by rank 0
    # Both ranks print a summary with rank 0's accuracy (the weights are the same).
    lines = [line for line in result.stdout.splitlines() if line.startswith("GRPO on arith")]
    assert len(lines) == 2
    assert all(f"accuracy {summary['accuracy']:.2f}" in line for line in lines), lines
    assert summary["steps"] == STEPS
    assert summary["policy_version"] == STEPS + 1  # version 1: the initial weights
    records = [json.loads((out / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(records):
        assert record["version"] == STEPS + 1
        # Each rank owns worker_ids rank and rank + 2; they hold its final weights, whole.
        assert record["actors"] == {
            str(w): {"version": STEPS + 1, "weights_equal": True} for w in (rank, rank + 2)
        }, record
    return records


def test_grpo_ranks_under_torchrun_each_start_their_share_of_the_fleet(tmp_path) -> None:
    # torchrun run by hand, without our --nproc-per-node: each rank starts one of the 2 actors.
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["--local-addr=127.0.0.1", "-m", "apps.grpo", *TINY, "--max-steps", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        record = json.loads((out / "ranks" / f"rank{rank}.json").read_text())
        assert record["actors"] == {str(rank): {"version": 2, "weights_equal": True}}, record


def test_grpo_ranks_shard_pushes_and_every_actor_swaps_each_version_in_whole(tmp_path) -> None:
    records = _grpo(tmp_path / "run", "--shard-pushes")
    pushes = STEPS + 1
    for record in records:
        assert record["shard_pushes"] is True
        outcomes = record["push_outcomes"]
        assert set(outcomes) <= {"STAGED", "COMPLETED"}, outcomes
        assert sum(outcomes.values()) == 4 * pushes  # each part went to every actor
    # The later part of each version completes it on each actor, exactly once.
    assert sum(r["push_outcomes"].get("COMPLETED", 0) for r in records) == 4 * pushes
    assert sum(r["push_outcomes"].get("STAGED", 0) for r in records) == 4 * pushes


@pytest.mark.slow
def test_grpo_ranks_push_the_whole_model_to_their_own_actors(tmp_path) -> None:
    for record in _grpo(tmp_path / "run"):
        assert record["shard_pushes"] is False
        assert record["push_outcomes"] == {"APPLIED": 2 * (STEPS + 1)}


def test_grpo_ranks_stop_together_when_one_is_signalled(tmp_path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "apps.grpo", "--nproc-per-node", "2", "--num-actors", "4"]
    command += [*TINY, "--max-steps", "100000", "--out", str(out)]
    learner = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        while "steps=3 " not in learner.stderr.readline():  # rank 0's progress
            assert learner.poll() is None, learner.stderr.read()
        launcher = f"/proc/{learner.pid}/task/{learner.pid}/children"
        rank1 = int(pathlib.Path(launcher).read_text().split()[1])
        os.kill(rank1, signal.SIGTERM)  # to rank 1 alone: it waits for batches most of the time
        _, err = learner.communicate(timeout=120)
    finally:
        learner.kill()
    # Rank 1 stopped alone; rank 0 failed in DDP's broadcast ("Connection closed by peer").
    assert learner.returncode == 130, err[-4000:]
    assert "Connection closed" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["steps"] >= 3
    # One progress line a step: rank 1 printed its own as well.
    steps = [line.split()[0] for line in err.splitlines() if line.startswith("steps=")]
    assert len(steps) == len(set(steps)), steps
