"""The Collect response deserializer reads chunks as views and means what protobuf means."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from actor_service._serve._wire import encode_chunk
from common.protowire import varint
from common.replies import Unparsed, tolerant
from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client._collect_wire import Chunk, parse_collect_response


def _same(parsed, data: bytes) -> None:
    expected = pb.CollectResponse.FromString(data)
    if isinstance(parsed, Chunk):
        assert expected.WhichOneof("kind") == "chunk"
        assert parsed == Chunk.from_proto(expected.chunk)
    else:
        assert parsed == expected


@pytest.mark.parametrize("size", [0, 1, 127, 128, 3 << 20])
@pytest.mark.parametrize("seq", [0, 1, 2**64 - 1])
def test_parse_collect_response_views_the_data_of_a_chunk(size: int, seq: int) -> None:
    info = pb.BatchInfo(
        seq=seq, total_bytes=size, crc32c=7, fold=pb.ObservationFold(finals_bytes=3)
    )
    data = encode_chunk(
        seq=seq,
        index=0,
        count=2,
        data=bytes(range(256)) * (size // 256) + bytes(size % 256),
        info=info,
    )
    parsed = parse_collect_response(data)
    assert isinstance(parsed, Chunk)
    assert isinstance(parsed.data, memoryview)
    assert size == 0 or parsed.data.obj is data  # a view of gRPC's bytes, not a copy
    _same(parsed, data)


def test_parse_collect_response_leaves_everything_else_to_protobuf() -> None:
    chunk = pb.CollectResponse(chunk=pb.BatchChunk(seq=3, index=1, count=4, data=b"abc"))
    plain = chunk.SerializeToString()
    body = pb.BatchChunk(seq=3, index=1, count=4, data=b"abc").SerializeToString()
    unknown_field = b"\x12" + varint(len(body) + 2) + body + b"\x30\x01"  # field 6
    repeated_field = b"\x12" + varint(len(body) + 2) + body + b"\x08\x09"  # seq twice
    two_kinds = plain + pb.CollectResponse(opened=pb.SessionOpened(epoch=5)).SerializeToString()
    wide_index = b"\x12" + varint(len(body) + 6) + body + b"\x10" + varint(2**33)
    opened = pb.CollectResponse(opened=pb.SessionOpened(epoch=5)).SerializeToString()
    for data in (unknown_field, repeated_field, two_kinds, wide_index, opened, b""):
        parsed = parse_collect_response(data)
        assert isinstance(parsed, pb.CollectResponse)
        _same(parsed, data)
    assert isinstance(parse_collect_response(plain), Chunk)


def test_parse_collect_response_refuses_truncated_messages_as_protobuf_does() -> None:
    """As the channel reads it (``common.replies.tolerant``), without raising: gRPC's client
    would log a deserializer's exception, hand over None."""
    data = encode_chunk(seq=1, index=0, count=1, data=b"x" * 100, info=pb.BatchInfo())
    with pytest.raises(DecodeError):
        pb.CollectResponse.FromString(data[:-10])
    with pytest.raises(DecodeError):
        parse_collect_response(data[:-10])
    refused = tolerant(parse_collect_response)(data[:-10])
    assert isinstance(refused, Unparsed)
    assert refused.size == len(data) - 10
