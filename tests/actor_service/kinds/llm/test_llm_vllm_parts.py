"""The vLLM engine's pure parts, without vLLM: its settings, layouts, read-backs, adapter files.

These run in every venv (vLLM is imported by none of them): the engine's keyword
arguments, the checkpoint keys a push reloads as whole engine modules, the read-back of
a reloaded layer, the peft keys in vLLM's terms, and the adapter directories a push
leaves behind. The engine itself stands in for vLLM only where vLLM would be called.
"""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from actor_service._core._swap import StagedParts
from actor_service._kinds.llm.vllm_engine import VLLMEngine, VLLMOptions, _engine_kwargs, _padded
from actor_service._kinds.llm.vllm_lora import (
    EngineAdapter,
    check_targets,
    checkpoint_names,
    lora_modules,
    verify_adapter,
)
from actor_service._kinds.llm.vllm_worker import (
    PROBE_COLUMNS,
    _reads_back,
    engine_module,
    load_groups,
    verify_loaded,
)
from common.errors import InternalError, WeightsError
from common.llm import LoraSpec
from common.weights import PushForm

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


class _Served:
    """Stands in for the VLLMEngine of a plain model: keeps what it is reloaded with, reads back.

    ``refuse`` makes its loader raise, ``drop`` names keys it leaves as they were (read back
    as wrong), ``fail_back`` makes every later reload (the put-back too) raise.
    """

    packed = PACKED
    max_model_len = 64

    def __init__(self, checkpoint, dtype, options, seed, lora_rank) -> None:
        self.held: dict[str, torch.Tensor] = {}
        self.calls: list[list[str]] = []
        self.refuse = self.fail_back = False
        self.drop: set[str] = set()
        self.resets: list[bool] = []
        self.reset_ok = True

    def reload(self, weights, columns):
        self.calls.append([k for k, _ in weights])
        self.held.update((k, v.clone()) for k, v in weights if k not in self.drop)
        if self.refuse or self.fail_back:  # a loader that raises half way has changed some
            self.refuse = False
            raise RuntimeError("no such shape")
        wrong = [k for k, _ in weights if k in self.drop]
        self.drop = set()
        return wrong

    def reset_prefix_cache(self) -> bool:
        self.resets.append(self.reset_ok)
        return self.reset_ok

    def close(self) -> None:
        pass


@pytest.fixture
def served(monkeypatch):
    from actor_service._kinds.llm import vllm_models

    monkeypatch.setattr(vllm_models, "VLLMEngine", _Served)
    tiny = {"hidden": 16, "heads": 2, "layers": 1, "dtype": "float32", "seed": 0}
    options = VLLMOptions(enable_prefix_caching=True)
    models = vllm_models.VLLMModels("rlfleet:tiny-qwen2", tiny, torch.device("cpu"), options, 0)
    yield models, models.engine
    models.close()


def _pushed(models, scale: float) -> dict[str, torch.Tensor]:
    return {k: v + scale for k, v in models.model.state_dict().items()}


NORM = "model.norm.weight"


def test_a_served_push_reaches_the_engine_tied_names_too_before_the_version_moves(served) -> None:
    models, engine = served
    new = _pushed(models, 1.0)
    assert models.swap_weights("policy", 1, new).version == models.version == 1
    for key, value in new.items():
        assert torch.equal(models.model.state_dict()[key], value)
    assert torch.equal(engine.held["lm_head.weight"], new["model.embed_tokens.weight"])
    assert torch.equal(engine.held[NORM], new[NORM])
    engine.calls.clear()
    models.swap_delta("policy", 1, 2, {NORM: (torch.tensor([0]), torch.tensor([5.0]))})
    assert engine.calls == [[NORM]]  # a delta reloads only the modules it names
    assert engine.held[NORM][0] == 5.0 == models.model.state_dict()[NORM][0]
    q_proj = f"{ATTN}.q_proj.weight"
    models.swap_delta("policy", 2, 3, {q_proj: (torch.tensor([1]), torch.tensor([7.0]))})
    assert sorted(engine.calls[-1]) == sorted(  # the whole stacked module, its other shards too
        f"{ATTN}.{p}_proj.{leaf}" for p in "qkv" for leaf in ("weight", "bias")
    )
    tied = {
        k: (torch.tensor([0]), torch.tensor([9.0]))
        for k in ("model.embed_tokens.weight", "lm_head.weight")
    }
    models.swap_delta("policy", 3, 4, tied)
    assert engine.held["lm_head.weight"].flatten()[0] == 9.0  # the tied head goes in too
    assert models.version == 4


