"""Weights of a module on an accelerator, encoded straight into one host buffer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.weights import decode_weights, encode_weights
from common.weights._safetensors import _layout, _write_in_place, write_blob
from learner_client._slabs import BlobBuffers


def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "w": torch.randn(3, 5),
        "b": torch.randn(5, dtype=torch.float64),
        "h": torch.randn(7).to(torch.bfloat16),
        "n": torch.arange(4, dtype=torch.int64),
        "e": torch.zeros(0),
    }


def test_blob_written_in_place_is_the_joined_blob():
    tensors = state()
    joined = write_blob(tensors, {"model_id": "policy"})
    assert isinstance(joined, bytes)
    order, prefix = _layout(tensors, {"model_id": "policy"})
    in_place = _write_in_place(tensors, order, prefix, BlobBuffers().for_model("policy"))
    assert isinstance(in_place, memoryview)
    assert bytes(in_place) == joined
    assert bytes(_write_in_place(tensors, order, prefix, None)) == joined


def test_blob_buffers_reuse_a_buffer_once_nothing_views_it():
    buffers = BlobBuffers()
    first = buffers.take("policy", 100)
    view = first[:50]
    second = buffers.take("policy", 100)
    assert second.data_ptr() != first.data_ptr()  # the first is still viewed
    del view, first
    assert buffers.take("policy", 80).numel() == 100  # an idle one is reused
    assert buffers.take("critic", 10).numel() == 10


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_module_encodes_to_the_cpu_module_bytes_once_through_pinned_memory(dtype):
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)
    on_host = encode_weights(module, metadata={"model_id": "policy"})
    buffers = BlobBuffers()
    on_cuda = encode_weights(
        module.cuda(), metadata={"model_id": "policy"}, allocate=buffers.for_model("policy")
    )
    assert isinstance(on_cuda, memoryview)
    assert bytes(on_cuda) == on_host
    weights, _ = decode_weights(on_cuda)
    assert all(v.dtype == dtype for v in weights.values())
    ((buffer, _),) = buffers._kept["policy"]
    assert buffer.is_pinned()
