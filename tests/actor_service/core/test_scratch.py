"""Scratch folders of actor processes: named after their process, swept once it is gone."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from actor_service._core._scratch import scratch_dir, sweep_scratch
from common.leftovers import writer_tag


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_killed_actors_scratch_is_swept_and_a_live_ones_kept(tmp_path: pathlib.Path) -> None:
    dead = tmp_path / f"rlfleet-scratch-{_dead_pid()}-vllm-abc"
    live = tmp_path / f"rlfleet-scratch-{os.getpid()}-vllm-lora-def"
    unrelated = tmp_path / "rlfleet-vllm-check-xyz"  # not a scratch folder: never touched
    for folder in (dead, live, unrelated):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "model.safetensors").write_bytes(b"x" * 1024)
    assert sweep_scratch(str(tmp_path)) == [str(dead)]
    assert not dead.exists()
    assert live.exists()
    assert unrelated.exists()
    assert sweep_scratch(str(tmp_path)) == []


def test_scratch_dir_names_this_process(monkeypatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    left = tmp_path / f"rlfleet-scratch-{_dead_pid()}-vllm-old"
    left.mkdir()
    path = pathlib.Path(scratch_dir("vllm"))
    assert path.parent == tmp_path
    assert path.name.startswith(f"rlfleet-scratch-{writer_tag(str(tmp_path))}-vllm-")
    assert not left.exists()  # a new folder sweeps first