def test_a_refused_delta_leaves_the_host_copy_and_version_as_they_were(served) -> None:
    models, engine = served
    before = {k: v.clone() for k, v in models.model.state_dict().items()}
    engine.refuse = True
    with pytest.raises(WeightsError, match="previous weights still serve"):
        models.swap_delta("policy", 0, 1, {NORM: (torch.tensor([0, 1]), torch.tensor([5.0, 6.0]))})
    assert models.version == 0
    for key, value in models.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(engine.held[NORM], before[NORM])


@pytest.mark.parametrize("how", ["refused", "not read back"])
def test_a_push_the_engine_does_not_serve_puts_the_old_weights_back_under_the_old_version(
    served, how
) -> None:
    models, engine = served
    old = _pushed(models, 1.0)
    models.swap_weights("policy", 1, old)
    error: type[Exception] = WeightsError if how == "refused" else InternalError
    engine.refuse = how == "refused"
    if how != "refused":
        engine.drop = {"model.embed_tokens.weight"}
    with pytest.raises(error, match="previous weights still serve"):
        models.swap_weights("policy", 2, _pushed(models, 1.0))
    assert models.version == 1
    for key, value in old.items():
        assert torch.equal(models.model.state_dict()[key], value)
    for key, value in engine.held.items():  # put back: the engine holds the host copy again
        want = old["model.embed_tokens.weight" if key == "lm_head.weight" else key]
        assert torch.equal(value, want), key
    assert len(engine.calls) == 3  # the first push, the second, its put-back of every module
    assert engine.calls[1] == engine.calls[2]
    assert models._locked(lambda: ["ok"]) == (["ok"], 1)


def test_an_engine_that_takes_neither_push_nor_put_back_stops_serving_until_a_restore(
    served,
) -> None:
    models, engine = served
    state = models.state_dict()
    engine.fail_back = True
    with pytest.raises(WeightsError):
        models.swap_weights("policy", 1, _pushed(models, 1.0))
    with pytest.raises(InternalError, match=r"previous weights back .* restart this actor"):
        models._locked(lambda: [])
    with pytest.raises(InternalError, match="previous weights back"):
        models.load_state_dict(state)
    engine.fail_back = False
    models.load_state_dict(state)
    assert models._locked(lambda: ["ok"]) == (["ok"], 0)
    assert sorted(engine.calls[-1]) == sorted(checkpoint_names(models.model.state_dict()).values())


def test_the_prefix_cache_is_emptied_once_per_version_and_again_if_vllm_did_not(served) -> None:
    models, engine = served
    models._fresh_prefix_cache()
    models._fresh_prefix_cache()
    assert engine.resets == [True]
    models.swap_weights("policy", 1, _pushed(models, 1.0))
    engine.reset_ok = False
    models._fresh_prefix_cache()
    engine.reset_ok = True
    models._fresh_prefix_cache()
    models._fresh_prefix_cache()
    assert engine.resets == [True, False, True]
    models.load_state_dict(models.state_dict())
    models._fresh_prefix_cache()
    assert len(engine.resets) == 4
    models._prefix_caching = False
    models.swap_weights("policy", 2, _pushed(models, 1.0))
    models._fresh_prefix_cache()
    assert len(engine.resets) == 4


def _lora_worker(a: torch.Tensor, b: torch.Tensor):
    """A worker whose LoRA manager holds adapter 1 in slot 1 of a qkv layer (one shard of A, B)."""
    layer = SimpleNamespace(lora_a_stacked=[a], lora_b_stacked=[b])
    manager = SimpleNamespace(lora_index_to_id=[None, 1], modules={f"{ATTN}.qkv_proj": layer})
    runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))
    return SimpleNamespace(model_runner=runner)


