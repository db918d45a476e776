"""Weight-push chunk messages: protobuf's own encoding, built once and shared per blob."""

from __future__ import annotations

import pytest

from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client._push_chunks import SharedChunks, encode_chunk, encode_header


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 3 << 20])
def test_encode_chunk_matches_protobuf_serialisation(size: int) -> None:
    piece = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = pb.PushWeightsRequest(chunk=piece).SerializeToString()
    assert encode_chunk(memoryview(piece)) == expected
    assert pb.PushWeightsRequest.FromString(encode_chunk(piece)).chunk == piece


def test_encode_header_parses_back() -> None:
    header = pb.WeightsHeader(model_id="policy", version=3, total_bytes=10, sha256="ab" * 32)
    assert pb.PushWeightsRequest.FromString(encode_header(header)).header == header


def test_shared_chunks_share_one_encoding_between_overlapping_holders() -> None:
    blob = bytes(range(10)) * 5
    shared = SharedChunks(chunk_bytes=16)
    with shared.hold(blob) as first, shared.hold(blob) as second:
        a, b = list(first), list(second)
        assert len(shared) == 1
    assert [pb.PushWeightsRequest.FromString(m).chunk for m in a] == [
        blob[i : i + 16] for i in range(0, 50, 16)
    ]
    assert all(x is y for x, y in zip(a, b, strict=True))


def test_shared_chunks_release_the_blob_when_the_last_holder_is_done() -> None:
    shared = SharedChunks(chunk_bytes=4)
    blob, other = b"abcdefgh", b"12345678"
    with shared.hold(blob), shared.hold(other) as chunks:
        assert len(shared) == 2
        assert pb.PushWeightsRequest.FromString(next(chunks)).chunk == b"1234"
    assert len(shared) == 0


def test_shared_chunks_yield_nothing_for_an_empty_blob() -> None:
    with SharedChunks().hold(b"") as chunks:
        assert list(chunks) == []
