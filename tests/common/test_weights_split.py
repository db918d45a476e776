"""``split_blob``: a whole blob cut by keys into parts that view its bytes.

Each part, its header followed by its run of the blob, must be a valid blob of its keys
that the actor's part check accepts; the parts together must hold every key once, with
the blob's values bit for bit, in every form a full push takes (wire dtype, tied weights,
mixed dtypes).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.weights import Part, PushForm, decode_weights, encode_weights, split_blob
from common.weights._aliases import ALIASES_KEY


class Tied(nn.Module):
    """An embedding tied to the output head, with tensors of several dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(300, 64)
        self.head = nn.Linear(64, 300, bias=False)
        self.head.weight = self.embed.weight
        self.mid = nn.Linear(64, 64)
        self.register_buffer("steps", torch.arange(7, dtype=torch.int64))
        self.register_buffer("scale", torch.ones(5, dtype=torch.float64))
        self.register_buffer("mask", torch.zeros(3, dtype=torch.bool))


def layers() -> nn.Module:
    return nn.Sequential(*(nn.Linear(200, 200) for _ in range(4)))


def joined(parts) -> tuple[dict[str, torch.Tensor], list[dict[str, str]]]:
    """Every part decoded as the blob it is; their tensors together, and each one's metadata."""
    state: dict[str, torch.Tensor] = {}
    metas = []
    for piece in parts:
        blob = bytearray(piece.header) + bytearray(piece.data)
        assert len(blob) == piece.nbytes
        tensors, meta = decode_weights(blob, subset=True)
        assert not set(tensors) & set(state), "a key travels in one part"
        state.update(tensors)
        metas.append(meta)
    return state, metas


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("make", [layers, Tied])
def test_parts_hold_every_key_once_bit_for_bit(count, dtype, make):
    torch.manual_seed(0)
    module = make()
    blob = encode_weights(module, metadata={"model_id": "policy"}, dtype=dtype)
    whole, _ = decode_weights(blob)
    parts = split_blob(blob, count)
    assert 1 <= len(parts) <= count
    assert [p.part for p in parts] == [Part(i, len(parts)) for i in range(len(parts))]
    state, metas = joined(parts)
    assert set(state) == set(whole)
    for key, tensor in whole.items():
        assert torch.equal(state[key], tensor)
        assert state[key].dtype == tensor.dtype
    for meta in metas:
        assert meta["model_id"] == "policy"
        assert PushForm.from_metadata(meta).wire_dtype == dtype


def test_a_tied_weight_travels_with_its_alias_and_decodes_tied():
    blob = encode_weights(Tied(), metadata={"model_id": "policy"})
    parts = split_blob(blob, 4)
    assert len(parts) >= 2
    tied = []
    for piece in parts:
        tensors, meta = decode_weights(bytearray(piece.header) + bytearray(piece.data), subset=True)
        if "head.weight" in tensors:
            tied.append(piece)
            assert ALIASES_KEY in meta
            assert tensors["head.weight"] is tensors["embed.weight"]
        else:
            assert ALIASES_KEY not in meta
    assert len(tied) == 1


def test_parts_view_the_blob_and_are_about_equal():
    model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(8)))  # eight 256 KiB matrices
    blob = encode_weights(model)
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)  # writable: views share it
    parts = split_blob(memoryview(data.numpy()), 4)
    assert len(parts) == 4
    sizes = [p.data.nbytes for p in parts]
    assert max(sizes) < 1.1 * min(sizes)
    header = 8 + int.from_bytes(blob[:8], "little")
    assert sum(sizes) == len(blob) - header  # every data byte in exactly one run
    data[-1] ^= 0xFF  # a view of the blob: the last part sees the change
    assert parts[-1].data[-1] == data[-1].item()


def test_a_dominant_tensor_is_never_cut():
    model = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 2))  # one tensor: 99.6%
    parts = split_blob(encode_weights(model), 4)
    assert len(parts) == 1
    state, _ = joined(parts)
    assert set(state) == set(model.state_dict())


def test_a_subset_blob_and_a_bad_count_are_refused():
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100))
    subset = encode_weights(dict(model.state_dict()), subset=True)
    with pytest.raises(ValueError, match="subset"):
        split_blob(subset, 2)
    with pytest.raises(ValueError, match="count"):
        split_blob(encode_weights(model), 0)
