"""The weight codec: round trips, strict decoding, compatibility checks, chunking, atomic loads."""

from __future__ import annotations

import io
import json
import struct

import pytest
import torch
from tensordict import TensorDict
from torch import nn

import common.weights as weights_module
from common.config import CHUNK_BYTES
from common.errors import DataLossError, SessionStateError, WeightsError, WeightsTooLargeError
from common.weights import (
    DEFAULT_MAX_WEIGHT_BYTES,
    MAX_PARTS,
    BlobAssembler,
    Part,
    check_compatible,
    check_finite,
    crc32c,
    decode_weights,
    encode_weights,
    iter_blob_chunks,
    load_into,
    sha256_hex,
    to_state_dict,
)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(_bytes_of(a[key]), _bytes_of(b[key])), key


def _raw_blob(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def test_weights_module_pins_its_public_names() -> None:
    assert sorted(weights_module.__all__) == sorted(
        [
            "DEFAULT_MAX_KEYS",
            "DEFAULT_MAX_WEIGHT_BYTES",
            "WIRE_DTYPES",
            "PushForm",
            "adapter_metadata",
            "apply_staged",
            "default_max_weight_bytes",
            "eager_names",
            "stage_state",
            "state_nbytes",
            "Expected",
            "check_policy_version",
            "BlobAssembler",
            "check_blob_size",
            "check_digests",
            "BlobPart",
            "split_blob",
            "check_compatible",
            "check_finite",
            "decode_weights",
            "encode_weights",
            "iter_blob_chunks",
            "load_into",
            "sha256_hex",
            "to_state_dict",
            "wire_state",
            "CHECKSUMS",
            "checksums",
            "crc32c",
            "Delta",
            "apply_delta",
            "decode_delta",
            "encode_delta",
            "MAX_PARTS",
            "Part",
            "PushOutcome",
            "check_ties",
            "check_writable",
        ]
    )
    assert DEFAULT_MAX_WEIGHT_BYTES == 1 << 30


@pytest.mark.parametrize(
    ("index", "count", "needle"),
    [
        (0, 0, "count 0"),
        (2, 2, "index 2"),
        (-1, 2, "index -1"),
        (0, MAX_PARTS + 1, f"count {MAX_PARTS + 1}"),
        (0, 2**32 - 1, "4294967295"),
        (True, 2, "int"),
        (0, 2.0, "int"),
    ],
)
def test_part_raises_if_index_or_count_is_out_of_range(index, count, needle: str) -> None:
    with pytest.raises(WeightsError, match=needle):
        Part(index, count)


def test_part_names_itself_index_of_count() -> None:
    assert str(Part(1, 2)) == "1/2"
    assert Part(MAX_PARTS - 1, MAX_PARTS).count == MAX_PARTS


# --- round trips -------------------------------------------------------------


def test_encode_weights_round_trips_a_module_with_buffers() -> None:
    module = _mlp()
    module.train()
    module(torch.randn(16, 4))  # moves BatchNorm's running stats off their defaults
    state, meta = decode_weights(encode_weights(module))
    assert meta == {}
    assert "1.running_mean" in state
    assert "1.num_batches_tracked" in state
    _assert_bit_identical(state, _snapshot(module))


def test_to_state_dict_gives_the_same_keys_for_a_module_and_its_tensordict() -> None:
    module = _mlp()
    from_td = to_state_dict(TensorDict.from_module(module))
    assert sorted(from_td) == sorted(module.state_dict())
    _assert_bit_identical(from_td, to_state_dict(module))
    state, _ = decode_weights(encode_weights(TensorDict.from_module(module)))
    _assert_bit_identical(state, _snapshot(module))


def test_to_state_dict_returns_detached_contiguous_cpu_tensors() -> None:
    weight = nn.Parameter(torch.randn(3, 5))
    state = to_state_dict({"w": weight, "t": torch.randn(5, 3).t()})
    assert not state["w"].requires_grad
    assert state["t"].is_contiguous()
    assert state["t"].device.type == "cpu"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_to_state_dict_of_a_compiled_module_has_the_eager_keys() -> None:
    """``torch.compile`` names weights ``_orig_mod.*``; actors hold the module as built."""
    module = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 3)))
    module[1] = torch.compile(module[1])  # a compiled part inside
    compiled = torch.compile(module)
    assert all(key.startswith("_orig_mod.") for key in compiled.state_dict())
    eager = to_state_dict(module)
    assert sorted(eager) == ["0.bias", "0.weight", "1.0.bias", "1.0.weight"]
    _assert_bit_identical(to_state_dict(compiled), eager)


