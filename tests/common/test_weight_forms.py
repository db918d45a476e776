"""Push forms in the codec: tied tensors sent once, wire dtypes, subsets, and the size cap."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from common.config import MAX_POLICY_VERSION
from common.errors import WeightsError
from common.weights import (
    DEFAULT_MAX_WEIGHT_BYTES,
    PushForm,
    adapter_metadata,
    apply_staged,
    check_policy_version,
    decode_weights,
    default_max_weight_bytes,
    encode_weights,
    load_into,
    stage_state,
    state_nbytes,
    wire_state,
)
from common.weights._aliases import ALIASES_KEY


class SharedLinear(nn.Module):
    """A user module applying one Linear twice (three keys, one tensor) with an int buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(6, 6)
        self.blocks = nn.ModuleList([self.shared, self.shared])
        self.norm = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(self.norm(x))


def _header(blob: bytes) -> tuple[dict, int]:
    (size,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + size]), 8 + size


def _unique_bytes(module: nn.Module) -> int:
    tensors = {id(p): p for p in module.parameters()} | {id(b): b for b in module.buffers()}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _reference(module: nn.Module) -> dict[str, torch.Tensor]:
    return module.state_dict()


# --- tied tensors --------------------------------------------------------------


def test_encode_weights_sends_tied_tensors_once_and_decode_reties_them() -> None:
    module = SharedLinear()
    blob = encode_weights(module)
    header, data_start = _header(blob)
    assert len(blob) - data_start == _unique_bytes(module)
    assert json.loads(header["__metadata__"][ALIASES_KEY]) == {
        "blocks.0.weight": "shared.weight",
        "blocks.0.bias": "shared.bias",
        "blocks.1.weight": "shared.weight",
        "blocks.1.bias": "shared.bias",
    }
    state, _ = decode_weights(
        blob, expected={k: (tuple(v.shape), v.dtype) for k, v in _reference(module).items()}
    )
    assert set(state) == set(module.state_dict())
    assert state["blocks.1.weight"] is state["shared.weight"]
    assert torch.equal(state["blocks.0.bias"], module.shared.bias.detach())


def test_tiny_llm_push_carries_the_tied_embedding_once() -> None:
    pytest.importorskip("transformers")
    from common.llm import build_policy

    model, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    blob = encode_weights(model)
    header, data_start = _header(blob)
    assert len(blob) - data_start == sum(p.numel() * 4 for p in model.parameters())
    assert "lm_head.weight" not in header
    state, _ = decode_weights(blob)
    target = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=1)[0]
    apply_staged(target.state_dict(), stage_state(state, target.state_dict()))
    assert target.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[5, 17, 42, 3]])
    with torch.no_grad():
        assert torch.equal(target(ids).logits, model(ids).logits)


@pytest.mark.parametrize(
    ("aliases", "message"),
    [
        ({"x": "nowhere"}, "targets the blob does not hold"),
        ({"a": "a"}, "also tensors"),
        ({"a": "b"}, "also tensors"),
        ({"x": "a", "y": "x"}, r"does not hold: \['x'\]"),  # a chain
        ({"x": "y", "y": "x"}, "does not hold"),  # a cycle
        ({"x": 3}, "mapping key to key"),
        (["a"], "mapping key to key"),
        ({f"k{i}": "a" for i in range(5)}, "at most 3"),
    ],
)
def test_decode_weights_raises_if_the_alias_map_is_hostile(aliases: object, message: str) -> None:
    blob = encode_weights(
        {"a": torch.zeros(2), "b": torch.ones(2)}, metadata={ALIASES_KEY: json.dumps(aliases)}
    )
    with pytest.raises(WeightsError, match=message):
        decode_weights(blob, max_keys=5)


def test_decode_weights_raises_if_the_alias_map_is_not_json_or_too_long() -> None:
    bad = encode_weights({"a": torch.zeros(2)}, metadata={ALIASES_KEY: "{not json"})
    with pytest.raises(WeightsError, match="not valid JSON"):
        decode_weights(bad)
    huge = json.dumps({f"k{i}" + "x" * 2000: "a" for i in range(3)})
    with pytest.raises(WeightsError, match="characters exceeds"):
        decode_weights(
            encode_weights({"a": torch.zeros(2)}, metadata={ALIASES_KEY: huge}), max_keys=3
        )


def test_stage_state_raises_if_tied_keys_get_different_values() -> None:
    module = SharedLinear()
    state = {k: v.clone() for k, v in module.state_dict().items()}  # untied copies
    state["blocks.1.weight"] += 1.0
    with pytest.raises(WeightsError, match=r"blocks.1.weight and shared.weight"):
        stage_state(state, module.state_dict())
    state["blocks.1.weight"] = state["shared.weight"].clone()  # equal values: accepted
    stage_state(state, module.state_dict())


