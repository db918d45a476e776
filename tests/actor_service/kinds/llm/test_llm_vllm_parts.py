"""The vLLM engine's pure parts, without vLLM: its settings, layouts, read-backs, adapter files.

These run in every venv (vLLM is imported by none of them): the engine's keyword
arguments, the checkpoint keys a push reloads as whole engine modules, the read-back of
a reloaded layer, the peft keys in vLLM's terms, and the adapter directories a push
leaves behind. The engine itself stands in for vLLM only where vLLM would be called.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from actor_service._kinds.llm.vllm_engine import VLLMOptions, _engine_kwargs, _padded
from actor_service._kinds.llm.vllm_lora import EngineAdapter, check_targets, checkpoint_names
from actor_service._kinds.llm.vllm_worker import (
    PROBE_COLUMNS,
    _reads_back,
    engine_module,
    load_groups,
    verify_loaded,
)

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN = "model.layers.0.self_attn"


def test_engine_kwargs_pass_every_vllm_knob_and_fit_the_seed_and_lora_rank() -> None:
    options = VLLMOptions(gpu_memory_utilization=0.5, max_model_len=256, enable_prefix_caching=True)
    kwargs = _engine_kwargs(torch.bfloat16, options, 2**40 + 3, lora_rank=9)
    assert kwargs["dtype"] == "bfloat16"
    assert (kwargs["gpu_memory_utilization"], kwargs["max_model_len"]) == (0.5, 256)
    assert kwargs["enable_prefix_caching"] is True
    assert kwargs["seed"] == 3
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 16, 1)
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["generation_config"] == "vllm"
    assert kwargs["async_scheduling"] is False
    plain = _engine_kwargs(torch.float32, VLLMOptions(), 7)
    assert plain["enable_prefix_caching"] is False
    assert plain["seed"] == 7
    assert not {"gpu_memory_utilization", "max_model_len", "enable_lora"} & set(plain)


def test_a_turns_rows_are_padded_with_their_lengths_versions_and_stops() -> None:
    out = _padded([[5, 6, 7], [8], []], [[-1.0, -2.0, -3.0], [-4.0], []], [[1, 1, 2], [2], []],
                  [True, False, False], pad_id=9)  # fmt: skip
    assert out.tokens.tolist() == [[5, 6, 7], [8, 9, 9], [9, 9, 9]]
    assert out.lengths.tolist() == [3, 1, 0]
    assert out.log_probs.tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert out.versions.tolist() == [[1, 1, 2], [2, 0, 0], [0, 0, 0]]
    assert out.stopped.tolist() == [True, False, False]
    assert _padded([], [], [], [], pad_id=0).tokens.shape == (0, 0)


def test_a_checkpoint_key_maps_onto_its_stacked_engine_module_and_shard() -> None:
    assert engine_module(f"{ATTN}.k_proj.weight", PACKED) == (f"{ATTN}.qkv_proj", "weight", 1)
    assert engine_module(f"{ATTN}.v_proj.bias", PACKED) == (f"{ATTN}.qkv_proj", "bias", 2)
    assert engine_module("model.layers.1.mlp.up_proj.weight", PACKED)[::2] == (
        "model.layers.1.mlp.gate_up_proj", 1,
    )  # fmt: skip
    assert engine_module("model.norm.weight", PACKED) == ("model.norm", "weight", 0)
    assert engine_module("k_proj.weight", PACKED) == ("qkv_proj", "weight", 1)


def test_a_push_reloads_every_tensor_of_each_module_it_touches_and_of_tied_ones() -> None:
    embed = torch.zeros(4, 2)
    reference = {
        "model.embed_tokens.weight": embed,
        **{f"{ATTN}.{p}_proj.{leaf}": torch.zeros(2) for p in "qkv" for leaf in ("weight", "bias")},
        f"{ATTN}.o_proj.weight": torch.zeros(2),
        "lm_head.weight": embed,
    }
    assert load_groups([f"{ATTN}.k_proj.bias"], reference, PACKED) == [
        f"{ATTN}.{p}_proj.{leaf}" for p in "qkv" for leaf in ("weight", "bias")
    ]
    both = ["model.embed_tokens.weight", "lm_head.weight"]
    assert load_groups(["model.embed_tokens.weight"], reference, PACKED) == both
    assert load_groups([f"{ATTN}.o_proj.weight"], reference, PACKED) == [f"{ATTN}.o_proj.weight"]


def test_a_kept_weight_reads_back_past_its_vocabulary_padding_and_nothing_else() -> None:
    layer = torch.nn.Embedding(6, 3)
    sent = layer.weight.detach()[:5].clone()
    assert _reads_back(layer, layer.weight, sent, ())
    assert not _reads_back(layer, layer.weight, sent + 1, ())
    assert not _reads_back(layer, layer.weight, sent[:, :2], ())
    assert not _reads_back(layer, layer.weight, sent[0], ())


class _Repacked(torch.nn.Module):
    """A linear layer as vLLM keeps it on the CPU: an empty weight, a kernel that multiplies."""

    def __init__(self, served: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        self.register_buffer("packed", served)
        self.quant_method = SimpleNamespace(apply=lambda m, x, bias: x @ m.packed.T)


def test_a_repacked_layer_is_probed_on_the_columns_a_delta_changed_first() -> None:
    sent = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    assert _reads_back(_Repacked(sent.clone()), torch.empty(0), sent, ())
    unprobed = int(torch.linspace(0, 63, PROBE_COLUMNS).long()[0]) + 5
    served = sent.clone()
    served[:, unprobed] += 1  # a column the spread probes miss
    assert _reads_back(_Repacked(served), torch.empty(0), sent, ())  # why deltas name theirs
    assert not _reads_back(_Repacked(served), torch.empty(0), sent, [unprobed, 999, -1])
    assert not _reads_back(_Repacked(sent + 1), torch.empty(0), sent, ())
    bare = torch.nn.Linear(64, 3)
    assert not _reads_back(bare, torch.empty(0), sent, ())  # empty, and no kernel to ask


def test_a_read_back_names_what_the_engine_lacks_but_not_a_tied_away_head() -> None:
    def worker(tied: bool):
        model = torch.nn.Module()
        model.norm = torch.nn.LayerNorm(4)
        model.config = SimpleNamespace(tie_word_embeddings=tied)
        return SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model)), model

    runner, model = worker(tied=True)
    weights = [("norm.weight", model.norm.weight.detach()), ("lm_head.weight", torch.ones(2, 4))]
    assert verify_loaded(runner, weights, PACKED, {}) == []
    runner, model = worker(tied=False)
    weights[0] = ("norm.weight", model.norm.weight.detach() + 1)
    assert verify_loaded(runner, weights, PACKED, {}) == [
        "norm.weight",
        "lm_head.weight: not in the engine's model",
    ]


def test_a_stacked_module_reads_back_its_shards_in_vllms_order_whatever_order_sent() -> None:
    model = torch.nn.Module()
    model.qkv_proj = torch.nn.Linear(2, 3, bias=False)
    rows = model.qkv_proj.weight.detach()
    runner = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model))
    sent = [("v_proj.weight", rows[2:]), ("q_proj.weight", rows[:1]), ("k_proj.weight", rows[1:2])]
    assert verify_loaded(runner, sent, PACKED, {}) == []
    swapped = [("q_proj.weight", rows[1:2]), ("k_proj.weight", rows[:1]), sent[0]]
    assert verify_loaded(runner, swapped, PACKED, {}) == ["qkv_proj.weight"]


PEFT = "base_model.model."
ADAPTER = {
    f"{PEFT}{ATTN}.q_proj.lora_A.default.weight": torch.full((2, 4), 1.0),
    f"{PEFT}{ATTN}.k_proj.lora_B.default.weight": torch.full((4, 2), 3.0),
}


def test_peft_keys_map_onto_checkpoint_names_and_adapter_keys_are_left_out() -> None:
    keys = [
        f"{PEFT}{ATTN}.q_proj.base_layer.weight",
        *ADAPTER,
        f"{PEFT}model.embed_tokens.lora_embedding_A.default",
        f"{PEFT}lm_head.weight",
        "plain.weight",
    ]
    assert checkpoint_names(keys) == {
        keys[0]: f"{ATTN}.q_proj.weight",
        keys[4]: "lm_head.weight",
        "plain.weight": "plain.weight",
    }
    check_targets(keys[:3], ["k_proj", "q_proj"])
    with pytest.raises(
        ValueError, match=r"\['embed_tokens', 'k_proj'\] are modules .* \['q_proj'\]"
    ):
        check_targets(keys, ["q_proj"])


class _Engine:
    """Stands in for the VLLMEngine an adapter is loaded into; reads back what it is told."""

    packed = PACKED

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.expected: list[tuple[str, int, str, torch.Tensor]] = []
        self.wrong: list[str] = []

    def load_adapter(self, path: str) -> None:
        assert os.path.isfile(f"{path}/adapter_model.safetensors")
        self.loaded.append(path)

    def read_adapter(self, expected):
        self.expected = list(expected)
        return self.wrong


@pytest.fixture
def adapter():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj"])
    engine = _Engine()
    adapter = EngineAdapter(engine, config)
    yield adapter, engine
    adapter.close()


def test_an_adapter_is_read_back_per_shard_with_b_scaled_by_alpha_over_r(adapter) -> None:
    adapter, engine = adapter
    adapter.load(ADAPTER)
    got = {(m, s, k): t.tolist() for m, s, k, t in engine.expected}
    assert got == {
        (f"{ATTN}.qkv_proj", 0, "A"): torch.full((2, 4), 1.0).tolist(),
        (f"{ATTN}.qkv_proj", 1, "B"): torch.full((4, 2), 6.0).tolist(),
    }


def test_adapter_pushes_keep_at_most_two_directories_and_a_refused_one_none(adapter) -> None:
    adapter, engine = adapter
    root = adapter._root
    for _ in range(3):
        adapter.load(ADAPTER)
        adapter.commit()
    assert sorted(os.listdir(root)) == [os.path.basename(adapter.serving)]
    kept = adapter.serving
    engine.wrong = ["x.lora_A"]
    with pytest.raises(LookupError, match=r"x\.lora_A"):
        adapter.load(ADAPTER)
    assert (adapter.serving, os.listdir(root)) == (kept, [os.path.basename(kept)])
    engine.wrong = []
    adapter.load(ADAPTER)
    assert len(os.listdir(root)) == 2
    adapter.rollback()
    assert (adapter.serving, os.listdir(root)) == (kept, [os.path.basename(kept)])
    assert adapter.reload(ADAPTER) == []
    assert engine.loaded[-1] == kept
