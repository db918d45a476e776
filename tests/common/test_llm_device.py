"""The decode loop where the model is: dtypes by device, the lagged stop check, the draws."""

from __future__ import annotations

import pytest
import torch

from common.llm import (
    GenerationSettings,
    build_policy,
    cached_forward,
    default_dtype,
    generate,
    response_log_probs,
)
from common.llm._decode import _multinomial
from common.llm._device import AllFinished, model_dtype

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")


def _prompts(tok) -> list[list[int]]:
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in ("1+2=", "a longer question here", "x", "what is 7*8?")
    ]  # fmt: skip


def _forward(model, seen: list | None = None):
    def forward(ids, mask, positions, past):
        if seen is not None:
            seen.append({t.device for t in (ids, mask, positions)})
        with torch.no_grad():
            return (*cached_forward(model, ids, mask, positions, past), 0)

    return forward


def test_default_dtype_is_bf16_on_cuda_and_float32_elsewhere() -> None:
    assert default_dtype("cuda") == default_dtype(torch.device("cuda:1")) == "bfloat16"
    assert default_dtype("cpu") == "float32"
    assert model_dtype(None, "cuda") is torch.bfloat16
    assert model_dtype("float32", "cuda") is torch.float32


def test_model_dtype_raises_if_the_name_is_unknown() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        model_dtype("float16", "cpu")


def test_all_finished_reads_at_once_without_lag_and_one_step_late_with_it() -> None:
    on, off = torch.tensor([True, False]), torch.tensor([False, False])
    now = AllFinished(torch.device("cpu"))
    assert now.lag == 0
    assert [now(on), now(off)] == [False, True]
    late = AllFinished(torch.device("cpu"), lag=1)
    assert [late(on), late(off), late(off)] == [False, False, True]


def test_all_finished_raises_if_the_lag_is_not_zero_or_one() -> None:
    with pytest.raises(ValueError, match="lag must be 0 or 1"):
        AllFinished(torch.device("cpu"), lag=2)


def test_the_draw_is_torch_multinomial_on_the_cpu() -> None:
    for seed in range(20):
        probs = torch.softmax(
            torch.randn(6, 200, generator=torch.Generator().manual_seed(seed)), -1
        )
        theirs = torch.Generator().manual_seed(seed)
        ours = torch.Generator().manual_seed(seed)
        expected = torch.multinomial(probs, 1, generator=theirs).squeeze(-1)
        assert torch.equal(_multinomial(probs, ours), expected)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lagged_finish_check_gives_the_same_responses(temperature: float) -> None:
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=2, seed=3)
    settings = GenerationSettings(max_new_tokens=12, temperature=temperature)
    results = []
    for lag in (0, 1):
        seen: list = []
        results.append(
            generate(
                _forward(model, seen), _prompts(tok), settings, budgets=[12, 3, 12, 7],
                stop_ids=range(60, 200), pad_id=tok.pad_token_id, finish_lag=lag,
                generator=torch.Generator().manual_seed(0), device="cpu",
            )
        )  # fmt: skip
        assert seen
        assert all(devices == {torch.device("cpu")} for devices in seen)
    now, late = results
    assert now.stopped.any()
    if temperature:
        assert int(now.lengths.max()) < 12  # every row stopped early: the lag ran a step more
    for field in ("tokens", "lengths", "log_probs", "versions", "stopped"):
        assert torch.equal(getattr(now, field), getattr(late, field)), field


def test_a_bf16_model_is_the_float32_model_cast() -> None:
    full, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    half, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, dtype="bfloat16")
    for (key, a), b in zip(full.state_dict().items(), half.state_dict().values(), strict=True):
        assert b.dtype is torch.bfloat16, key
        assert torch.equal(a.to(torch.bfloat16), b), key


def test_bf16_log_probs_match_a_bf16_learner_within_the_documented_tolerance() -> None:
    """docs/llm.md: a bf16 decode and a bf16 learner forward differ by ~0.03 nats (mean)."""
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=256, layers=4, dtype="bfloat16")
    prompts = _prompts(tok)
    settings = GenerationSettings(max_new_tokens=32, temperature=1.0)
    generation = generate(
        _forward(model), prompts, settings, budgets=[32] * 4, stop_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    width = max(len(p) for p in prompts) + generation.tokens.shape[1]
    full = torch.full((len(prompts), width), tok.pad_token_id)
    for row, prompt in enumerate(prompts):
        n = int(generation.lengths[row])
        full[row, : len(prompt)] = torch.tensor(prompt)
        full[row, len(prompt) : len(prompt) + n] = generation.tokens[row, :n]
    prompt_len = torch.tensor([len(p) for p in prompts])
    with torch.no_grad():
        learner = response_log_probs(model, full, prompt_len, generation.lengths, settings)
    valid = torch.arange(learner.shape[1])[None] < generation.lengths[:, None]
    gap = (learner - generation.log_probs).abs()[valid]
    assert gap.mean() < 0.1
    assert gap.max() < 0.75
