"""The ``--lora`` flag and the model-sized ``--max-weight-bytes`` default of the actor CLI."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from actor_service import ActorConfig, ModelSpec
from actor_service._cli._main import parse_config
from actor_service._kinds.llm.check import _check_lora, check
from actor_service._kinds.llm.settings import LLMActorSettings
from common.llm import LoraSpec, apply_lora, build_policy, parse_lora

LLM = ["--kind", "llm"]
ROOT = pathlib.Path(__file__).resolve().parents[3]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict | None = None) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, environ or {}, hostname="laptop")
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_cli_lora_flag_and_variable_build_a_lora_spec() -> None:
    pytest.importorskip("peft")
    config = parse_config([*LLM, "--lora", "r=16,targets=q_proj,v_proj"], {}, hostname="x")
    assert config.lora == LoraSpec(r=16, targets=("q_proj", "v_proj"))
    config = parse_config(LLM, {"RLFLEET_LORA": "r=8, targets=q_proj, alpha=32"}, hostname="x")
    assert config.lora == LoraSpec(r=8, targets=("q_proj",), alpha=32)
    assert parse_config(LLM, {}, hostname="x").lora is None
    assert str(parse_lora("r=4,targets=a,b,alpha=8")) == "r=4,targets=a,b,alpha=8"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("r=0,targets=q_proj", "lora r must be an int in 1..4096"),
        ("r=5000,targets=q_proj", "lora r must be an int in 1..4096"),
        ("r=x,targets=q_proj", "lora r must be an integer"),
        ("r=4,rank=3", "unknown field 'rank'"),
        ("r=4,r=5,targets=q", "r is given twice"),
        ("q_proj", "expected r=N,targets=A,B"),
        ("r=4,targets=", "is not a module name"),
        ("r=4,targets=q;rm -rf", "is not a module name"),
        ("r=4,targets=q,alpha=0", "lora alpha must be an int"),
    ],
)
def test_cli_raises_if_the_lora_spec_is_bad(
    capsys: pytest.CaptureFixture[str], value: str, needle: str
) -> None:
    message = _error(capsys, [*LLM, "--lora", value])
    assert "--lora" in message
    assert needle in message


def test_cli_raises_if_lora_is_given_to_an_env_actor(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    assert "needs kind 'llm'" in _error(capsys, ["--lora", "r=4,targets=q_proj"])


def test_cli_raises_if_peft_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "peft" else find_spec(name, *a),
    )
    message = _error(capsys, [*LLM, "--lora", "r=4,targets=q_proj"])
    assert "pip install 'rlfleet[lora]'" in message
    with pytest.raises(ValueError, match="peft"):
        ActorConfig(kind="llm", llm=LLMActorSettings(lora=LoraSpec()))


def test_max_weight_bytes_defaults_to_following_the_model() -> None:
    assert parse_config([], {}, hostname="x").max_weight_bytes is None
    assert parse_config(["--max-weight-bytes", "1000"], {}, hostname="x").max_weight_bytes == 1000
    with pytest.raises(ValueError, match="max_weight_bytes"):
        ActorConfig(max_weight_bytes=0)


def _actor(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actor_service", *LLM, "--port", "0", *argv],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.long
@pytest.mark.parametrize("spec", ["rlfleet:tiny-qwen2", "hf"])
def test_lora_targets_the_model_lacks_exit_2_before_binding(spec: str, tmp_path) -> None:
    # Checked on the model's skeleton (a checkpoint's config alone: its weights are not read).
    pytest.importorskip("peft")
    if spec == "hf":
        from common.llm import build_policy

        model, tokenizer = build_policy("rlfleet:tiny-qwen2", hidden=32, heads=2, layers=1)
        model.save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
        (tmp_path / "model.safetensors").write_bytes(b"")  # nothing of it may be read
        spec = f"hf:{tmp_path}"
    out = _actor(["--policy", spec, "--lora", "r=4,targets=q_proj,foo_proj"])
    assert out.returncode == 2, out.stderr[-2000:]
    assert "the model has no module named ['foo_proj']" in out.stderr
    assert "'q_proj'" in out.stderr  # what it could have named
    assert "listening" not in out.stdout + out.stderr


@pytest.mark.parametrize(("field", "low", "high"), [("r", 1, 4096), ("alpha", 1, 65536)])
def test_lora_r_and_alpha_are_taken_at_both_ends_and_refused_one_past(
    field: str, low: int, high: int
) -> None:
    for value in (low, high):
        assert getattr(parse_lora(f"{field}={value},targets=q_proj"), field) == value
    for value in (low - 1, high + 1):
        match = rf"lora {field} must be an int in {low}\.\.{high}, got {value}$"
        with pytest.raises(ValueError, match=match):
            parse_lora(f"{field}={value},targets=q_proj")


def test_lora_takes_64_targets_and_refuses_65() -> None:
    names = [f"m{i}" for i in range(65)]
    assert len(parse_lora("r=4,targets=" + ",".join(names[:64])).targets) == 64
    with pytest.raises(ValueError, match=r"lora targets must be a tuple of 1\.\.64 module names"):
        parse_lora("r=4,targets=" + ",".join(names))


def _tiny_lm() -> Any:
    pytest.importorskip("peft")
    return build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)[0]


def test_lora_without_alpha_scales_by_one_whatever_the_rank() -> None:
    wrapped = apply_lora(_tiny_lm(), "r=4,targets=q_proj")
    assert wrapped.peft_config["default"].lora_alpha == 4
    assert wrapped.base_model.model.model.layers[0].self_attn.q_proj.scaling == {"default": 1.0}


def test_lora_takes_a_target_by_its_full_dotted_name() -> None:
    wrapped = apply_lora(_tiny_lm(), "r=4,targets=model.layers.0.self_attn.q_proj")
    adapted = [n for n, _ in wrapped.named_modules() if n.endswith(".lora_A")]
    assert adapted == ["base_model.model.model.layers.0.self_attn.q_proj.lora_A"]


def test_lora_refuses_a_target_that_only_ends_a_module_name() -> None:
    # peft skips such a target silently when another one matches.
    with pytest.raises(ValueError, match=r"the model has no module named \['proj'\]"):
        apply_lora(_tiny_lm(), "r=4,targets=q_proj,proj")


def _lora_config(lora: str, engine: str = "transformers", **kwargs: Any) -> ActorConfig:
    model = ModelSpec("policy", "rlfleet:tiny-qwen2", {"hidden": 32, "heads": 2, **kwargs})
    llm = LLMActorSettings(lora=parse_lora(lora), engine=engine)
    return ActorConfig(kind="llm", models=(model,), llm=llm)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_the_start_check_takes_lm_head_as_a_target_of_our_own_decode_loop() -> None:
    # Only vLLM serves no adapter on the output head; --engine transformers adapts every linear one.
    pytest.importorskip("peft")
    check(_lora_config("r=4,targets=q_proj,lm_head"))


def test_the_start_check_builds_the_skeleton_with_the_policy_kwargs() -> None:
    # A layer only --policy-kwargs' layers=3 builds: the skeleton is not the default model.
    pytest.importorskip("peft")
    target = "r=4,targets=model.layers.2.self_attn.q_proj"
    check(_lora_config(target, layers=3))
    with pytest.raises(ValueError, match=r"no module named \['model\.layers\.2\.self_attn"):
        check(_lora_config(target, layers=2))


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_the_vllm_lora_check_refuses_lm_head_naming_the_linear_layers_it_serves() -> None:
    # The LoRA half of the vLLM start check reads the skeleton only: it runs without vLLM.
    pytest.importorskip("peft")
    _check_lora(_lora_config("r=4,targets=q_proj,o_proj,down_proj", engine="vllm"))
    served = "'down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'"
    match = (
        r"lora targets \['lm_head'\] are modules vLLM serves no LoRA adapter on; "
        rf"it serves them on \[{served}\] of this model$"
    )
    with pytest.raises(ValueError, match=match):
        _check_lora(_lora_config("r=4,targets=q_proj,lm_head", engine="vllm"))