def test_an_adapter_reads_back_only_from_its_own_slot_and_shard_kind() -> None:
    a, b = torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 8, 4)
    a[1, 0, :2, :4], b[1, 0, :4, :2] = 1.0, 3.0
    worker = _lora_worker(a, b)
    want_a, want_b = torch.full((2, 4), 1.0), torch.full((4, 2), 3.0)
    module = f"{ATTN}.qkv_proj"
    assert verify_adapter(worker, [(module, 0, "A", want_a), (module, 0, "B", want_b)], 1) == []
    assert verify_adapter(worker, [(module, 0, "B", want_a.T + 1)], 1) == [f"{module}[0].lora_B"]
    assert verify_adapter(worker, [(module, 0, "A", want_b)], 1) == [f"{module}[0].lora_A"]
    assert verify_adapter(worker, [("o_proj", 0, "A", want_a)], 1) == [
        "o_proj: no LoRA layer in the engine"
    ]
    assert verify_adapter(worker, [], 2) == ["adapter 2 is in no LoRA slot"]
    a[1], a[0, 0, :2, :4] = 0.0, 1.0  # only another slot holds it
    assert verify_adapter(worker, [(module, 0, "A", want_a)], 1) == [f"{module}[0].lora_A"]


class _Stepping:
    """Stands in for vLLM's engine of a turn: its second step raises."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.steps = 0

    def add_request(self, request, prompt, params, lora_request) -> None:
        self.added.append(request)

    def step(self):
        self.steps += 1
        if self.steps > 1:
            raise RuntimeError("engine died")
        first = SimpleNamespace(token_ids=[4], logprobs=[{4: SimpleNamespace(logprob=-0.5)}],
                                finish_reason="stop")  # fmt: skip
        return [SimpleNamespace(request_id=self.added[0], finished=True, outputs=[first])]

    def abort_request(self, requests) -> None:
        self.aborted += requests


def test_a_turn_that_fails_mid_way_aborts_only_its_unfinished_requests() -> None:
    pytest.importorskip("vllm")
    engine = VLLMEngine.__new__(VLLMEngine)
    engine._engine, engine._ids, engine.adapter = _Stepping(), itertools.count(), None
    with pytest.raises(RuntimeError, match="engine died"):
        engine.run([[1], [2], [3]], [None] * 3, 0, lambda step: (step(), 1))
    assert engine._engine.aborted == engine._engine.added[1:] == ["r1", "r2"]


class _ServedLora(_Served):
    """Stands in for the VLLMEngine of a peft model: also serves the adapter files it loads.

    ``adapter`` holds the tensors of the last directory loaded (what vLLM serves);
    ``refuse_adapter`` makes the next adapter load raise, ``wrong_adapter`` the next
    read-back name a part, ``fail_adapter_back`` every later adapter load raise.
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.adapter: dict[str, torch.Tensor] = {}
        self.adapter_loads: list[str] = []
        self.refuse_adapter = self.fail_adapter_back = False
        self.wrong_adapter: list[str] = []
        self.reads: list[int] = []  # how many adapter parts each read-back checked

    def lora_modules(self) -> list[str]:
        return ["k_proj", "o_proj", "q_proj", "v_proj"]

    def load_adapter(self, path: str) -> None:
        self.adapter_loads.append(path)
        if self.refuse_adapter or self.fail_adapter_back:
            self.refuse_adapter = False
            raise RuntimeError("bad lora shape")
        self.adapter = load_file(f"{path}/adapter_model.safetensors")

    def read_adapter(self, expected) -> list[str]:
        self.reads.append(len(expected))
        wrong, self.wrong_adapter = self.wrong_adapter, []
        return wrong


@pytest.fixture
def served_lora(monkeypatch):
    pytest.importorskip("peft")
    from actor_service._kinds.llm import vllm_models

    monkeypatch.setattr(vllm_models, "VLLMEngine", _ServedLora)
    tiny = {"hidden": 16, "heads": 2, "layers": 1, "dtype": "float32", "seed": 0}
    lora = LoraSpec(r=2, targets=("q_proj", "v_proj"), alpha=4)
    models = vllm_models.VLLMModels(
        "rlfleet:tiny-qwen2", tiny, torch.device("cpu"), VLLMOptions(), 0, lora
    )
    yield models, models.engine
    models.close()


