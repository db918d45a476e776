"""Smoke test of ``bench.hosts``: ``--quick`` runs end to end on the host test bed.

Real actors in network namespaces, the learner in its own; only the shape of the
output is checked (timings never). Skips with the reason where no bed can be made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hosts"))

from testbed import sweep, unavailable  # noqa: E402 (tests/hosts is not a package)

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def quick_payload() -> dict:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.hosts", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1])


def test_hosts_quick_reports_links_latency_and_pushes(quick_payload: dict) -> None:
    payload = quick_payload
    assert payload["bench"] == "hosts"
    assert payload["quick"] is True
    assert payload["skipped"] == {}
    figures = payload["figures"]
    for workload in ("cartpole sync", "cartpole async", "pixels sync", "pixels async"):
        for what, unit in (("frames/s", "frames/s"), ("wire bytes/frame", "B")):
            figure = figures[f"{workload} @100mbit {what}"]
            assert figure["unit"] == unit
            assert len(figure["samples"]) == 1
            assert figure["median"] > 0
        assert figures[f"{workload} @100mbit link fraction"]["median"] > 0
    assert "cartpole sync prefetch=2 delay=0ms frames/s" in figures
    assert "cartpole sync prefetch=2 delay=5ms frames/s" in figures
    for route in ("direct", "relayed"):
        assert figures[f"push to 2 @100mbit {route} s"]["median"] > 0
    assert figures["push to 1 direct floor s"]["median"] > 0
    assert figures["push relayed fallbacks"]["median"] == 0  # 9 MB: relayed, and whole
    # Bytes, not time: relayed, the learner's link carries the blob once, direct twice.
    assert figures["push to 2 @100mbit relayed learner/payload bytes"]["median"] < 1.5
    assert figures["push to 2 @100mbit direct learner/payload bytes"]["median"] > 1.9
    assert set(payload["ratios"]) == {
        "prefetch=2 5ms/0ms",
        "push to 1 direct/floor",
        "push to 2 direct/push to 1",
        "push to 2 relayed/push to 1",
    }
    names = {target["name"] for target in payload["targets"]}
    assert names == {
        "prefetch=2, 5 ms each way: >= 0.9x 0 ms",
        "push to 1 actor @100mbit: <= 1.3x the floor",
    }
    assert all(isinstance(target["met"], bool) for target in payload["targets"])


def test_hosts_quick_leaves_no_namespace(quick_payload: dict) -> None:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    mine = [line for line in listed.stdout.splitlines() if line.startswith("rlfh-")]
    # Another bed may be alive on a shared machine: only dead owners' leftovers count.
    assert sweep() == [], mine