def test_encode_weights_round_trips_one_element_tensors_with_a_zero_stride() -> None:
    """``scalar.expand(1)`` is contiguous to torch, with stride 0: no byte view takes it."""
    weight = torch.tensor(2.5).expand(1)
    assert weight.is_contiguous()
    assert weight.stride() == (0,)
    state, _ = decode_weights(encode_weights({"scale": weight, "row": torch.ones(1, 4)[:, :1]}))
    assert torch.equal(state["scale"], torch.tensor([2.5]))
    assert torch.equal(state["row"], torch.ones(1, 1))


def test_encode_weights_round_trips_plain_and_nested_dicts() -> None:
    plain = {"a": torch.arange(6, dtype=torch.int64).reshape(2, 3), "b": torch.tensor(True)}
    state, _ = decode_weights(encode_weights(plain))
    _assert_bit_identical(state, plain)
    nested = {"net": {"0": {"weight": torch.ones(2, 2)}, "scale": torch.zeros(1)}}
    state, _ = decode_weights(encode_weights(nested))
    assert sorted(state) == ["net.0.weight", "net.scale"]
    assert torch.equal(state["net.0.weight"], torch.ones(2, 2))


def test_encode_weights_round_trips_metadata() -> None:
    metadata = {"model_id": "policy", "version": "7", "note": "ünïcode"}
    _, meta = decode_weights(encode_weights({"a": torch.zeros(1)}, metadata=metadata))
    assert meta == metadata


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float64, torch.uint8, torch.float8_e4m3fn]
)
def test_encode_weights_round_trips_dtype(dtype: torch.dtype) -> None:
    original = {"w": torch.randn(3, 4).to(dtype)}
    state, _ = decode_weights(encode_weights(original))
    assert state["w"].dtype == dtype
    _assert_bit_identical(state, original)


def test_encode_weights_accepts_tied_weights() -> None:
    embed = nn.Embedding(5, 3)
    head = nn.Linear(3, 5, bias=False)
    head.weight = embed.weight
    module = nn.ModuleDict({"embed": embed, "head": head})
    state, _ = decode_weights(encode_weights(module))
    assert sorted(state) == ["embed.weight", "head.weight"]
    assert torch.equal(state["embed.weight"], state["head.weight"])
    load_into(module, state)  # both names load back into the one shared parameter
    assert torch.equal(module.head.weight, state["head.weight"])


def test_a_push_with_keys_the_model_lacks_names_them_before_its_tied_aliases() -> None:
    """``TensorDict.from_module`` of a tied model holds non-persistent buffers too: the keys
    the model lacks are named, not the alias count they used up; a wrapper's prefix says so."""
    shared = torch.ones(5, 3)
    expected = {"embed.weight": ((5, 3), torch.float32), "head.weight": ((5, 3), torch.float32)}
    extra = {"embed.weight": shared, "head.weight": shared, "rotary.inv_freq": torch.ones(2)}
    with pytest.raises(WeightsError, match=r"unexpected keys \['rotary.inv_freq'\]"):
        decode_weights(encode_weights(extra), expected=expected)
    wrapped = {f"model.{key}": value for key, value in extra.items()}
    with pytest.raises(WeightsError, match=r"prefix 'model\.' of a wrapper"):
        decode_weights(encode_weights(wrapped), expected=expected)
    state, _ = decode_weights(encode_weights({"embed.weight": shared, "head.weight": shared}),
                              expected=expected)  # fmt: skip
    assert sorted(state) == ["embed.weight", "head.weight"]


