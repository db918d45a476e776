"""An LLM actor's model on its device: dtype by device, pushes landing there, no per-token sync.

Every test runs on the CPU; the ``cuda`` variants (and the CUDA-only tests) skip where
torch sees no CUDA device.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from actor_service._kinds.llm.models import LLMModels
from common.llm import GenerationSettings, generate, parse_lora
from common.llm._device import model_dtype
from common.weights import PushForm, decode_delta, decode_weights, encode_delta, encode_weights

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 1}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _prefill(models: LLMModels) -> torch.Tensor:
    ids = torch.tensor([[1, 2, 3]], device=models.device)
    mask = torch.ones_like(ids)
    logits, _, _ = models.forward(ids, mask, mask.cumsum(-1) - 1, None)
    return logits


@pytest.mark.parametrize("device", DEVICES)
def test_llm_models_hold_the_model_in_their_devices_default_dtype(device: str) -> None:
    models = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device(device))
    expected = model_dtype(None, device)
    assert {(p.device.type, p.dtype) for p in models.model.parameters()} == {(device, expected)}
    logits = _prefill(models)  # logits stay where the model is, in its dtype
    assert (logits.device.type, logits.dtype) == (device, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_llm_models_take_the_dtype_kwarg_over_the_default(device: str) -> None:
    other = "float32" if device == "cuda" else "bfloat16"
    models = LLMModels("rlfleet:tiny-qwen2", {**TINY, "dtype": other}, torch.device(device))
    assert {p.dtype for p in models.model.parameters()} == {model_dtype(other, device)}


@pytest.mark.parametrize("device", DEVICES)
def test_full_and_delta_pushes_land_on_the_device_in_the_models_dtype(device: str) -> None:
    models = LLMModels("rlfleet:tiny-qwen2", {**TINY, "dtype": "bfloat16"}, torch.device(device))
    learner = LLMModels("rlfleet:tiny-qwen2", {**TINY, "seed": 5}, torch.device("cpu")).model
    blob = encode_weights(learner, dtype=torch.bfloat16)  # what update_policy_weights_ sends
    state, metadata = decode_weights(blob)
    assert models.load_weights("policy", 1, state, PushForm.from_metadata(metadata)) == 1
    live = models.model.state_dict()
    for key, value in learner.state_dict().items():
        assert live[key].device.type == device
        assert torch.equal(live[key].cpu(), value.to(torch.bfloat16)), key
    old = {k: v.cpu() for k, v in live.items()}
    new = {k: v.clone() for k, v in old.items()}
    new["model.norm.weight"][:3] = 2.0
    expected = {k: (tuple(v.shape), v.dtype) for k, v in old.items()}
    delta = decode_delta(memoryview(encode_delta(old, new)), expected, max_bytes=1 << 30)
    assert models.swap_delta("policy", 1, 2, delta).version == 2
    norm = models.model.state_dict()["model.norm.weight"]
    assert norm.device.type == device
    assert norm[:3].tolist() == [2.0] * 3


@pytest.mark.parametrize("device", DEVICES)
def test_an_adapter_push_lands_on_the_device(device: str) -> None:
    pytest.importorskip("peft")
    lora = parse_lora("r=2,targets=q_proj,v_proj")
    models = LLMModels("rlfleet:tiny-qwen2", TINY, torch.device(device), lora)
    adapter = {
        k: torch.full_like(v, 0.5).cpu()
        for k, v in models.model.state_dict().items()
        if ".lora_" in k
    }
    assert models.load_weights("policy", 1, adapter, PushForm(subset=True)) == 1
    live = models.model.state_dict()
    for key in adapter:
        assert live[key].device.type == device
        assert (live[key] == 0.5).all(), key


class _Toy(torch.nn.Module):
    """A stand-in LM: embeddings to logits, a cache that counts tokens (no HF mask logic)."""

    def __init__(self, vocab: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, ids, mask, positions, past):
        return self.head(self.embed(ids[:, -1])), (past or 0) + ids.shape[1], 0


@pytest.mark.cuda
def test_the_decode_loop_synchronises_no_more_for_more_tokens() -> None:
    """Per token, nothing waits for the GPU: the syncs of a call do not grow with its tokens."""
    toy = _Toy().cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)

    def syncs(tokens: int) -> int:
        settings = GenerationSettings(max_new_tokens=tokens, temperature=1.0, top_p=0.9)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                generate(
                    toy, [[1, 2, 3], [4, 5]], settings, budgets=[tokens, tokens], stop_ids=[],
                    pad_id=0, generator=generator, device="cuda",
                )  # fmt: skip
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    syncs(4)  # warm-up (lazy CUDA initialisation)
    assert syncs(4) == syncs(32)


@pytest.mark.parametrize(
    ("prompts", "budgets", "match"),
    [
        ([], [], "at least one prompt"),
        ([[1, 2]], [2, 2], "one budget per prompt"),
        ([[1, 2], []], [2, 2], r"row 1: a prompt needs at least one token \(0\)"),
        ([[1, 2], [3]], [2, 0], r"row 1: .* at least one new token \(0\)"),
        ([[1, 2]], [-5], r"row 0: .*\(-5\)"),
    ],
)
def test_the_decode_loop_refuses_rows_it_cannot_honour(prompts, budgets, match) -> None:
    """A budget of 0 would still draw one token; an empty prompt has nothing to attend to."""
    settings = GenerationSettings(max_new_tokens=2)
    with pytest.raises(ValueError, match=match):
        generate(_Toy(), prompts, settings, budgets=budgets, stop_ids=[], pad_id=0)


def test_the_decode_loop_keeps_each_rows_budget_down_to_one_token() -> None:
    settings = GenerationSettings(max_new_tokens=3)
    out = generate(_Toy(), [[1, 2], [3]], settings, budgets=[1, 3], stop_ids=[], pad_id=0)
    assert out.lengths.tolist() == [1, 3]
