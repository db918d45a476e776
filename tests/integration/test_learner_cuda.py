"""``--learner-device cuda``: the reference learners on a GPU against a local fleet.

The real entry points in subprocesses (``rlfleet-train``: two batches; ``rlfleet-grpo``: two
updates). Skipped where torch sees no CUDA device. Two ranks with NCCL need two GPUs (NCCL
refuses two ranks on one), so that test also skips on a machine with one.
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


def _run(module: str, out: pathlib.Path, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", module, *args, "--no-progress", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def test_train_on_cuda_runs_two_batches_and_pushes_each(tmp_path: pathlib.Path) -> None:
    args = [*TINY, "--learner-device", "cuda", "--num-actors", "2"]
    summary = _run("apps.ppo", tmp_path / "run", *args)
    assert (summary["frames"], summary["batches"]) == (512, 2)
    # The initial push, then one per batch: the actors act with the GPU learner's weights.
    assert summary["policy_version"] == 3
    assert (tmp_path / "run" / "policy.safetensors").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs")
def test_train_on_two_gpus_runs_two_nccl_ranks(tmp_path: pathlib.Path) -> None:
    args = [*TINY, "--learner-device", "cuda", "--nproc-per-node", "2", "--num-actors", "2"]
    summary = _run("apps.ppo", tmp_path / "run", *args)
    assert summary["ranks"] == 2
    assert summary["policy_version"] == 3


def test_grpo_on_cuda_runs_two_updates_and_evaluates_on_the_gpu(tmp_path: pathlib.Path) -> None:
    args = ["--hidden", "32", "--prompts-per-step", "4", "--eval-problems", "20"]
    args += ["--max-steps", "2", "--learner-device", "cuda"]
    summary = _run("apps.grpo", tmp_path / "run", *args)
    assert summary["steps"] == 2
    assert summary["policy_version"] == 3  # the initial push, then one per update
    assert 0.0 <= summary["accuracy"] <= 1.0
