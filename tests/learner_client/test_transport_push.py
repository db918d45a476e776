"""Weight-push messages: protobuf's own encoding, built once per push for every target."""

from __future__ import annotations

import pytest

from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client._transport import encode_chunk, encode_header, push_messages


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 3 << 20])
def test_encode_chunk_matches_protobuf_serialisation(size: int) -> None:
    piece = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = pb.PushWeightsRequest(chunk=piece).SerializeToString()
    assert encode_chunk(memoryview(piece)) == expected
    assert pb.PushWeightsRequest.FromString(encode_chunk(piece)).chunk == piece


def test_encode_header_parses_back() -> None:
    header = pb.WeightsHeader(model_id="policy", version=3, total_bytes=10, sha256="ab" * 32)
    assert pb.PushWeightsRequest.FromString(encode_header(header)).header == header


def test_push_messages_are_the_header_then_every_chunk() -> None:
    blob = bytes(range(10)) * 5
    messages = push_messages("critic", 7, blob, "ab" * 32, chunk_bytes=16)
    first = pb.PushWeightsRequest.FromString(messages[0])
    assert first.header == pb.WeightsHeader(
        model_id="critic", version=7, total_bytes=50, sha256="ab" * 32
    )
    assert [pb.PushWeightsRequest.FromString(m).chunk for m in messages[1:]] == [
        blob[i : i + 16] for i in range(0, 50, 16)
    ]


def test_push_messages_of_an_empty_blob_are_the_header_alone() -> None:
    messages = push_messages("policy", 1, b"", "00" * 32)
    assert len(messages) == 1
    assert pb.PushWeightsRequest.FromString(messages[0]).header.total_bytes == 0


def test_push_messages_are_built_once_when_first_asked_for() -> None:
    blob = bytes(range(100))
    messages = push_messages("policy", 2, blob, "", chunk_bytes=40, crc32c=7, base_version=1)
    assert len(messages) == 4
    assert messages[2] is messages[2]  # built once, then shared by every target
    assert messages[-1] == pb.PushWeightsRequest(chunk=blob[80:]).SerializeToString()
    header = pb.PushWeightsRequest.FromString(messages[0]).header
    assert (header.crc32c, header.base_version, header.sha256) == (7, 1, "")
    assert header.HasField("crc32c")
    assert header.HasField("base_version")
    with pytest.raises(IndexError):
        messages[4]
    assert b"".join(pb.PushWeightsRequest.FromString(m).chunk for m in messages[1:]) == blob
