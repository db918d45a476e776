"""``rlfleet-train --nproc-per-node 2``: data-parallel PPO, two ranks sharing a local fleet.

The real entry point runs the ranks under ``torch.distributed.run`` (gloo on the CPU);
each rank starts its own share of the fleet (2 ranks x 2 actors), trains with DDP and
pushes agreed versions to its own actors.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.long

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _train(out: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps.ppo", "--nproc-per-node", "2", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_train_runs_two_data_parallel_ranks_on_a_tiny_budget(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    tiny = ["--num-envs", "2", "--frames-per-batch", "16", "--minibatch-size", "8"]
    result = _train(
        out,
        *tiny,
        *("--num-actors", "4", "--total-frames", "48", "--hidden", "8", "--no-progress"),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 1 of 2: CartPole-v1" in result.stdout, result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ranks"], summary["rank"]) == (2, 0)
    assert summary["frames"] == 2 * 48  # each rank trained on its own 48
    assert summary["batches"] == 3
    assert summary["policy_version"] >= 4  # the first push and one per batch, agreed
    assert (out / "policy.safetensors").exists()


def test_train_refuses_a_fleet_that_does_not_split_over_the_ranks(tmp_path) -> None:
    result = _train(tmp_path / "run", "--num-actors", "3", timeout=60)
    assert result.returncode == 2
    assert "multiple of nproc_per_node" in result.stderr


@pytest.mark.slow
def test_train_two_ranks_reach_the_cartpole_target(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    result = _train(
        out,
        *("--num-actors", "4", "--num-envs", "4", "--frames-per-batch", "512"),
        *("--minibatch-size", "128", "--seed", "1", "--no-progress"),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reached_target"] is True, summary
    assert summary["final_return"] >= 475.0
    assert summary["frames"] < 2 * summary["settings"]["total_frames"]
