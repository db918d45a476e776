"""``rlfleet-grpo`` with its defaults teaches the tiny model one-digit sums within 3 minutes."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUDGET_S = 180


# Measured (docs/grpo.md): seed 0 reaches 0.9 in 225 updates, 82 s at load ~1.6 and 106 s
# at load ~3.5; seeds 1 and 2 in 48-66 s and 164 s (seed 2 missed once, at 0.89, at load ~4).
@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 120)
def test_grpo_defaults_reach_0_9_greedy_accuracy_on_arith_within_3_minutes(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps.grpo",
            "--task",
            "arith",
            "--max-seconds",
            str(BUDGET_S),
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUDGET_S + 90,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reached_target"] is True, {k: summary[k] for k in ("accuracy", "steps")}
    assert summary["accuracy"] >= 0.9
    assert summary["wall_time_s"] <= BUDGET_S
    assert summary["policy_lag_max"] == 0