def test_encode_weights_accepts_empty_and_scalar_tensors() -> None:
    original = {"empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5)}
    state, _ = decode_weights(encode_weights(original))
    assert state["empty"].shape == (0, 3)
    assert state["scalar"].shape == ()
    assert state["scalar"].item() == 2.5


def test_decode_weights_accepts_bytearray_and_memoryview() -> None:
    blob = encode_weights({"a": torch.ones(3)})
    for form in (bytearray(blob), memoryview(blob)):
        state, _ = decode_weights(form)
        assert torch.equal(state["a"], torch.ones(3))


# --- encode-side type errors -------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "named"),
    [
        ({"a": torch.zeros(1), "b": [1.0, 2.0]}, "'b'"),
        ({"net": {"w": 3}}, "'net.w'"),
        ({"a": torch.zeros(2, dtype=torch.complex128)}, "complex128"),
        ({"a": torch.zeros(2).to_sparse()}, "'a'"),
        ({1: torch.zeros(1)}, "1"),
        ([torch.zeros(1)], "list"),
        (nn.LazyLinear(2), "'weight' is a lazy module's uninitialised parameter: run the"),
    ],
)
def test_encode_weights_raises_if_value_is_not_a_storable_tensor(obj: object, named: str) -> None:
    with pytest.raises(TypeError, match=named):
        encode_weights(obj)  # type: ignore[arg-type]


def test_encode_weights_raises_if_tensordict_holds_non_tensor_data() -> None:
    td = TensorDict({"a": torch.zeros(1), "label": "text"}, batch_size=[])
    with pytest.raises(TypeError, match="'label'"):
        encode_weights(td)


def test_encode_weights_raises_if_metadata_is_not_strings() -> None:
    with pytest.raises(TypeError, match="version"):
        encode_weights({"a": torch.zeros(1)}, metadata={"version": 3})  # type: ignore[dict-item]


def test_encode_weights_raises_if_a_key_is_not_utf8_text() -> None:
    """A lone surrogate (``os.fsdecode`` of a stray byte) failed deep in the header's encoding,
    a bare UnicodeEncodeError naming a byte position instead of the key."""
    for source in (
        {"net": {"w\udc80": torch.zeros(1)}},
        TensorDict({"net.w\udc80": torch.zeros(1)}),
    ):
        with pytest.raises(WeightsError, match=r"'net\.w\\udc80' is not UTF-8 text"):
            encode_weights(source)


