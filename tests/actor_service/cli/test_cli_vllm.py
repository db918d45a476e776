"""``rlfleet-actor --engine vllm``: its flags, their rules, and what exits 2 before binding."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from actor_service import parse_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
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


def test_cli_takes_the_whole_gpu_for_vllm_and_nothing_above() -> None:
    config = parse_config([*LLM, "--engine", "vllm", "--gpu-memory-utilization", "1.0"], {})
    assert config.gpu_memory_utilization == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "vllm", "--kind", "env"], "needs kind 'llm'"),
        ([*LLM, "--max-model-len", "64"], "max_model_len configure vLLM: they need engine"),
        ([*LLM, "--engine", "vllm", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
        ([*LLM, "--engine", "vllm", "--enable-prefix-caching", "maybe"], "true or false"),
        ([*LLM, "--engine", "tgi"], "transformers, vllm"),
        ([*LLM, "--engine", "vllm", "--lora", "r=1024,targets=q_proj"], "LoRA ranks up to 512"),
    ],
)
def test_cli_exits_2_on_bad_vllm_flags(argv, message, capsys) -> None:
    if "--lora" in argv:
        pytest.importorskip("peft")
    assert message in _exits_2(argv, capsys)


def test_cli_takes_lora_with_the_vllm_engine() -> None:
    pytest.importorskip("peft")
    from common.llm import LoraSpec

    config = parse_config([*LLM, "--engine", "vllm", "--lora", "r=4,targets=q_proj,v_proj"], {})
    assert (config.engine, config.lora) == ("vllm", LoraSpec(r=4, targets=("q_proj", "v_proj")))


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


@pytest.mark.vllm
def test_a_lora_target_vllm_serves_no_adapter_on_exits_2() -> None:
    # lm_head is a linear layer to peft and the decode loop, an embedding to vLLM.
    pytest.importorskip("peft")
    kwargs = '{"hidden": 128, "heads": 2, "layers": 1}'
    argv = ["--engine", "vllm", "--policy-kwargs", kwargs, "--lora", "r=4,targets=q_proj,lm_head"]
    out = _actor(argv)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "lora targets ['lm_head'] are modules vLLM serves no LoRA adapter on" in out.stderr
    assert "ready" not in out.stdout


#: A tiny model vLLM's CPU attention takes (head size 64).
VLLM_TINY = {"hidden": 128, "heads": 2, "layers": 1, "seed": 0}


def _fleet_batches(monkeypatch, policy_kwargs: dict, extra: list[str]):
    """A one-actor ``--engine vllm`` fleet and a sync, greedy, padded collector on it."""
    from learner_client import GrpcLLMCollector, LocalFleet

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    fleet = LocalFleet(
        1, kind="llm", task="arith", policy_kwargs=policy_kwargs, num_envs=4, seed=0,
        grace_period=1.0, start_timeout=300.0, extra_args=["--engine", "vllm", *extra],
    )  # fmt: skip
    with fleet:
        collector = GrpcLLMCollector(
            fleet.addresses, dialog_turns_per_batch=4, total_dialog_turns=-1, sync=True,
            layout="padded", generation={"max_new_tokens": 8, "temperature": 0.0},
            batch_timeout=120.0, track_policy_version=True,
        )  # fmt: skip
        with collector:
            yield collector


def _actor_weights(collector) -> tuple[int, dict]:
    from common.actor_state import decode_state

    state = decode_state(bytes(collector.state_dict()["workers"][0].numpy()))
    return state["models"]["policy"]["version"], state["models"]["policy"]["weights"]


def _recomputed(model, td):
    from common.llm import GenerationSettings, response_log_probs

    settings = GenerationSettings(max_new_tokens=8, temperature=0.0)
    with torch.no_grad():
        return response_log_probs(
            model, td["tokens"], td["prompt_len"], td["response_len"], settings
        )


#: How far bfloat16 log-probs may drift from a float32 pass over the same bf16 weights: the
#: activations are rounded too (measured on this CPU: mean ~0.02 nat, the worst token ~0.12).
BF16_MEAN, BF16_MAX = 0.05, 0.25


def _assert_log_probs_near(td, reference, mean: float, most: float) -> None:
    recomputed = _recomputed(reference, td)
    span = recomputed.shape[1]
    mask = torch.arange(span) < td["response_len"][:, None]
    error = (td["log_probs"][:, :span] - recomputed).abs()[mask]
    assert error.numel() > 0
    assert float(error.mean()) <= mean, error
    assert float(error.max()) <= most, error


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_a_bfloat16_actor_serves_and_a_bfloat16_push_lands_in_vllm(monkeypatch) -> None:
    from common.llm import build_policy

    bf16 = {**VLLM_TINY, "dtype": "bfloat16"}
    learner, _ = build_policy("rlfleet:tiny-qwen2", **{**VLLM_TINY, "seed": 5})
    for collector in _fleet_batches(monkeypatch, bf16, []):
        batches = iter(collector)
        assert int(next(batches)["response_len"].sum()) > 0  # version 0, in bfloat16
        version = max(collector.update_policy_weights_(learner, dtype=torch.bfloat16).values())
        td = next(batches).reshape(-1)
        got_version, weights = _actor_weights(collector)
    assert got_version == version
    assert (td["policy_version"] == version).all()
    for key, value in learner.state_dict().items():  # the host copy: the push, bit for bit
        assert torch.equal(weights[key], value.to(torch.bfloat16)), key
    # vLLM read the pushed tensors back before the version moved (else INTERNAL); what it
    # serves is the pushed model up to bfloat16 arithmetic.
    reference = learner.to(torch.bfloat16).to(torch.float32)
    _assert_log_probs_near(td, reference, BF16_MEAN, BF16_MAX)


@pytest.mark.vllm
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("dtype", "mean", "most"), [("float32", 1e-4, 1e-4), ("bfloat16", BF16_MEAN, BF16_MAX)]
)
def test_lora_through_the_command_line_takes_an_adapter_push(monkeypatch, dtype, mean, most):
    pytest.importorskip("peft")
    from common.llm import apply_lora, build_policy

    lora = "r=4,targets=q_proj,v_proj"
    learner = apply_lora(build_policy("rlfleet:tiny-qwen2", **VLLM_TINY)[0], lora)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in learner.parameters():
            if parameter.requires_grad:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    actor = {**VLLM_TINY, "dtype": dtype}
    for collector in _fleet_batches(monkeypatch, actor, ["--lora", lora]):
        version = max(collector.update_policy_weights_(learner, only_trainable=True).values())
        td = next(iter(collector)).reshape(-1)
    assert (td["policy_version"] == version).all()
    # float32: the decode loop's log-probs; bfloat16: up to bf16 arithmetic (the adapter
    # itself was read back from vLLM's slots bit for bit).
    reference = learner.to(getattr(torch, dtype)).to(torch.float32)
    _assert_log_probs_near(td, reference, mean, most)