def _host_adapter(models) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in models.model.state_dict().items() if ".lora_" in k}


def _assert_engine_serves(models, engine) -> None:
    """The engine's adapter files hold the host copy's adapter, under peft's file names."""
    want = {k.replace(".default.weight", ".weight"): v for k, v in _host_adapter(models).items()}
    assert sorted(engine.adapter) == sorted(want)
    for key, value in want.items():
        assert torch.equal(engine.adapter[key], value), key


SUBSET = PushForm(subset=True)


def _moved(adapter: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    return {k: v + scale for k, v in adapter.items()}


def test_an_adapter_push_is_served_then_taken_by_the_host_copy_keeping_one_directory(
    served_lora,
) -> None:
    models, engine = served_lora
    _assert_engine_serves(models, engine)  # the host copy's adapter from the start
    root = models._adapter._root
    first = _moved(_host_adapter(models), 0.5)
    models.swap_weights("policy", 1, first, SUBSET)
    assert models.version == 1
    assert engine.calls == []  # no base module reloaded
    assert all(torch.equal(models.model.state_dict()[k], v) for k, v in first.items())
    _assert_engine_serves(models, engine)
    key = next(iter(first))
    models.swap_delta("policy", 1, 2, {key: (torch.tensor([0]), torch.tensor([9.0]))})
    assert models.model.state_dict()[key].flatten()[0] == 9.0
    _assert_engine_serves(models, engine)  # the others kept, this one moved
    assert os.listdir(root) == [os.path.basename(models._adapter.serving)]
    models.close()
    assert not os.path.exists(root)


@pytest.mark.parametrize("how", ["refused", "not read back"])
def test_an_adapter_push_the_engine_does_not_serve_reloads_the_old_adapter(
    served_lora, how
) -> None:
    models, engine = served_lora
    before, serving = _host_adapter(models), models._adapter.serving
    engine.refuse_adapter = how == "refused"
    engine.reads.clear()
    engine.wrong_adapter = [] if how == "refused" else ["qkv_proj[0].lora_A"]
    error: type[Exception] = WeightsError if how == "refused" else InternalError
    with pytest.raises(error, match="previous adapter still serves"):
        models.swap_weights("policy", 1, _moved(before, 1.0), SUBSET)
    assert models.version == 0
    assert all(torch.equal(models.model.state_dict()[k], v) for k, v in before.items())
    assert engine.adapter_loads[-1] == serving  # the old directory, loaded again
    parts = len(before)  # q_proj and v_proj, A and B: each read back after the put-back
    assert engine.reads == ([parts] if how == "refused" else [parts, parts])
    _assert_engine_serves(models, engine)
    assert os.listdir(models._adapter._root) == [os.path.basename(serving)]
    assert models._locked(lambda: ["ok"]) == (["ok"], 0)


def test_a_push_whose_base_the_engine_refuses_puts_the_old_adapter_back(served_lora) -> None:
    models, engine = served_lora
    before, serving = _host_adapter(models), models._adapter.serving
    engine.refuse = True
    with pytest.raises(WeightsError, match="previous weights still serve"):
        models.swap_weights("policy", 1, _pushed(models, 1.0))
    assert models.version == 0
    assert all(torch.equal(models.model.state_dict()[k], v) for k, v in before.items())
    assert (engine.adapter_loads[-1], models._adapter.serving) == (serving, serving)
    _assert_engine_serves(models, engine)
    assert os.listdir(models._adapter._root) == [os.path.basename(serving)]
    models.swap_weights("policy", 1, _moved(before, 1.0), SUBSET)  # and the next push stands
    _assert_engine_serves(models, engine)
    assert os.listdir(models._adapter._root) == [os.path.basename(models._adapter.serving)]


def test_an_adapter_that_cannot_be_written_reaches_no_engine_and_keeps_serving(
    served_lora, monkeypatch
) -> None:
    models, engine = served_lora
    loads = list(engine.adapter_loads)

    def full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(models._adapter._config, "save_pretrained", full)
    with pytest.raises(InternalError, match="could not be written: No space left"):
        models.swap_weights("policy", 1, _moved(_host_adapter(models), 1.0), SUBSET)
    assert (engine.adapter_loads, models.version) == (loads, 0)
    assert os.listdir(models._adapter._root) == [os.path.basename(models._adapter.serving)]
    assert models._locked(lambda: ["ok"]) == (["ok"], 0)


def test_an_engine_that_takes_no_adapter_back_stops_serving_until_a_restore(served_lora) -> None:
    models, engine = served_lora
    state = models.state_dict()
    engine.fail_adapter_back = True
    with pytest.raises(WeightsError, match="previous adapter still serves"):
        models.swap_weights("policy", 1, _moved(_host_adapter(models), 1.0), SUBSET)
    with pytest.raises(InternalError, match=r"previous LoRA adapter back .* restart this actor"):
        models._locked(lambda: [])
    with pytest.raises(InternalError, match="restored LoRA adapter"):
        models.load_state_dict(state)
    engine.fail_adapter_back = False
    models.load_state_dict(state)
    assert models._locked(lambda: ["ok"]) == (["ok"], 0)
    _assert_engine_serves(models, engine)
    assert os.listdir(models._adapter._root) == [os.path.basename(models._adapter.serving)]


def test_a_restored_state_puts_its_adapter_into_the_engine(served_lora) -> None:
    models, engine = served_lora
    state = models.state_dict()
    models.swap_weights("policy", 1, _moved(_host_adapter(models), 1.0), SUBSET)
    engine.wrong_adapter = ["qkv_proj[0].lora_B"]  # the restored one does not read back
    with pytest.raises(InternalError, match=r"restored LoRA adapter .*qkv_proj\[0\]\.lora_B"):
        models.load_state_dict(state, allow_rollback=True)
    models.load_state_dict(state, allow_rollback=True)
    assert models._locked(lambda: ["ok"]) == (["ok"], 0)
    _assert_engine_serves(models, engine)


def test_the_engines_lora_modules_are_named_unpacked_as_peft_targets_them() -> None:
    manager = SimpleNamespace(
        supported_lora_modules=["qkv_proj", "o_proj", "gate_up_proj"],
        packed_modules_mapping=PACKED,
    )
    runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))
    assert lora_modules(SimpleNamespace(model_runner=runner)) == [
        "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj",
    ]  # fmt: skip


