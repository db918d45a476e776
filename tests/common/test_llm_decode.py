"""The decode loop: exact behaviour log-probs, parity with transformers' greedy search, settings."""

from __future__ import annotations

import pytest
import torch

from common.llm import (
    GenerationSettings,
    LLMSettings,
    build_policy,
    cached_forward,
    generate,
    response_log_probs,
)
from common.llm._decode import cache_keyword
from common.llm._settings import MIN_TEMPERATURE

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=2, seed=3)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in ("1+2=", "a longer question here", "x")
    ]  # fmt: skip
    return model, tok, prompts


def _forward(model):
    def forward(ids, mask, positions, past):
        with torch.no_grad():
            return (*cached_forward(model, ids, mask, positions, past), 7)

    return forward


def _full(prompts, generation, pad):
    width = max(len(p) for p in prompts) + generation.tokens.shape[1]
    full = torch.full((len(prompts), width), pad)
    for i, prompt in enumerate(prompts):
        n = int(generation.lengths[i])
        full[i, : len(prompt)] = torch.tensor(prompt)
        full[i, len(prompt) : len(prompt) + n] = generation.tokens[i, :n]
    return full, torch.tensor([len(p) for p in prompts])


@pytest.mark.parametrize(
    "settings",
    [
        GenerationSettings(max_new_tokens=8, temperature=0),
        GenerationSettings(max_new_tokens=8, temperature=0.7),
        GenerationSettings(max_new_tokens=8, temperature=1.0, top_p=0.8),
        GenerationSettings(max_new_tokens=8, temperature=1.3, top_k=7),
    ],
    ids=["greedy", "temperature", "top_p", "top_k"],
)
def test_recorded_log_probs_match_a_learner_forward_pass(tiny, settings) -> None:
    model, tok, prompts = tiny
    generation = generate(
        _forward(model), prompts, settings, budgets=[8, 3, 8], stop_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert generation.lengths.tolist() == [8, 3, 8]
    assert (generation.versions[generation.log_probs != 0] == 7).all()
    full, prompt_len = _full(prompts, generation, tok.pad_token_id)
    with torch.no_grad():
        recomputed = response_log_probs(model, full, prompt_len, generation.lengths, settings)
    torch.testing.assert_close(recomputed, generation.log_probs, atol=1e-4, rtol=0)
    assert torch.isfinite(generation.log_probs).all()
    assert (generation.log_probs <= 0).all()


def test_greedy_equals_transformers_greedy_search(tiny) -> None:
    model, tok, prompts = tiny
    settings = GenerationSettings(max_new_tokens=6, temperature=0)
    generation = generate(
        _forward(model), prompts, settings, budgets=[6] * 3, stop_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id,
    )  # fmt: skip
    for i, prompt in enumerate(prompts):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
        assert generation.tokens[i].tolist() == ref[0, len(prompt) :].tolist()


class _OlderTransformersLM(torch.nn.Module):
    """A causal LM whose cache argument has the name it had before transformers 5.24."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.name = cache_keyword(type(model))  # the installed transformers' own name

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache,
                logits_to_keep):  # fmt: skip
        out = self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=use_cache, logits_to_keep=logits_to_keep, **{self.name: past_key_values},
        )  # fmt: skip
        return {"logits": out.logits, "past_key_values": out[self.name]}


def test_cached_forward_takes_either_name_of_the_cache_argument(tiny) -> None:
    model, tok, prompts = tiny
    settings = GenerationSettings(max_new_tokens=5, temperature=0)

    def run(lm):
        def forward(ids, mask, positions, past):
            with torch.no_grad():
                return (*cached_forward(lm, ids, mask, positions, past), 0)

        return generate(forward, prompts, settings, budgets=[5] * 3, stop_ids=[],
                        pad_id=tok.pad_token_id).tokens  # fmt: skip

    assert torch.equal(run(_OlderTransformersLM(model)), run(model))


def test_stop_tokens_end_a_response_and_are_included(tiny) -> None:
    model, tok, prompts = tiny
    settings = GenerationSettings(max_new_tokens=8, temperature=0)
    free = generate(
        _forward(model), prompts[:1], settings, budgets=[8], stop_ids=[], pad_id=tok.pad_token_id
    )
    stop = int(free.tokens[0, 2])
    cut = generate(
        _forward(model), prompts[:1], settings, budgets=[8], stop_ids=[stop],
        pad_id=tok.pad_token_id,
    )  # fmt: skip
    first = free.tokens[0].tolist().index(stop) + 1
    assert cut.lengths.tolist() == [first]
    assert bool(cut.stopped[0])
    assert cut.tokens[0, :first].tolist() == free.tokens[0, :first].tolist()


def test_sampling_is_reproducible_with_a_seeded_generator(tiny) -> None:
    model, tok, prompts = tiny
    settings = GenerationSettings(max_new_tokens=5, temperature=1.0)
    runs = [
        generate(
            _forward(model), prompts, settings, budgets=[5] * 3, stop_ids=[],
            pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(9),
        ).tokens
        for _ in range(2)
    ]  # fmt: skip
    assert torch.equal(runs[0], runs[1])


def test_top_k_one_is_greedy_with_log_prob_zero(tiny) -> None:
    model, _tok, prompts = tiny
    greedy = GenerationSettings(max_new_tokens=4, temperature=0)
    top1 = GenerationSettings(max_new_tokens=4, temperature=1.0, top_k=1)
    a = generate(_forward(model), prompts, greedy, budgets=[4] * 3, stop_ids=[], pad_id=0)
    b = generate(_forward(model), prompts, top1, budgets=[4] * 3, stop_ids=[], pad_id=0)
    assert torch.equal(a.tokens, b.tokens)
    assert (b.log_probs == 0).all()


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2**64 - 1}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop_token_ids": [-1]}, "stop token"),
        ({"stop_token_ids": 5}, r"stop_token_ids must be a list of token ids, got 5"),
        ({"stop_token_ids": None}, r"stop_token_ids must be a list of token ids, got None"),
        ({"do_sample": True}, "unknown generation keys"),
    ],
)
def test_generation_settings_raise_if_out_of_range(values, match) -> None:
    with pytest.raises(ValueError, match=match):
        GenerationSettings.from_mapping(values)


@pytest.mark.parametrize("values", [GenerationSettings(max_new_tokens=4), "max_new_tokens=4"])
def test_generation_settings_raise_if_not_given_a_mapping(values) -> None:
    """``generation=`` takes a dict: anything else names what to pass, not a failed ``dict()``."""
    with pytest.raises(TypeError, match=r"generation must be a dict such as \{'max_new_tokens'"):
        GenerationSettings.from_mapping(values)


def test_the_lowest_sampling_temperature_samples_and_anything_below_it_is_refused() -> None:
    lowest = GenerationSettings(temperature=MIN_TEMPERATURE)
    assert not lowest.greedy
    assert GenerationSettings(temperature=0).greedy
    with pytest.raises(ValueError, match=r"0 \(greedy\) or at least 0\.01, got 0\.0099"):
        GenerationSettings(temperature=0.0099)


@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_generation_settings_raise_if_a_number_is_a_bool(name) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a number, got True"):
        GenerationSettings.from_mapping({name: True})


def test_llm_settings_refuse_a_group_of_zero_and_only_last_steps_are_trajectories() -> None:
    with pytest.raises(ValueError, match=r"group_size must be an int in \[1, 65536\], got 0"):
        LLMSettings(group_size=0)
    assert LLMSettings(yield_only_last_steps=True).trajectories
    assert LLMSettings(yield_completed_trajectories=True).trajectories
    assert not LLMSettings().trajectories


def test_a_row_past_its_budget_records_no_version_and_no_log_prob(tiny) -> None:
    model, tok, prompts = tiny
    settings = GenerationSettings(max_new_tokens=4, temperature=0)
    out = generate(
        _forward(model), prompts[:2], settings, budgets=[1, 4], stop_ids=[], pad_id=tok.pad_token_id
    )
    assert out.lengths.tolist() == [1, 4]
    assert out.versions.tolist() == [[7, 0, 0, 0], [7, 7, 7, 7]]
    assert out.log_probs[0, 1:].tolist() == [0.0, 0.0, 0.0]
