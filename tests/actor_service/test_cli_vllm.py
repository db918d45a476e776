"""``rlfleet-actor --engine vllm``: its flags, their rules, and what exits 2 before binding."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from actor_service import parse_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
LLM = ["--kind", "llm", "--port", "0"]


def _exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_config(argv, {})
    assert info.value.code == 2
    return capsys.readouterr().err


def test_cli_reads_the_vllm_flags_and_variables() -> None:
    config = parse_config(
        [*LLM, "--engine", "vllm", "--max-model-len", "256", "--gpu-memory-utilization", "0.5"],
        {"RLFLEET_ENABLE_PREFIX_CACHING": "true"},
    )
    assert (config.engine, config.max_model_len, config.gpu_memory_utilization) == (
        "vllm", 256, 0.5,
    )  # fmt: skip
    assert config.enable_prefix_caching is True
    assert parse_config(LLM, {}).engine == "transformers"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "--kind", "env"], "needs kind 'llm'"),
        ([*LLM, "--max-model-len", "64"], "max_model_len configure vLLM: they need engine"),
        ([*LLM, "--engine", "vllm", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
        ([*LLM, "--engine", "vllm", "--enable-prefix-caching", "maybe"], "true or false"),
        ([*LLM, "--engine", "tgi"], "transformers, vllm"),
        ([*LLM, "--engine", "vllm", "--lora", "r=4,targets=q_proj"], "does not take lora"),
    ],
)
def test_cli_exits_2_on_bad_vllm_flags(argv, message, capsys) -> None:
    assert message in _exits_2(argv, capsys)


def _actor(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "actor_service", *LLM, *args],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT,
    )  # fmt: skip


def test_engine_vllm_without_vllm_exits_2_naming_the_install(tmp_path) -> None:
    shadow = tmp_path / "vllm"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('No module named vllm (shadowed)')\n")
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = _actor(["--engine", "vllm"], {**os.environ, "PYTHONPATH": path})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "scripts/vllm_venv.sh" in out.stderr
    assert "ready" not in out.stdout


@pytest.fixture
def checkpoint(tmp_path) -> str:
    pytest.importorskip("transformers")
    from common.llm import build_policy

    model, tokenizer = build_policy("rlfleet:tiny-qwen2", hidden=128, heads=2, layers=1)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    return str(tmp_path / "ckpt")


@pytest.mark.vllm
def test_a_checkpoint_vllm_refuses_exits_2_with_vllms_reason(checkpoint) -> None:
    out = _actor(["--engine", "vllm", "--policy", f"hf:{checkpoint}", "--max-model-len", "4096"])
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot serve" in out.stderr
    assert "max_model_len" in out.stderr  # vLLM's own words: longer than the model's 512
    assert "ready" not in out.stdout


@pytest.mark.vllm
def test_a_head_size_vllm_cannot_run_on_the_cpu_exits_2() -> None:
    out = _actor(["--engine", "vllm", "--policy-kwargs", '{"hidden": 64, "heads": 4}'])
    assert out.returncode == 2, out.stderr[-2000:]
    assert "head size 16" in out.stderr
    assert "ready" not in out.stdout