def test_an_adapter_on_modules_the_engine_serves_no_lora_on_is_refused_at_start(
    monkeypatch,
) -> None:
    pytest.importorskip("peft")
    from actor_service._kinds.llm import vllm_models

    monkeypatch.setattr(vllm_models, "VLLMEngine", _ServedLora)
    monkeypatch.setattr(_ServedLora, "lora_modules", lambda self: ["k_proj", "q_proj"])
    tiny = {"hidden": 16, "heads": 2, "layers": 1, "dtype": "float32", "seed": 0}
    with pytest.raises(ValueError, match=r"\['v_proj'\] are modules .* \['k_proj', 'q_proj'\]"):
        vllm_models.VLLMModels(
            "rlfleet:tiny-qwen2", tiny, torch.device("cpu"), VLLMOptions(), 0, LoraSpec(r=2)
        )


def test_a_multi_part_push_reaches_the_engine_before_the_version_moves(served) -> None:
    models, engine = served
    new = _pushed(models, 1.0)
    whole = {k: v for k, v in new.items() if k != NORM}  # one rank's full part
    parts = StagedParts(
        tensors=models.validate("policy", whole, PushForm(subset=True)),
        delta={NORM: (torch.tensor([0]), torch.tensor([5.0]))},  # the other rank's delta part
        base_version=0,
    )
    assert models.swap_parts("policy", 1, parts).version == models.version == 1
    assert engine.held[NORM][0] == 5.0 == models.model.state_dict()[NORM][0]
    for key, value in whole.items():
        assert torch.equal(engine.held[key], value), key
