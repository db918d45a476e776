"""Which pushes travel striped over parallel streams, and what each part's messages carry.

``learner_client._stripes.StripeRoute.striped``; the end-to-end behaviour against actor
processes is in ``test_collector_stripes.py``.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from common.checksum import crc32c
from common.config import CHUNK_BYTES
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import Part, checksums, decode_weights, encode_weights
from learner_client import WeightPushSettings
from learner_client._settings import MAX_STREAMS
from learner_client._stripes import MIN_STRIPE_BYTES, StripeRoute
from learner_client._weights import EncodedWeights

#: Four 1024 x 1024 float32 matrices: 16 MiB and a little, four tensors of 4 MiB.
MODEL = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(4)))


def encoded(checksum: str = "crc32c", **fields) -> EncodedWeights:
    blob = encode_weights(MODEL, metadata={"model_id": "policy"})
    return EncodedWeights("policy", 7, blob, *checksums(blob, checksum), **fields)


def reassembled(messages) -> tuple[pb.WeightsHeader, bytes]:
    """A part's header and its blob, read back from its serialised messages."""
    header = pb.PushWeightsRequest.FromString(messages[0]).header
    blob = b"".join(pb.PushWeightsRequest.FromString(m).chunk for m in messages[1:])
    return header, blob


@pytest.mark.parametrize("checksum", ["crc32c", "sha256"])
def test_a_full_push_is_striped_into_parts_that_check_and_hold_every_key(checksum) -> None:
    route = StripeRoute(streams=4)
    striped = route.striped(encoded(checksum), CHUNK_BYTES)
    assert striped is not None
    assert len(striped.parts) == 2  # 16 MiB: two parts of at least MIN_STRIPE_BYTES
    keys: set[str] = set()
    for index, messages in enumerate(striped.parts):
        header, blob = reassembled(messages)
        assert (header.model_id, header.version) == ("policy", 7)
        assert (header.part.index, header.part.count) == (index, 2)
        assert header.total_bytes == len(blob)
        if checksum == "crc32c":
            assert header.crc32c == crc32c(blob)
            assert not header.sha256
        else:
            assert header.sha256 == hashlib.sha256(blob).hexdigest()
            assert not header.HasField("crc32c")
        state, _ = decode_weights(bytearray(blob), subset=True)
        assert not keys & set(state)
        keys |= set(state)
        for key, tensor in state.items():
            assert torch.equal(tensor, MODEL.state_dict()[key])
    assert keys == set(MODEL.state_dict())


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        (StripeRoute(streams=1), {}),  # the default: one stream
        (StripeRoute(streams=4), {"base_version": 6}),  # a delta
        (StripeRoute(streams=4), {"part": Part(0, 2)}),  # a rank's part already
    ],
)
def test_what_goes_as_one_stream(route, fields) -> None:
    assert route.striped(encoded(**fields), CHUNK_BYTES) is None


def test_a_subset_and_a_blob_under_two_stripes_go_as_one_stream() -> None:
    route = StripeRoute(streams=4)
    some = dict(MODEL.state_dict())
    subset = encode_weights(some, metadata={"model_id": "policy"}, subset=True)
    enc = EncodedWeights("policy", 7, subset, *checksums(subset, "crc32c"))
    assert route.striped(enc, CHUNK_BYTES) is None
    small = encode_weights(MODEL, metadata={"model_id": "policy"}, dtype=torch.bfloat16)
    assert memoryview(small).nbytes < 2 * MIN_STRIPE_BYTES
    enc = EncodedWeights("policy", 7, small, *checksums(small, "crc32c"))
    assert route.striped(enc, CHUNK_BYTES) is None
    assert route.stats() == {"striped_pushes": 0}


@pytest.mark.parametrize("streams", [0, MAX_STREAMS + 1, True, 2.0, "4", None])
def test_streams_out_of_range_is_refused(streams) -> None:
    with pytest.raises(ValueError, match="streams"):
        WeightPushSettings(streams=streams)


def test_streams_default_to_one() -> None:
    assert WeightPushSettings().streams == 1
    assert WeightPushSettings(streams=MAX_STREAMS).streams == MAX_STREAMS
