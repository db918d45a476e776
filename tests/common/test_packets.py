"""The packet codec: round trips, zero-copy behaviour, chunking and reassembly."""

from __future__ import annotations

import pickle
import struct
import zlib
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given
from packet_strategies import FAST, assert_same, cartpole_batch, tensordicts
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict

from common.errors import DataLossError, PacketTooLargeError, ProtocolError, SessionStateError
from common.packets import (
    EncodedPacket,
    PacketAssembler,
    PacketLimits,
    checksummed_pieces,
    decode_packet,
    encode_packet,
    packet_crc32c,
)

# ------------------------------------------------------------- round trips --


@FAST
@given(td=tensordicts())
def test_decode_packet_round_trips_random_tensordicts(td: TensorDict) -> None:
    assert_same(td, decode_packet(encode_packet(td).tobytes()))


@FAST
@given(td=tensordicts(), chunk_bytes=st.integers(1, 300), data=st.data())
def test_packet_assembler_round_trips_random_tensordicts_in_chunks(
    td: TensorDict, chunk_bytes: int, data: st.DataObject
) -> None:
    packet = encode_packet(td)
    chunks = list(packet.chunks(chunk_bytes))
    assert all(len(chunk) == chunk_bytes for chunk in chunks[:-1])
    assert 0 < len(chunks[-1]) <= chunk_bytes
    assert b"".join(chunks) == packet.tobytes()
    assert len(packet.tobytes()) == packet.nbytes
    assembler = PacketAssembler(packet.nbytes)
    for chunk in chunks:
        # transports may hand over bytes or views
        assembler.add(memoryview(chunk) if data.draw(st.booleans()) else chunk)
    assert assembler.received == assembler.total_bytes == packet.nbytes
    assert_same(td, assembler.finish(expected_crc32c=packet_crc32c(packet)))


def test_decode_packet_round_trips_a_cartpole_batch_with_names() -> None:
    batch = cartpole_batch()
    packet = encode_packet(batch)
    assembler = PacketAssembler(packet.nbytes)
    for chunk in packet.chunks(4096):
        assembler.add(chunk)
    out = assembler.finish(expected_crc32c=crc32c_reference(packet.tobytes()))
    assert out.batch_size == (8, 125)
    assert out.names == [None, "time"]
    assert out["collector"].batch_size == (8, 125)
    assert out["collector", "traj_ids"].shape == (8, 125)
    assert out["next", "reward"].dtype == torch.float32
    assert out["action"].dtype == torch.int64
    assert_same(batch, out)


# torchrl warns from abc.__new__ on import, so pyproject's "torchrl.*" module filter misses it.
@pytest.mark.filterwarnings("ignore:Creating .* inherits from WeightUpdaterBase:DeprecationWarning")
def test_decode_packet_round_trips_a_torchrl_collector_batch() -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=16, total_frames=16)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    out = decode_packet(encode_packet(batch).tobytes())
    assert out.names == ["time"]
    assert_same(batch, out)


def test_encode_packet_states_nested_names_in_their_consistent_form() -> None:
    inner = TensorDict({}, [2, 3], names=[None, "d"])
    td = TensorDict({"mid": TensorDict({"inner": inner}, [2, 3], names=["env", "d"])}, [2])
    td.names = None  # erases "mid"'s names but, in tensordict, not "inner"'s
    assert td["mid", "inner"].names == ["env", "d"]
    out = decode_packet(encode_packet(td).tobytes())
    assert out["mid"].names == [None, None]
    assert out["mid", "inner"].names == [None, None]


def test_encode_packet_densifies_lazy_stacks_and_keeps_strings() -> None:
    parts = [
        TensorDict({"obs": torch.full((3,), float(i)), "text": NonTensorData(f"turn {i}")}, [])
        for i in range(4)
    ]
    lazy = LazyStackedTensorDict.lazy_stack(parts)
    out = decode_packet(encode_packet(lazy).tobytes())
    assert out.get("text").tolist() == ["turn 0", "turn 1", "turn 2", "turn 3"]
    assert_same(lazy.contiguous(), out)


def test_encode_packet_keeps_sub_tensordict_batch_sizes_and_names() -> None:
    td = TensorDict({"a": torch.zeros(2, 3)}, [2], names=["env"])
    td["sub"] = TensorDict({"b": torch.ones(2, 3, 5)}, [2, 3], names=["env", "time"])
    td["empty"] = TensorDict({}, [2])
    out = decode_packet(encode_packet(td).tobytes())
    assert out["sub"].batch_size == (2, 3)
    assert out["sub"].names == ["env", "time"]
    assert out["empty"].batch_size == (2,)
    assert_same(td, out)


