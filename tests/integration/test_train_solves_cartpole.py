"""``rlfleet-train`` with its defaults solves CartPole-v1 against a local fleet."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_defaults_reach_the_cartpole_target_within_budget(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps.ppo",
            "--seed",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reached_target"] is True, summary
    assert summary["final_return"] >= 475.0
    assert summary["frames"] < summary["settings"]["total_frames"]
    assert summary["episodes"] >= 20
