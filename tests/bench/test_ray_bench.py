"""``bench.ray_fleet``'s smoke run on a real local Ray head: both systems collect and push."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ray

pytest.importorskip("ray")

SYSTEMS = ("torchrl ray", "rlfleet ray")


def test_ray_bench_quick_run_reports_both_systems_side_by_side() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the Ray workers' actors import bench
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "bench.ray_fleet", "--quick"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    payload = json.loads(run.stdout.strip().splitlines()[-1])
    assert payload["bench"] == "ray_fleet"
    assert payload["quick"]
    expected = {f"{system} {what}" for system in SYSTEMS for what in ("sync", "async", "push")}
    assert set(payload["figures"]) == expected
    assert all(payload["figures"][name]["median"] > 0 for name in expected)
    assert set(payload["ratios"]) == {
        "rlfleet/torchrl ray sync",
        "rlfleet/torchrl ray async",
        "rlfleet/torchrl ray push time",
    }
