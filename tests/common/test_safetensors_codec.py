"""The safetensors codec: byte-identical to the safetensors package, zero-copy, strict layout."""

from __future__ import annotations

import json
import struct

import pytest
import safetensors.torch
import torch

from common.errors import WeightsError
from common.weights import BlobAssembler, check_finite, decode_weights, encode_weights, sha256_hex


def _every_dtype() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    floats = torch.randn(3, 2)
    return {
        "f64": floats.double(),
        "f32": floats,
        "f16": floats.half(),
        "bf16": floats.bfloat16(),
        "f8e4": floats.to(torch.float8_e4m3fn),
        "f8e5": floats.to(torch.float8_e5m2),
        "c64": torch.randn(2, dtype=torch.complex64),
        "i64": torch.arange(3),
        "i32": torch.arange(3, dtype=torch.int32),
        "i16": torch.arange(3, dtype=torch.int16),
        "i8": torch.arange(-1, 2, dtype=torch.int8),
        "u64": torch.tensor([1, 2], dtype=torch.uint64),
        "u32": torch.tensor([1, 2], dtype=torch.uint32),
        "u16": torch.tensor([3], dtype=torch.uint16),
        "u8": torch.arange(5, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "net.0.weight": torch.ones(2, 2),
    }


def _raw(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    # Bit patterns, so NaN-free float8 and bool compare exactly.
    return {k: v.reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in state.items()}


def _blob(entries: dict[str, dict], data: bytes) -> bytes:
    header = json.dumps(entries).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def _writable(blob: bytes) -> memoryview:
    # A torch buffer is 64-byte aligned, so offsets decide alignment.
    buffer = torch.empty(len(blob), dtype=torch.uint8)
    view = memoryview(buffer.numpy()).cast("B")
    view[:] = blob
    return view


def _inside(tensor: torch.Tensor, view: memoryview) -> bool:
    base = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
    return base <= tensor.data_ptr() < base + view.nbytes


def test_encode_weights_writes_the_bytes_safetensors_writes() -> None:
    # One metadata pair: safetensors keeps metadata in a Rust HashMap, whose
    # order varies from process to process.
    state = _every_dtype()
    metadata = {"model_id": "pølicy"}
    assert encode_weights(state, metadata=metadata) == safetensors.torch.save(state, metadata)
    assert encode_weights(state) == safetensors.torch.save(state)


def test_encode_weights_is_read_by_safetensors() -> None:
    state = _every_dtype()
    loaded = safetensors.torch.load(encode_weights(state))
    assert {k: (v.dtype, v.shape) for k, v in loaded.items()} == {
        k: (v.dtype, v.shape) for k, v in state.items()
    }
    assert _raw(loaded) == _raw(state)


def test_decode_weights_reads_what_safetensors_wrote() -> None:
    state = _every_dtype()
    decoded, metadata = decode_weights(safetensors.torch.save(state, {"k": "v"}))
    assert metadata == {"k": "v"}
    assert {k: (v.dtype, v.shape) for k, v in decoded.items()} == {
        k: (v.dtype, v.shape) for k, v in state.items()
    }
    assert _raw(decoded) == _raw(state)


def test_decode_weights_views_the_assembled_buffer_without_copying() -> None:
    blob = encode_weights(_every_dtype())
    assembler = BlobAssembler(len(blob), sha256=sha256_hex(blob))
    assembler.add(blob)
    view = assembler.finish()
    decoded, _ = decode_weights(view)
    assert all(_inside(t, view) for t in decoded.values() if t.numel())
    assert assembler.buffer.numel() == len(blob)


def test_decode_weights_copies_only_misaligned_tensors() -> None:
    # A u8 tensor of 1 byte puts the f32 tensor after it at an odd offset.
    entries = {
        "u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
    }
    view = _writable(_blob(entries, b"\x07" + struct.pack("<2f", 1.5, -2.0)))
    decoded, _ = decode_weights(view)
    assert decoded["f"].tolist() == [1.5, -2.0]
    assert decoded["u"].tolist() == [7]
    assert _inside(decoded["u"], view)
    assert not _inside(decoded["f"], view)


def test_decode_weights_copies_tensors_a_misaligned_buffer_leaves_unaligned() -> None:
    # Offsets aligned within the blob, but the blob itself starts at an odd address.
    blob = encode_weights({"f": torch.tensor([1.5, -2.0]), "d": torch.tensor([4.0]).double()})
    buffer = torch.empty(len(blob) + 1, dtype=torch.uint8)
    view = buffer.numpy().data.cast("B")[1:]
    view[:] = blob
    decoded, _ = decode_weights(view)
    assert decoded["f"].tolist() == [1.5, -2.0]
    assert decoded["d"].tolist() == [4.0]
    assert all(t.data_ptr() % t.element_size() == 0 for t in decoded.values())


def test_decode_weights_copies_a_read_only_blob() -> None:
    blob = encode_weights({"w": torch.ones(4)})
    decoded, _ = decode_weights(blob)  # warnings are errors: no non-writable-buffer warning
    decoded["w"].add_(1)
    assert decoded["w"].tolist() == [2.0] * 4


@pytest.mark.parametrize(
    ("entries", "data_bytes", "reason"),
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            12,
            "overlaps",
        ),
        (
            {
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
            },
            12,
            "gap",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8, "gap"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 12, "cover 8 bytes"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8, "cover 16 bytes"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, "needs 8 bytes"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, 8, "needs 4 bytes"),
    ],
    ids=[
        "overlapping",
        "gap",
        "not-from-zero",
        "data-left-over",
        "past-the-end",
        "size-not-shape",
        "reversed",
    ],
)
def test_decode_weights_raises_if_offsets_do_not_tile_the_data(
    entries: dict, data_bytes: int, reason: str
) -> None:
    with pytest.raises(WeightsError, match=f"not valid safetensors.*{reason}"):
        decode_weights(_writable(_blob(entries, b"\x00" * data_bytes)))


@pytest.mark.parametrize(
    ("info", "named"),
    [
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "shape"),
        # Two negative dims multiply to one element: only the sign check refuses them.
        ({"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}, "data_offsets"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}, "data_offsets"),
        ({"dtype": "F32", "shape": [1], "data_offsets": "0-4"}, "data_offsets"),
        ({"dtype": "F32", "shape": [1]}, "fields"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}, "fields"),
    ],
)
def test_decode_weights_raises_if_a_header_entry_is_malformed(info: dict, named: str) -> None:
    with pytest.raises(WeightsError, match=f"'a'.*{named}"):
        decode_weights(_blob({"a": info}, b"\x00" * 4))


def test_decode_weights_raises_if_header_repeats_a_key() -> None:
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    header = f'{{"a": {entry}, "a": {entry}}}'.encode()
    blob = struct.pack("<Q", len(header)) + header + b"\x00" * 4
    with pytest.raises(WeightsError, match="duplicate"):
        decode_weights(blob)


def test_check_finite_accepts_finite_values_whose_sum_overflows() -> None:
    check_finite(
        {
            "h": torch.full((4,), 60000.0, dtype=torch.float16),
            "f": torch.full((4,), 3e38),
            "c": torch.full((2,), 3e38, dtype=torch.complex64),
        }
    )


def test_check_finite_names_a_single_nan_in_a_large_tensor() -> None:
    big = torch.zeros(1_000_003)
    big[777_777] = float("nan")
    with pytest.raises(WeightsError, match="'big'") as info:
        check_finite({"big": big, "fine": torch.zeros(10)})
    assert "'fine'" not in str(info.value)