# --- wire dtype ----------------------------------------------------------------


def test_encode_weights_casts_floats_once_and_never_integer_buffers() -> None:
    module = SharedLinear()
    module.norm.num_batches_tracked.fill_(7)
    blob = encode_weights(module, dtype=torch.bfloat16)
    header, _ = _header(blob)
    assert header["__metadata__"]["rlfleet.dtype"] == "bfloat16"
    assert header["norm.num_batches_tracked"]["dtype"] == "I64"
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16", "I64"}
    state, meta = decode_weights(blob)
    form = PushForm.from_metadata(meta)
    target = SharedLinear()
    apply_staged(target.state_dict(), stage_state(state, target.state_dict(), form))
    for key, value in module.state_dict().items():
        got = target.state_dict()[key]
        assert got.dtype == value.dtype
        expected = value.to(torch.bfloat16).to(value.dtype) if value.is_floating_point() else value
        assert torch.equal(got, expected), key  # the learner's values rounded to bf16, exactly
    assert int(target.norm.num_batches_tracked) == 7


def test_stage_state_raises_if_a_float_goes_into_an_integer_buffer() -> None:
    module = SharedLinear()
    state = {"norm.num_batches_tracked": torch.tensor(3.0, dtype=torch.bfloat16)}
    form = PushForm(subset=True, wire_dtype=torch.bfloat16)
    with pytest.raises(
        WeightsError, match=r"norm.num_batches_tracked.*never loads into an integer"
    ):
        stage_state(state, module.state_dict(), form)
    blob = encode_weights(state, dtype=torch.bfloat16, subset=True)
    expected = {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()}
    with pytest.raises(WeightsError, match="never loads into an integer"):
        decode_weights(blob, expected=expected)


def test_stage_state_raises_if_a_float_of_an_undeclared_dtype_arrives() -> None:
    module = SharedLinear()
    state = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v
        for k, v in module.state_dict().items()
    }
    with pytest.raises(WeightsError, match="dtype mismatch"):
        stage_state(state, module.state_dict())  # no wire dtype declared: exact dtypes only


def test_stage_state_raises_if_a_cast_overflows() -> None:
    module = nn.Linear(2, 1)
    state = {
        "weight": torch.full((1, 2), 1e300, dtype=torch.float64),
        "bias": torch.zeros(1, dtype=torch.float64),
    }
    expected = r"non-finite.*\['weight'\] once cast .*torch.float64 -> torch.float32.*overflow"
    with pytest.raises(WeightsError, match=expected):
        stage_state(state, module.state_dict(), PushForm(wire_dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.complex64])
def test_encode_weights_raises_if_the_wire_dtype_cannot_carry_weights(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="dtype must be None or one of"):
        encode_weights(nn.Linear(2, 2), dtype=dtype)


def test_push_form_raises_if_the_header_declares_nonsense() -> None:
    with pytest.raises(WeightsError, match=r"rlfleet\.dtype"):
        PushForm.from_metadata({"rlfleet.dtype": "int64"})
    with pytest.raises(WeightsError, match=r"rlfleet\.subset"):
        PushForm.from_metadata({"rlfleet.subset": "yes"})
    odd = ("r=4", "r=4,alpha=x", "r=-4,alpha=4", f"r={'9' * 10**6},alpha=1", "")
    # Read whole: a trailing field, or an alpha of 8 digits, is not a 6-digit alpha and more.
    for adapter in (*odd, "r=4,alpha=8,dropout=0", "r=4,alpha=80000000"):
        with pytest.raises(WeightsError, match=r"rlfleet\.lora must read r=R,alpha=A"):
            PushForm.from_metadata({"rlfleet.lora": adapter})


