"""Tests of the hand-composed ``CollectResponse`` chunk bytes against protobuf's own encoding."""

from __future__ import annotations

import pytest

from actor_service._wire import encode_chunk, encode_control
from common.rlfleet.v1 import actor_service_pb2 as pb

# Around each varint length boundary of the data and of the chunk body, plus a full chunk.
DATA_SIZES = [0, 1, 7, 100, 127, 128, 129, 16_300, 16_383, 16_384, 16_385, 3 * 2**20]
SEQS = [0, 1, 127, 128, 2**40]


def _info(seq: int) -> pb.BatchInfo:
    return pb.BatchInfo(
        worker_id=3,
        epoch=2**33,
        seq=seq,
        frames=256,
        frame_bytes=14_500_000,
        crc32c=0xDEADBEEF,
        model_id="policy",
        policy_version_min=4,
        policy_version_max=5,
    )


def _expected(
    seq: int, index: int, count: int, data: bytes, info: pb.BatchInfo | None
) -> pb.CollectResponse:
    message = pb.CollectResponse()
    message.chunk.seq, message.chunk.index, message.chunk.count = seq, index, count
    message.chunk.data = data
    if info is not None:
        message.chunk.info.CopyFrom(info)
    return message


@pytest.mark.parametrize("size", DATA_SIZES)
@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("first", [True, False])
def test_encode_chunk_matches_protobuf(size: int, seq: int, first: bool) -> None:
    data = bytes((i * 7 + size) % 251 for i in range(min(size, 4096))) * (size // 4096 + 1)
    data = data[:size]
    info = _info(seq) if first else None
    index, count = (0, 5) if first else (300, 301)
    expected = _expected(seq, index, count, data, info)

    encoded = encode_chunk(seq=seq, index=index, count=count, data=memoryview(data), info=info)

    assert pb.CollectResponse.FromString(encoded) == expected
    assert encoded == expected.SerializeToString()


@pytest.mark.parametrize("info_size", [0, 120, 126, 127, 128, 16_380, 16_384])
def test_encode_chunk_matches_protobuf_around_body_length_boundaries(info_size: int) -> None:
    # A long model_id moves the chunk body's own length across varint boundaries.
    info = pb.BatchInfo(seq=9, model_id="m" * info_size)
    for size in (0, 1, 100):
        data = b"\x01" * size
        encoded = encode_chunk(seq=9, index=0, count=1, data=data, info=info)
        expected = _expected(9, 0, 1, data, info)
        assert encoded == expected.SerializeToString(), (info_size, size)


def test_encode_chunk_keeps_an_empty_info_on_the_first_chunk() -> None:
    encoded = encode_chunk(seq=1, index=0, count=1, data=b"x", info=pb.BatchInfo())

    assert pb.CollectResponse.FromString(encoded).chunk.HasField("info")
    assert encoded == _expected(1, 0, 1, b"x", pb.BatchInfo()).SerializeToString()


def test_encode_control_round_trips() -> None:
    end = pb.CollectResponse(end=pb.StreamEnd(reason=pb.END_REASON_DRAINING, last_seq=12))

    assert pb.CollectResponse.FromString(encode_control(end)) == end
