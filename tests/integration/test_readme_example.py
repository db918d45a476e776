"""The README's training-loop example runs as written."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.long

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_example_runs_and_prints_one_line_per_batch(tmp_path) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"## A training loop, in short\n\n```python\n(.*?)```", readme, re.S)
    assert match, "the README lost its training-loop example"
    script = tmp_path / "example.py"
    script.write_text(match.group(1))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 8  # total_frames / frames_per_batch
    assert all(line.startswith("torch.Size([2, 4, 32])") for line in lines)
    assert lines[-1].endswith(" 7")  # one push per batch, each applied (policy_version)


def test_docs_llm_opens_with_the_tested_readme_example() -> None:
    readme = (ROOT / "README.md").read_text()
    docs = (ROOT / "docs" / "llm.md").read_text()
    example = re.search(r"## LLM collection\n.*?```python\n(.*?)```", readme, re.S)
    first = re.search(r"```python\n(.*?)```", docs, re.S)
    assert example
    assert first
    assert first.group(1) == example.group(1)
