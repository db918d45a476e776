"""The static-cache decode forward (``--decode static|compiled``) against the default one.

Every case runs the same prompts through :func:`common.llm.generate` twice, once with the
growing cache (``eager``) and once with :class:`common.llm.StaticDecode`, and holds the
tokens equal and the log-probs equal to float rounding; pushes copied into the model
between two generations reach the static path too. The compiled step (``torch.compile``
on the CPU takes tens of seconds) is a slow test; on CUDA it is a ``cuda`` test.
"""

from __future__ import annotations

import pytest
import torch

from actor_service._kinds.llm.models import LLMModels
from common.llm import GenerationSettings, StaticDecode, generate
from common.llm._static import WIDTH_STEP
from common.weights import PushForm, decode_weights, encode_weights

pytest.importorskip("transformers")

TINY = {"hidden": 32, "layers": 2}
GREEDY = GenerationSettings(max_new_tokens=12, temperature=0.0)
SAMPLED = GenerationSettings(max_new_tokens=12, temperature=1.0, top_k=20)


def _prompts(rows: int, shift: int = 0) -> list[list[int]]:
    return [[5 + (row + shift) % 7 for _ in range(2 + row % 5)] for row in range(rows)]


def _run(models: LLMModels, prompts: list[list[int]], settings: GenerationSettings, seed: int):
    generator = torch.Generator(device=models.device).manual_seed(seed)
    return generate(
        models.forward,
        prompts,
        settings,
        budgets=[settings.max_new_tokens] * len(prompts),
        stop_ids=[],
        pad_id=0,
        generator=generator,
        device=models.device,
    )


def _assert_same(eager, static) -> None:
    assert torch.equal(eager.tokens, static.tokens)
    assert torch.equal(eager.lengths, static.lengths)
    assert torch.allclose(eager.log_probs, static.log_probs, atol=1e-4)


@pytest.mark.parametrize("spec", ["rlfleet:tiny-qwen2", "rlfleet:tiny-gpt2"])
@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_static_decode_draws_the_tokens_of_the_growing_cache(spec, settings) -> None:
    eager = LLMModels(spec, TINY, torch.device("cpu"))
    static = LLMModels(spec, TINY, torch.device("cpu"), decode="static")
    static.plan_generation(settings.max_new_tokens)
    static.model.load_state_dict(eager.model.state_dict())
    for rows, shift in [(6, 0), (6, 3), (3, 1), (9, 2)]:  # a cache reused, then rebuilt
        prompts = _prompts(rows, shift)
        _assert_same(_run(eager, prompts, settings, rows), _run(static, prompts, settings, rows))


def test_static_decode_sizes_its_cache_by_prompt_width_and_cap() -> None:
    models = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device("cpu"))
    decode = StaticDecode(models.model, 70)
    assert decode.width == 0
    ids = torch.tensor([[1, 2, 3]])
    mask = torch.ones_like(ids)
    logits, cache = decode(ids, mask, mask.cumsum(-1) - 1, None)
    assert logits.shape == (1, models.model.config.vocab_size)
    assert decode.width == 2 * WIDTH_STEP  # 3 + 70 rounded up to a multiple of 64
    assert cache is not None
    token = torch.tensor([[4]])
    for step in range(2 * WIDTH_STEP - 3):
        full = torch.ones(1, 4 + step, dtype=torch.long)
        decode(token, full, torch.tensor([[3 + step]]), cache)
    with pytest.raises(ValueError, match="longer than its static cache"):
        decode(token, torch.ones(1, 2 * WIDTH_STEP + 1, dtype=torch.long), token, cache)
    with pytest.raises(ValueError, match="max_new_tokens"):
        StaticDecode(models.model, 0)


def test_a_push_between_generations_reaches_the_static_decode() -> None:
    eager = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device("cpu"))
    static = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device("cpu"), decode="static")
    static.plan_generation(GREEDY.max_new_tokens)
    static.model.load_state_dict(eager.model.state_dict())
    prompts = _prompts(4)
    before = _run(static, prompts, GREEDY, 0)
    learner = LLMModels("rlfleet:tiny-qwen2", {**TINY, "seed": 9}, torch.device("cpu")).model
    for models in (eager, static):
        state, metadata = decode_weights(encode_weights(learner))
        models.load_weights("policy", 1, state, PushForm.from_metadata(metadata))
    after = _run(static, prompts, GREEDY, 0)
    _assert_same(_run(eager, prompts, GREEDY, 0), after)
    assert not torch.equal(before.tokens, after.tokens)
    assert (after.versions[after.tokens != 0] == 1).all()


@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.cuda)],
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_compiled_decode_draws_the_tokens_of_the_growing_cache_and_sees_pushes(device) -> None:
    torch._dynamo.reset()
    place = torch.device(device)
    kwargs = {**TINY, "dtype": "float32"}
    eager = LLMModels("rlfleet:tiny-qwen2", kwargs, place)
    compiled = LLMModels("rlfleet:tiny-qwen2", kwargs, place, decode="compiled")
    compiled.plan_generation(SAMPLED.max_new_tokens)
    compiled.model.load_state_dict(eager.model.state_dict())
    prompts = _prompts(6)
    _assert_same(_run(eager, prompts, SAMPLED, 1), _run(compiled, prompts, SAMPLED, 1))
    learner = LLMModels("rlfleet:tiny-qwen2", {**TINY, "seed": 9}, torch.device("cpu")).model
    for models in (eager, compiled):
        state, metadata = decode_weights(encode_weights(learner))
        models.load_weights("policy", 1, state, PushForm.from_metadata(metadata))
    _assert_same(_run(eager, prompts, GREEDY, 2), _run(compiled, prompts, GREEDY, 2))


def test_a_static_decode_actor_sizes_its_cache_by_the_planned_generation() -> None:
    static = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device("cpu"), decode="static")
    planned = GenerationSettings(max_new_tokens=WIDTH_STEP + 1, temperature=0.0)
    static.plan_generation(planned.max_new_tokens)
    assert _run(static, [[5, 6]], planned, 0).tokens.shape[1] == WIDTH_STEP + 1
    static.plan_generation(1)  # a 64-position cache: what is not planned does not fit
    longer = GenerationSettings(max_new_tokens=2 * WIDTH_STEP, temperature=0.0)
    with pytest.raises(ValueError, match="longer than its static cache"):
        _run(static, [[5, 6]], longer, 0)