def test_encode_packet_borrows_contiguous_tensors_without_copying() -> None:
    obs = torch.zeros(4, 4)
    packet = encode_packet(TensorDict({"obs": obs, "t": torch.zeros(4, 4).t()}, [4]))
    obs.fill_(1.0)  # a zero-copy view sees the change
    assert decode_packet(packet.tobytes())["obs"].eq(1.0).all()


def test_encode_packet_takes_empty_entries_of_any_stride() -> None:
    """An env's Box(0, 1, (0,)) observation, expanded by a transform, has stride 0: its
    byte view raised ("stride(-1) must be 1"), and a TorchRL actor died at start."""
    expanded = torch.zeros((), dtype=torch.float32).expand(0)
    assert expanded.stride() == (0,)
    decoded = decode_packet(encode_packet(TensorDict({"obs": expanded}, [])).tobytes())
    assert decoded["obs"].shape == (0,)
    assert decoded["obs"].dtype == torch.float32


def test_decode_packet_views_a_bytearray_and_copies_bytes() -> None:
    packet = encode_packet(TensorDict({"x": torch.zeros(4, dtype=torch.int32)}, [4])).tobytes()
    mutable = bytearray(packet)
    shared = decode_packet(mutable)
    mutable[-4:] = struct.pack("<i", 7)
    assert shared["x"][-1].item() == 7
    copied = decode_packet(packet)  # bytes are immutable: one copy, no warning
    assert copied["x"].tolist() == [0, 0, 0, 0]


def test_packet_assembler_decodes_views_of_one_buffer() -> None:
    packet = encode_packet(cartpole_batch(2, 5))
    assembler = PacketAssembler(packet.nbytes)
    for chunk in packet.chunks(100):
        assembler.add(chunk)
    out = assembler.finish()
    pointers = {t.untyped_storage().data_ptr() for t in out.values(True, True)}
    assert len(pointers) == 1


def test_encoded_packet_chunks_stay_under_the_grpc_limit() -> None:
    packet = encode_packet(TensorDict({"pixels": torch.zeros(7 << 20, dtype=torch.uint8)}, []))
    sizes = [len(chunk) for chunk in packet.chunks()]
    assert sizes == [3 << 20, 3 << 20, packet.nbytes - (6 << 20)]
    with pytest.raises(ValueError, match="chunk_bytes"):
        next(packet.chunks(0))


def test_decode_packet_never_unpickles(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pickle reached")

    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    td = cartpole_batch(2, 3)
    td["text"] = NonTensorStack.from_list([["a", "b", "c"], ["d", "e", "f"]])
    assert_same(td, decode_packet(encode_packet(td).tobytes()))


# ------------------------------------------------------------ encode errors --


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (torch.zeros(2, dtype=torch.complex64), r"\['bad'\].*complex64"),
        (torch.zeros(2, dtype=torch.uint16), r"\['bad'\].*uint16"),
        (torch.zeros(2, 2).to_sparse(), r"\['bad'\].*layout"),
        (NonTensorData(data=5, batch_size=[2]), r"\['bad'\].*must be str"),
        (NonTensorStack.from_list([1, 2]), r"\['bad'\].*must be str"),
    ],
)
def test_encode_packet_raises_if_a_value_is_unsupported(value: Any, match: str) -> None:
    td = TensorDict({"ok": torch.zeros(2)}, [2])
    td.set("bad", value)
    with pytest.raises(TypeError, match=match):
        encode_packet(td)


def test_encode_packet_raises_if_not_given_a_tensordict() -> None:
    with pytest.raises(TypeError, match="TensorDict"):
        encode_packet({"a": torch.zeros(2)})  # type: ignore[arg-type]


def test_encode_packet_raises_if_a_lazy_stack_is_ragged() -> None:
    ragged = LazyStackedTensorDict.lazy_stack(
        [TensorDict({"a": torch.zeros(2)}, []), TensorDict({"a": torch.zeros(3)}, [])]
    )
    with pytest.raises(ProtocolError, match="densify"):
        encode_packet(ragged)


# ------------------------------------------------------------- assembler --


