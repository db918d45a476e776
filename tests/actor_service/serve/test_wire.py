"""Hand-composed ``CollectResponse`` chunks and hand-read ``PushWeights`` chunks vs protobuf."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from actor_service._serve._encoded import _encoded
from actor_service._serve._wire import (
    RawChunk,
    RawRelayChunk,
    decode_push_request,
    decode_relay_request,
    encode_chunk,
    encode_control,
    encode_relay_chunk,
)
from common.checksum import crc32c
from common.errors import ProtocolError
from common.packets import encode_packet
from common.protowire import length_delimited
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
        total_bytes=14_500_000,
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


@pytest.mark.parametrize("size", DATA_SIZES)
def test_decode_push_request_views_chunks_as_protobuf_parses_them(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    wire = pb.PushWeightsRequest(chunk=data).SerializeToString()
    decoded = decode_push_request(wire)
    assert isinstance(decoded, RawChunk)
    assert decoded.WhichOneof("kind") == "chunk"
    assert bytes(decoded.chunk) == pb.PushWeightsRequest.FromString(wire).chunk


def test_decode_push_request_leaves_everything_else_to_protobuf() -> None:
    header = pb.PushWeightsRequest(header=pb.WeightsHeader(model_id="policy", version=3))
    assert decode_push_request(header.SerializeToString()) == header
    chunk = pb.PushWeightsRequest(chunk=b"abc").SerializeToString()
    assert length_delimited(chunk + b"\x12\x00", 0x12) is None  # a second field follows
    assert length_delimited(chunk[:-1], 0x12) is None  # truncated payload
    assert length_delimited(b"\x12\xff\xff", 0x12) is None  # truncated varint
    assert length_delimited(b"\x12" + b"\xff" * 11 + b"\x01", 0x12) is None  # overlong varint
    assert length_delimited(b"", 0x12) is None
    assert decode_push_request(chunk + b"\x12\x01z").chunk == b"z"  # protobuf: last one wins
    with pytest.raises(ProtocolError, match="PushWeightsRequest of 3 bytes does not parse"):
        decode_push_request(b"\x12\xff\xff")  # the peer's error: INVALID_ARGUMENT


@pytest.mark.parametrize("crc", [0, 1, 0xFFFFFFFF])
@pytest.mark.parametrize("size", [0, 1, 200, 3 << 20])
def test_relay_chunks_are_framed_as_protobuf_and_read_back_without_a_copy(size, crc) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    framed = encode_relay_chunk(data, crc)
    message = pb.RelayRequest(chunk=pb.RelayChunk(data=data, crc32c=crc))
    assert framed == message.SerializeToString()
    read = decode_relay_request(framed)
    assert (bytes(read.chunk.data), read.chunk.crc32c) == (data, crc)
    if size:  # (protobuf writes no field for empty bytes: that one is parsed by protobuf)
        assert isinstance(read, RawRelayChunk)
        assert read.raw == framed
        assert read.data.obj is framed  # a view of the received bytes


def test_relay_messages_other_than_a_plain_chunk_are_parsed_by_protobuf() -> None:
    opening = pb.RelayRequest(open=pb.RelayOpen(push_id=b"p" * 16, ticket=b"t" * 32))
    assert decode_relay_request(opening.SerializeToString()) == opening
    odd = pb.RelayChunk(data=b"abc", crc32c=7).SerializeToString() + b"\x18\x01"  # a field 3
    message = pb.RelayRequest.FromString(b"\x12" + bytes([len(odd)]) + odd)
    read = decode_relay_request(b"\x12" + bytes([len(odd)]) + odd)
    assert not isinstance(read, RawRelayChunk)
    assert read == message
    with pytest.raises(ProtocolError, match="RelayRequest of 3 bytes does not parse"):
        decode_relay_request(b"\xff\xff\xff")  # the peer's error: INVALID_ARGUMENT


def test_an_encoded_batch_is_cut_into_numbered_chunks_only_the_first_carrying_its_info() -> None:
    td = TensorDict({"observation": torch.arange(600, dtype=torch.float32).reshape(2, 300)}, [2])
    packet = encode_packet(td)
    info = pb.BatchInfo(seq=9, epoch=2, frames=2, total_bytes=packet.nbytes)
    encoded = _encoded([packet], info, None, chunk_bytes=1000)
    chunks = [pb.CollectResponse.FromString(m).chunk for m in encoded.wire(False)]
    assert len(chunks) == -(-packet.nbytes // 1000) > 2
    assert [(c.seq, c.index, c.count) for c in chunks] == [
        (9, i, len(chunks)) for i in range(len(chunks))
    ]
    assert [len(c.data) for c in chunks[:-1]] == [1000] * (len(chunks) - 1)
    assert [c.HasField("info") for c in chunks] == [True] + [False] * (len(chunks) - 1)
    data = b"".join(c.data for c in chunks)
    assert data == b"".join(bytes(part) for part in packet.parts())
    assert chunks[0].info.crc32c == encoded.info.crc32c == crc32c(data)
