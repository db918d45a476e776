"""``rlfleet-train --learner-device cuda``: the PPO learner on a GPU against a local fleet.

The real entry point in a subprocess, two batches. Skipped where torch sees no CUDA
device. Two ranks with NCCL need two GPUs (NCCL refuses two ranks on one), so that test
also skips on a machine with one.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.usefixtures("loopback_only"), pytest.mark.cuda]

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--num-envs", "4", "--frames-per-batch", "256", "--total-frames", "512"]
TINY += ["--minibatch-size", "64", "--hidden", "16,16", "--target-return", "inf"]


def _train(out: pathlib.Path, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "apps.ppo", *TINY, "--no-progress", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def test_train_on_cuda_runs_two_batches_and_pushes_each(tmp_path: pathlib.Path) -> None:
    summary = _train(tmp_path / "run", "--learner-device", "cuda", "--num-actors", "2")
    assert (summary["frames"], summary["batches"]) == (512, 2)
    # The initial push, then one per batch: the actors act with the GPU learner's weights.
    assert summary["policy_version"] == 3
    assert (tmp_path / "run" / "policy.safetensors").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs")
def test_train_on_two_gpus_runs_two_nccl_ranks(tmp_path: pathlib.Path) -> None:
    args = ["--learner-device", "cuda", "--nproc-per-node", "2", "--num-actors", "2"]
    summary = _train(tmp_path / "run", *args)
    assert summary["ranks"] == 2
    assert summary["policy_version"] == 3