def test_packet_assembler_raises_before_allocating_if_the_packet_is_over_the_cap() -> None:
    # torch would raise RuntimeError (not PacketTooLargeError) had it tried to allocate 2^62 bytes
    with pytest.raises(PacketTooLargeError, match="max_packet_bytes"):
        PacketAssembler(2**62)
    with pytest.raises(PacketTooLargeError):
        PacketAssembler(1001, PacketLimits(max_packet_bytes=1000))
    for bad in (11, -1, True, 12.0):
        with pytest.raises(ProtocolError):
            PacketAssembler(bad)  # type: ignore[arg-type]


def test_packet_assembler_raises_if_chunks_overflow_or_fall_short() -> None:
    packet = encode_packet(cartpole_batch(2, 3))
    data = packet.tobytes()
    assembler = PacketAssembler(packet.nbytes)
    assembler.add(data)
    with pytest.raises(ProtocolError, match="overflow"):
        assembler.add(b"x")
    short = PacketAssembler(packet.nbytes)
    short.add(data[:-1])
    with pytest.raises(ProtocolError, match="incomplete"):
        short.finish()
    with pytest.raises(SessionStateError):
        short.add(b"x")


def test_packet_assembler_raises_data_loss_if_the_checksum_differs() -> None:
    packet = encode_packet(cartpole_batch(2, 3))
    assembler = PacketAssembler(packet.nbytes)
    assembler.add(packet.tobytes())
    with pytest.raises(DataLossError, match="checksum"):
        assembler.finish(expected_crc32c=packet_crc32c(packet) ^ 1)
    with pytest.raises(SessionStateError):
        assembler.finish()


@FAST
@given(td=tensordicts(), chunk_bytes=st.integers(1, 300))
def test_checksummed_pieces_equal_chunks_and_packet_crc32c(
    td: TensorDict, chunk_bytes: int
) -> None:
    packet = encode_packet(td)
    pieces, crc = checksummed_pieces([packet], chunk_bytes)
    assert [b"".join(piece) for piece in pieces] == list(packet.chunks(chunk_bytes))
    assert crc == packet_crc32c(packet)


def test_packet_assembler_raises_data_loss_if_one_chunk_is_corrupted() -> None:
    packet = encode_packet(cartpole_batch(4, 8))
    chunks = list(packet.chunks(64))
    middle = len(chunks) // 2
    chunks[middle] = bytes([chunks[middle][0] ^ 0x01]) + chunks[middle][1:]
    assembler = PacketAssembler(packet.nbytes)
    for chunk in chunks:
        assembler.add(chunk)
    with pytest.raises(DataLossError, match="checksum"):
        assembler.finish(expected_crc32c=packet_crc32c(packet))


def test_packet_assembler_receives_into_the_allocated_buffer() -> None:
    batch = cartpole_batch(2, 3)
    packet = encode_packet(batch)
    slab = torch.zeros(packet.nbytes + 32, dtype=torch.uint8)
    assembler = PacketAssembler(packet.nbytes, allocate=lambda n: slab[16 : 16 + n])
    for chunk in packet.chunks(50):
        assembler.add(chunk)
    out = assembler.finish(expected_crc32c=packet_crc32c(packet))
    assert_same(batch, out)
    assert bytes(slab[16 : 16 + packet.nbytes].numpy()) == packet.tobytes()
    assert out["observation"].untyped_storage().data_ptr() == slab.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "make",
    [
        lambda n: torch.empty(n + 1, dtype=torch.uint8),
        lambda n: torch.empty(n, dtype=torch.int8),
        lambda n: torch.empty(n + 1, dtype=torch.uint8)[1:],
        lambda n: bytearray(n),
    ],
)
def test_packet_assembler_raises_if_allocate_returns_an_unusable_buffer(make: Any) -> None:
    packet = encode_packet(cartpole_batch(2, 3))
    with pytest.raises(ProtocolError, match="allocate"):
        PacketAssembler(packet.nbytes, allocate=make)


def crc32c_reference(data: bytes) -> int:
    """CRC-32C bit by bit (reflected polynomial 0x82F63B78), independent of any library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_packet_crc32c_is_castagnolis_crc_over_the_bytes() -> None:
    assert packet_crc32c(b"123456789") == crc32c_reference(b"123456789") == 0xE3069283
    packet = encode_packet(cartpole_batch(2, 3))
    assert isinstance(packet, EncodedPacket)
    expected = crc32c_reference(packet.tobytes())
    assert packet_crc32c(packet) == expected == packet_crc32c(packet.tobytes())
    assert packet_crc32c(bytearray(packet.tobytes())) == expected
    assert packet_crc32c(packet) != zlib.crc32(packet.tobytes())


def test_packet_limits_raise_if_a_cap_is_not_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        PacketLimits(max_entries=0)
