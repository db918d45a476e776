"""The GPU LLM benchmark's CPU smoke run: every system runs, figures and ratios come out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("transformers")


@pytest.mark.slow
def test_gpu_llm_smoke_run_reports_every_system(tmp_path: Path) -> None:
    out = tmp_path / "gpu_llm.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.gpu_llm", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload == json.loads(run.stdout.strip().splitlines()[-1])
    assert payload["bench"] == "gpu_llm"
    assert payload["quick"]
    figures = set(payload["figures"]) | set(payload["skipped"])
    assert figures == {
        "rlfleet actor",
        "rlfleet decode loop in-process",
        "HF generate static cache",
        "HF generate static, eager",
        "torchrl LLMCollector",
    }
    for name in ("rlfleet actor", "rlfleet decode loop in-process", "HF generate static cache"):
        assert payload["figures"][name]["median"] > 0, name
    assert "rlfleet / HF static" in payload["ratios"]
    assert all(reason.startswith("unavailable: ") for reason in payload["skipped"].values())