def test_to_state_dict_raises_if_nested_keys_collide() -> None:
    with pytest.raises(WeightsError, match=r"'a\.b'"):
        to_state_dict({"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}})


# --- decode-side validation --------------------------------------------------


def test_decode_weights_raises_if_blob_is_over_the_cap_without_parsing() -> None:
    # A header length claiming ~2**62 bytes and a junk body: only the cap may answer.
    blob = struct.pack("<Q", 1 << 62) + b"\xff" * 1024
    with pytest.raises(WeightsTooLargeError, match="1032 bytes exceeds the cap of 1000"):
        decode_weights(blob, max_bytes=1000)


def test_decode_weights_holds_a_blob_to_its_byte_and_tensor_caps_exactly() -> None:
    blob = encode_weights({f"k{i}": torch.zeros(0) for i in range(6)})
    state, _ = decode_weights(blob, max_bytes=len(blob), max_keys=6)
    assert sorted(state) == [f"k{i}" for i in range(6)]
    with pytest.raises(WeightsTooLargeError, match=f"{len(blob)} bytes exceeds the cap"):
        decode_weights(blob, max_bytes=len(blob) - 1)
    with pytest.raises(WeightsTooLargeError, match="lists 6 tensors; at most 5"):
        decode_weights(blob, max_keys=5)


def _padded_blob(header_bytes: int) -> bytes:
    # One 4-byte tensor, its header padded by metadata to exactly ``header_bytes``.
    entry = {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    bare = len(json.dumps({"__metadata__": {"pad": ""}, **entry}).encode())
    header = json.dumps({"__metadata__": {"pad": "x" * (header_bytes - bare)}, **entry}).encode()
    assert len(header) == header_bytes
    return _raw_blob(header, b"\x00" * 4)


def test_decode_weights_bounds_the_header_by_the_tensors_it_may_list() -> None:
    # 1 MiB for metadata plus 1 KiB per tensor allowed, far below the 100 MB cap.
    two_keys, one_key = (1 << 20) + 2 * 1024, (1 << 20) + 1024
    state, _ = decode_weights(_padded_blob(two_keys), max_keys=2)
    assert state["w"].tolist() == [0.0]
    with pytest.raises(WeightsTooLargeError, match=f"cap of {two_keys} bytes for at most 2"):
        decode_weights(_padded_blob(two_keys + 1), max_keys=2)
    expected = {"w": ((1,), torch.float32)}
    decode_weights(_padded_blob(one_key), expected=expected)
    # Over what the model's keys allow, the blob cannot fit it: invalid, not too large.
    with pytest.raises(WeightsError, match=f"cap of {one_key} bytes for at most 1") as raised:
        decode_weights(_padded_blob(one_key + 1), expected=expected)
    assert not isinstance(raised.value, WeightsTooLargeError)


def test_decode_weights_parses_at_most_twice_the_models_keys_plus_sixteen() -> None:
    empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    expected = {"w": ((1,), torch.float32)}
    # 18 entries (2 x 1 + 16) are parsed, so the error names the keys the model lacks.
    named = json.dumps({f"k{i}": empty for i in range(18)}).encode()
    with pytest.raises(WeightsError, match="unexpected keys"):
        decode_weights(_raw_blob(named), expected=expected)
    counted = json.dumps({f"k{i}": empty for i in range(19)}).encode()
    with pytest.raises(WeightsError, match="lists 19 tensors; at most 1 are accepted"):
        decode_weights(_raw_blob(counted), expected=expected)


def test_decode_weights_raises_weights_error_on_a_deeply_nested_header() -> None:
    # A few hundred KB of brackets: within the header cap, beyond json's recursion limit.
    with pytest.raises(WeightsError, match="not valid JSON"):
        decode_weights(_raw_blob(b"[" * 200_000))


def test_decode_weights_raises_if_header_length_points_past_the_end() -> None:
    blob = encode_weights({"a": torch.ones(4)})
    forged = struct.pack("<Q", len(blob)) + blob[8:]
    with pytest.raises(WeightsError, match="points past the end"):
        decode_weights(forged)


def test_decode_weights_raises_if_header_is_over_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lower the 100 MB header cap rather than build a 100 MB blob on a shared machine.
    monkeypatch.setattr(weights_module, "MAX_HEADER_BYTES", 64)
    header = json.dumps({"__metadata__": {"pad": "x" * 64}}).encode()
    with pytest.raises(WeightsTooLargeError, match=f"header of {len(header)} bytes"):
        decode_weights(_raw_blob(header))


def test_decode_weights_raises_if_blob_is_truncated() -> None:
    blob = encode_weights({"a": torch.ones(64), "b": torch.ones(64)})
    for cut in (3, len(blob) - 1, len(blob) - 100):
        with pytest.raises(WeightsError):
            decode_weights(blob[:cut])


def test_decode_weights_raises_if_blob_is_garbage() -> None:
    with pytest.raises(WeightsError):
        decode_weights(b"\x07\x00\x00\x00\x00\x00\x00\x00not-json-at-all")
    with pytest.raises(WeightsError, match="JSON object"):
        decode_weights(_raw_blob(b"[1, 2]"))


def test_decode_weights_raises_if_offsets_do_not_match_the_data() -> None:
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    with pytest.raises(WeightsError, match="not valid safetensors"):
        decode_weights(_raw_blob(header, b"\x00" * 8))


def test_decode_weights_raises_if_dtype_is_not_allowed() -> None:
    header = json.dumps({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    with pytest.raises(WeightsError, match=r"'a'.*'F4'"):
        decode_weights(_raw_blob(header, b"\x00"))


def test_decode_weights_raises_if_blob_is_a_torch_save_pickle() -> None:
    buffer = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buffer)
    with pytest.raises(WeightsError):
        decode_weights(buffer.getvalue())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_decode_weights_raises_if_values_are_not_finite(bad: float) -> None:
    weights = {"ok": torch.ones(3), "bad.w": torch.tensor([1.0, bad]), "ints": torch.ones(2).long()}
    with pytest.raises(WeightsError, match=r"bad\.w") as info:
        decode_weights(encode_weights(weights))
    assert "'ok'" not in str(info.value)


def test_check_finite_names_every_non_finite_key_in_low_precision() -> None:
    state = {
        "h": torch.tensor([float("nan")], dtype=torch.float16),
        "b": torch.tensor([float("inf")], dtype=torch.bfloat16),
        "f8": torch.tensor([float("nan")]).to(torch.float8_e4m3fn),
        "fine": torch.zeros(2, dtype=torch.bfloat16),
    }
    with pytest.raises(WeightsError) as info:
        check_finite(state)
    message = str(info.value)
    assert all(f"'{k}'" in message for k in ("h", "b", "f8"))
    assert "fine" not in message


# --- compatibility -----------------------------------------------------------


def test_check_compatible_names_every_problem_at_once() -> None:
    reference = {
        "keep": torch.zeros(2),
        "gone.a": torch.zeros(1),
        "gone.b": torch.zeros(1),
        "shape.w": torch.zeros(3, 4),
        "dtype.w": torch.zeros(2),
    }
    state = {
        "keep": torch.zeros(2),
        "extra.a": torch.zeros(1),
        "extra.b": torch.zeros(1),
        "shape.w": torch.zeros(4, 3),
        "dtype.w": torch.zeros(2, dtype=torch.float16),
    }
    with pytest.raises(WeightsError) as info:
        check_compatible(state, reference)
    message = str(info.value)
    for name in ("gone.a", "gone.b", "extra.a", "extra.b", "shape.w", "dtype.w"):
        assert name in message
    assert "[4, 3]" in message
    assert "[3, 4]" in message
    assert "torch.float16" in message
    assert "torch.float32" in message
    assert "keep" not in message


def test_check_compatible_accepts_a_matching_state() -> None:
    module = _mlp()
    check_compatible(to_state_dict(module), module.state_dict())


# --- load_into ---------------------------------------------------------------


def test_load_into_applies_an_accepted_state() -> None:
    module = _mlp()
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
    other.train()
    other(torch.randn(16, 4))
    before = _snapshot(module)
    state, _ = decode_weights(encode_weights(other))
    load_into(module, state)
    assert not torch.equal(before["0.weight"], module[0].weight)
    _assert_bit_identical(_snapshot(module), _snapshot(other))


@pytest.mark.parametrize("defect", ["nan", "missing", "unexpected", "shape", "dtype"])
def test_load_into_leaves_the_module_untouched_if_state_is_rejected(defect: str) -> None:
    module = _mlp()
    before = _snapshot(module)
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in before.items()}
    if defect == "nan":
        state["3.bias"] = torch.tensor([0.0, float("nan")])  # the last key: earlier ones are fine
    elif defect == "missing":
        del state["3.bias"]
    elif defect == "unexpected":
        state["4.weight"] = torch.zeros(1)
    elif defect == "shape":
        state["3.bias"] = torch.zeros(3)
    else:
        state["3.bias"] = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(WeightsError):
        load_into(module, state)
    _assert_bit_identical(_snapshot(module), before)


# --- chunking and reassembly -------------------------------------------------


def test_iter_blob_chunks_yields_zero_copy_slices_that_reassemble() -> None:
    blob = bytes(range(256)) * 41  # 10496 bytes: not a multiple of the chunk size
    chunks = list(iter_blob_chunks(blob, 1000))
    assert [len(c) for c in chunks] == [1000] * 10 + [496]
    assert all(isinstance(c, memoryview) and c.obj is blob for c in chunks)
    assembler = BlobAssembler(len(blob), sha256=sha256_hex(blob))
    for chunk in chunks:
        assembler.add(chunk)
    assert bytes(assembler.finish()) == blob  # finish() raises unless every byte arrived


def test_iter_blob_chunks_defaults_to_the_shared_chunk_size() -> None:
    blob = b"\x01" * (CHUNK_BYTES + 1)
    assert [len(c) for c in iter_blob_chunks(blob)] == [CHUNK_BYTES, 1]
    assert list(iter_blob_chunks(b"")) == []


def test_iter_blob_chunks_raises_if_chunk_size_is_not_positive() -> None:
    with pytest.raises(ValueError, match="0"):
        list(iter_blob_chunks(b"abc", 0))


def test_blob_assembler_feeds_decode_weights() -> None:
    blob = encode_weights(_mlp(), metadata={"version": "3"})
    assembler = BlobAssembler(len(blob), sha256=sha256_hex(blob).upper())
    for chunk in iter_blob_chunks(blob, 97):
        assembler.add(bytes(chunk))
    state, meta = decode_weights(assembler.finish())
    assert meta == {"version": "3"}
    _assert_bit_identical(state, _snapshot(_mlp()))


def test_blob_assembler_raises_if_size_is_over_the_cap_before_allocating() -> None:
    with pytest.raises(WeightsTooLargeError, match=str(DEFAULT_MAX_WEIGHT_BYTES)):
        BlobAssembler(1 << 60)  # allocating this would fail long before the check
    with pytest.raises(WeightsTooLargeError, match="11 bytes"):
        BlobAssembler(11, max_bytes=10)


def test_blob_assembler_raises_if_size_is_negative() -> None:
    with pytest.raises(WeightsError, match="-1"):
        BlobAssembler(-1)


def test_blob_assembler_raises_if_crc32c_is_over_32_bits() -> None:
    with pytest.raises(WeightsError, match="crc32c must be an int"):
        BlobAssembler(3, crc32c=2**32)


@pytest.mark.parametrize(
    "buffer",
    [torch.empty(4, dtype=torch.uint8), torch.empty(8, dtype=torch.float32)],
    ids=["too-small", "not-uint8"],
)
def test_blob_assembler_allocates_its_own_buffer_if_the_given_one_cannot_hold_the_blob(
    buffer: torch.Tensor,
) -> None:
    assembler = BlobAssembler(8, buffer=buffer)
    assembler.add(b"abcdefgh")
    assert bytes(assembler.finish()) == b"abcdefgh"
    assert assembler.buffer.dtype == torch.uint8


def test_blob_assembler_checks_crc32c_over_one_byte_chunks_and_refuses_chunks_once_done() -> None:
    assembler = BlobAssembler(3, crc32c=crc32c(b"abc"))
    for chunk in (b"a", b"bc"):
        assembler.add(chunk)
    assert bytes(assembler.finish()) == b"abc"
    with pytest.raises(SessionStateError, match="already finished"):
        assembler.add(b"")


def test_check_finite_names_a_nan_in_a_complex_tensor() -> None:
    with pytest.raises(WeightsError, match=r"\['c'\]"):
        check_finite({"c": torch.tensor([complex(float("nan"), 0.0)]), "f": torch.ones(2)})


def test_default_max_weight_bytes_gives_a_large_model_a_quarter_more_than_its_bytes() -> None:
    assert weights_module.default_max_weight_bytes(4 << 30) == 5 << 30
    assert weights_module.default_max_weight_bytes(1) == DEFAULT_MAX_WEIGHT_BYTES


def test_blob_assembler_raises_if_size_is_a_bool() -> None:
    with pytest.raises(TypeError, match="must be an int, got bool"):
        BlobAssembler(True)


def test_blob_assembler_raises_if_sha256_is_malformed() -> None:
    with pytest.raises(WeightsError, match="64 hex"):
        BlobAssembler(3, sha256="abc")
    with pytest.raises(WeightsError, match="64 hex"):  # a digest and more is not a digest
        BlobAssembler(3, sha256="a" * 65)


def test_blob_assembler_raises_if_chunks_overflow() -> None:
    assembler = BlobAssembler(5)
    assembler.add(b"abc")
    with pytest.raises(WeightsError, match="overflows"):
        assembler.add(b"def")
    assembler.add(b"de")
    assert bytes(assembler.finish()) == b"abcde"  # the rejected chunk left no trace


def test_blob_assembler_raises_if_bytes_are_missing() -> None:
    assembler = BlobAssembler(5)
    assembler.add(b"abcd")
    with pytest.raises(WeightsError, match="4 of 5"):
        assembler.finish()


def test_blob_assembler_raises_if_sha256_does_not_match() -> None:
    assembler = BlobAssembler(3, sha256=sha256_hex(b"abc"))
    assembler.add(b"abd")
    with pytest.raises(DataLossError, match="sha256"):
        assembler.finish()


def test_blob_assembler_checks_sha256_across_chunks_of_mixed_sizes() -> None:
    blob = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8).numpy().tobytes()
    sizes = [300_000, 300_000, 100, 448_476]
    for digest, ok in ((sha256_hex(blob), True), (sha256_hex(blob[::-1]), False)):
        assembler = BlobAssembler(len(blob), sha256=digest)
        start = 0
        for size in sizes:
            assembler.add(blob[start : start + size])
            start += size
        if ok:
            assert bytes(assembler.finish()) == blob
        else:
            with pytest.raises(DataLossError, match="sha256 mismatch"):
                assembler.finish()