def test_a_declared_lora_adapter_round_trips_and_only_the_held_one_passes() -> None:
    """A peft module declares ``(r, alpha)``; a plain module, a mapping nothing."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from common.llm import apply_lora, build_policy

    model = apply_lora(
        build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)[0], "r=4,targets=q_proj,alpha=8"
    )
    assert isinstance(model, peft.PeftModel)
    assert isinstance(model.base_model.model, transformers.PreTrainedModel)
    declared = adapter_metadata(model)
    assert declared == {"rlfleet.lora": "r=4,alpha=8"}
    assert adapter_metadata(nn.Linear(2, 2)) == adapter_metadata({"w": torch.ones(1)}) == {}
    form = PushForm.from_metadata(declared)
    assert form.adapter == (4, 8)
    assert form.metadata() == declared
    form.check_adapter((4, 8))
    form.check_adapter(None)  # an actor without an adapter: its keys tell the difference
    PushForm().check_adapter((4, 4))  # nothing declared: a mapping of tensors, as before
    with pytest.raises(WeightsError, match="alpha=8; this actor's is r=4, alpha=4"):
        form.check_adapter((4, 4))


# --- subsets -------------------------------------------------------------------


def test_only_trainable_sends_the_parameters_with_requires_grad() -> None:
    module = SharedLinear()
    module.head.requires_grad_(False)
    blob = encode_weights(module, only_trainable=True)
    header, _ = _header(blob)
    assert header["__metadata__"]["rlfleet.subset"] == "1"
    state, _ = decode_weights(blob)
    assert set(state) == {
        "shared.weight",
        "shared.bias",
        "blocks.0.weight",
        "blocks.0.bias",
        "blocks.1.weight",
        "blocks.1.bias",
        "norm.weight",
        "norm.bias",
    }
    with pytest.raises(TypeError, match=r"only_trainable needs an nn\.Module"):
        encode_weights(module.state_dict(), only_trainable=True)
    with pytest.raises(ValueError, match="no parameter with requires_grad"):
        encode_weights(nn.Linear(2, 2).requires_grad_(False), only_trainable=True)


def test_subset_keeps_other_keys_and_full_push_still_needs_every_key() -> None:
    module, source = SharedLinear(), SharedLinear()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    subset = {"head.weight": source.head.weight.detach()}
    with pytest.raises(WeightsError, match="missing keys"):
        stage_state(subset, module.state_dict())
    apply_staged(
        module.state_dict(), stage_state(subset, module.state_dict(), PushForm(subset=True))
    )
    assert torch.equal(module.head.weight, source.head.weight)
    assert all(
        torch.equal(v, before[k]) for k, v in module.state_dict().items() if k != "head.weight"
    )


def test_subset_raises_naming_an_unknown_key() -> None:
    module = SharedLinear()
    with pytest.raises(WeightsError, match=r"unexpected keys \['head.wieght'\]"):
        stage_state({"head.wieght": torch.zeros(2, 6)}, module.state_dict(), PushForm(subset=True))


def test_adapter_keys_into_a_model_without_adapter_name_the_lora_flag() -> None:
    module = nn.Linear(2, 2)
    state = {"base_model.model.q_proj.lora_A.default.weight": torch.zeros(4, 2)}
    with pytest.raises(WeightsError, match="start the actor with --lora"):
        stage_state(state, module.state_dict(), PushForm(subset=True))


# --- size cap ------------------------------------------------------------------


def test_default_cap_follows_the_model_and_keeps_the_1_gib_floor() -> None:
    assert default_max_weight_bytes(0) == DEFAULT_MAX_WEIGHT_BYTES
    assert default_max_weight_bytes(4 << 30) == 5 << 30
    info = {"w": ((1000, 1000), torch.float32), "b": ((10,), torch.bfloat16)}
    assert state_nbytes(info) == 4_000_020


def test_default_cap_accepts_a_half_billion_parameter_model_push() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = transformers.Qwen2ForCausalLM(config)
    info = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    assert 490e6 < params < 500e6
    push_fp32 = params * 4 + 64 * 1024 * len(info)  # unique bytes + a generous header
    assert push_fp32 > DEFAULT_MAX_WEIGHT_BYTES  # the old fixed cap refused it
    assert push_fp32 <= default_max_weight_bytes(state_nbytes(info))
    bf16 = {k: (shape, torch.bfloat16) for k, (shape, _) in info.items()}
    assert params * 2 <= default_max_weight_bytes(state_nbytes(bf16))


def _peft_like(**config: object) -> SimpleNamespace:
    # The two attributes adapter_metadata reads from a peft model.
    return SimpleNamespace(peft_config={"default": SimpleNamespace(**config)})


def test_adapter_metadata_declares_no_adapter_with_per_module_scales_or_a_zero_rank() -> None:
    assert adapter_metadata(_peft_like(r=4, lora_alpha=8)) == {"rlfleet.lora": "r=4,alpha=8"}
    for odd in ({"alpha_pattern": {"q_proj": 16}}, {"rank_pattern": {"q_proj": 2}}):
        assert adapter_metadata(_peft_like(r=4, lora_alpha=8, **odd)) == {}
    assert adapter_metadata(_peft_like(r=0, lora_alpha=8)) == {}
    assert adapter_metadata(_peft_like(r=4, lora_alpha=-8)) == {}


def test_stage_state_casts_an_aliased_tensor_into_each_keys_own_dtype() -> None:
    # One tensor under two keys (an alias) that the model holds in two dtypes: each key
    # gets its own cast, so the float16 one overflows and is refused, never copied as Inf.
    value = torch.full((2,), 1e6)
    blob = encode_weights({"wide": value, "narrow": value}, dtype=torch.float32)
    state, meta = decode_weights(blob)
    assert state["wide"] is state["narrow"]
    reference = {"wide": torch.zeros(2), "narrow": torch.zeros(2, dtype=torch.float16)}
    with pytest.raises(WeightsError, match=r"\['narrow'\] once cast .*torch.float16"):
        stage_state(state, reference, PushForm.from_metadata(meta))
    fine = decode_weights(encode_weights({"wide": value / 1e3, "narrow": value / 1e3}))[0]
    staged = stage_state(fine, reference, PushForm(wire_dtype=torch.float32))
    assert staged["wide"].dtype == torch.float32
    assert staged["narrow"].dtype == torch.float16


def test_load_into_writes_every_untied_key_a_pushed_alias_names() -> None:
    # The learner ties two keys (one tensor, sent once) that this model holds apart:
    # both of the model's tensors get the pushed values.
    value = torch.arange(6.0).reshape(2, 3)
    state, meta = decode_weights(encode_weights({"weight": value, "bias": value}))
    assert state["weight"] is state["bias"]
    module = nn.Linear(2, 3)  # weight and bias apart (shaped alike below)
    module.bias = nn.Parameter(torch.zeros(2, 3))
    module.weight = nn.Parameter(torch.zeros(2, 3))
    load_into(module, state, PushForm.from_metadata(meta))
    assert torch.equal(module.weight, value)
    assert torch.equal(module.bias, value)
    assert module.weight.data_ptr() != module.bias.data_ptr()


@pytest.mark.parametrize("key", ["__metadata__", ALIASES_KEY])
def test_encode_weights_raises_if_a_key_is_reserved(key: str) -> None:
    with pytest.raises(WeightsError, match=rf"weight key '{key}' is reserved"):
        encode_weights({key: torch.zeros(2), "ok": torch.zeros(2)})


def test_decode_weights_as_a_subset_takes_a_blob_of_some_keys_that_declares_none() -> None:
    # A part of a multi-part push holds some of the model's keys whatever its header says.
    expected = {"a": ((2,), torch.float32), "b": ((3,), torch.float32)}
    blob = encode_weights({"a": torch.ones(2)})  # declares a full push
    state, _ = decode_weights(blob, expected=expected, subset=True)
    assert list(state) == ["a"]
    with pytest.raises(WeightsError, match="missing"):
        decode_weights(blob, expected=expected)


def test_wire_state_is_a_private_snapshot_training_in_place_leaves_alone() -> None:
    module = SharedLinear()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    snapshot = wire_state(module)  # no wire dtype: nothing is cast, so each is copied
    assert snapshot["blocks.0.weight"] is snapshot["shared.weight"]  # tied stays tied
    with torch.no_grad():
        for tensor in module.state_dict().values():
            tensor.add_(1)
    for key, value in before.items():
        assert torch.equal(snapshot[key], value), key


def test_decode_weights_names_only_the_unknown_keys_of_a_blob_the_model_lacks() -> None:
    expected = {"a": ((2,), torch.float32), "b": ((3,), torch.float32)}
    blob = encode_weights({"a": torch.ones(2), "zzz": torch.ones(1)})  # a full push
    with pytest.raises(WeightsError, match=r"unexpected keys \['zzz'\]") as caught:
        decode_weights(blob, expected=expected)
    assert "missing" not in str(caught.value)  # b's absence is not the news


@pytest.mark.parametrize("version", [True, False, -1, MAX_POLICY_VERSION + 1, 1.0, "3"])
def test_check_policy_version_raises_if_not_an_int64_version(version: object) -> None:
    with pytest.raises(WeightsError, match="policy version"):
        check_policy_version(version)


def test_check_policy_version_takes_both_ends_of_its_range() -> None:
    assert check_policy_version(0) == 0
    assert check_policy_version(MAX_POLICY_VERSION) == MAX_POLICY_VERSION


@pytest.mark.parametrize("metadata", [[("model_id", "policy")], "model_id=policy"])
def test_encode_weights_raises_type_error_if_metadata_is_not_a_mapping(metadata: object) -> None:
    with pytest.raises(TypeError, match="metadata must be a mapping of str to str"):
        encode_weights({"a": torch.zeros(2)}, metadata=metadata)  # type: ignore[arg-type]
