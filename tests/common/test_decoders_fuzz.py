"""Fuzzing every decoder a peer reaches besides the packet decoder (fuzzed in test_packets_hostile).

Weight blobs and headers, actor-state blobs, chunk reassembly and collect settings are fed
mutated and random input; each must raise only its documented error, within a bounded
amount of memory, and never anything else.
"""

from __future__ import annotations

import contextlib
import json
import struct
import tracemalloc

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given
from packet_strategies import FAST
from tensordict import TensorDict

from actor_service._core._state import decode_state, state_to_blob
from actor_service._serve._convert import InvalidSettingsError, settings_from_proto
from common.errors import DataLossError, ProtocolError, WeightsError
from common.packets import PacketAssembler, encode_packet
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import BlobAssembler, decode_weights, encode_weights, sha256_hex

_STATE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
_BLOB = encode_weights(_STATE)
_EXPECTED = {k: (tuple(v.shape), v.dtype) for k, v in _STATE.items()}
_ACTOR_STATE = state_to_blob(
    {"models": {"policy": {"version": 3, "weights": dict(_STATE)}}, "frames": 10, "batches": 1}
)


def _mutate(blob: bytes, data: st.DataObject) -> bytes:
    out = bytearray(blob)
    header_end = 8 + struct.unpack_from("<Q", blob)[0]
    at = data.draw(st.integers(0, len(out)))
    if data.draw(st.booleans()):  # most mutations land in the header, where parsing happens
        at = data.draw(st.integers(0, header_end))
    op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "length"]))
    if op == "flip" and at < len(out):
        out[at] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del out[at:]
    elif op == "insert":
        out[at:at] = data.draw(st.binary(min_size=1, max_size=32))
    elif op == "delete":
        del out[at : at + data.draw(st.integers(1, 32))]
    else:
        out[:8] = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1)))
    return bytes(out)


def _within_memory(fn, limit: int) -> None:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < limit, f"decoding peaked at {peak} bytes"


@FAST
@given(data=st.data(), expected=st.booleans())
def test_decode_weights_raises_only_weights_error_on_mutated_blobs(
    data: st.DataObject, expected: bool
) -> None:
    blob = _mutate(_BLOB, data)

    def decode() -> None:
        try:
            state, _ = decode_weights(blob, expected=_EXPECTED if expected else None)
        except WeightsError:
            return
        assert all(isinstance(v, torch.Tensor) for v in state.values())

    _within_memory(decode, 64 * len(blob) + (1 << 20))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
)


@FAST
@given(header=_JSON, data=st.binary(max_size=64))
def test_decode_weights_raises_only_weights_error_on_arbitrary_json_headers(
    header: object, data: bytes
) -> None:
    text = json.dumps(header).encode()
    blob = struct.pack("<Q", len(text)) + text + data
    with pytest.raises(WeightsError):  # no such header describes the expected tensors
        decode_weights(blob, expected=_EXPECTED)


@FAST
@given(data=st.data())
def test_decode_state_raises_only_weights_error_on_mutated_state_blobs(data: st.DataObject) -> None:
    blob = _mutate(_ACTOR_STATE, data)

    def decode() -> None:
        try:
            state = decode_state(blob, max_keys=16)
        except WeightsError:
            return
        assert isinstance(state, dict)

    _within_memory(decode, 64 * len(blob) + (1 << 20))


@FAST
@given(sizes=st.lists(st.integers(0, 200), max_size=8), total=st.integers(-5, 2**64 - 1))
def test_blob_assembler_raises_only_documented_errors(sizes: list[int], total: int) -> None:
    def assemble() -> None:
        assembler = BlobAssembler(total, max_bytes=1 << 16, sha256=sha256_hex(_BLOB))
        offset = 0
        for size in sizes:
            assembler.add(_BLOB[offset : offset + size])
            offset += size
        assembler.finish()

    with contextlib.suppress(WeightsError, DataLossError, ValueError):
        _within_memory(assemble, (1 << 16) + (1 << 20))


@FAST
@given(sizes=st.lists(st.integers(0, 400), max_size=10), total=st.integers(-5, 2**64 - 1))
def test_packet_assembler_raises_only_protocol_errors(sizes: list[int], total: int) -> None:
    packet = encode_packet(TensorDict({"x": torch.arange(64)}, batch_size=[64])).tobytes()

    def assemble() -> None:
        assembler = PacketAssembler(total)
        offset = 0
        for size in sizes:
            assembler.add(packet[offset : offset + size])
            offset += size
        assembler.finish()

    with contextlib.suppress(ProtocolError, DataLossError, ValueError):
        _within_memory(assemble, 1 << 20)


_INT64 = st.integers(-(2**63), 2**63 - 1)


@FAST
@given(
    frames_per_batch=st.integers(0, 2**64 - 1),
    max_frames_per_traj=_INT64,
    init_random_frames=_INT64,
    total_frames=_INT64,
    exploration_type=st.integers(0, 2**31 - 1),
    model_id=st.text(max_size=300),
    flags=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_settings_from_proto_raises_only_invalid_settings_error(
    frames_per_batch: int,
    max_frames_per_traj: int,
    init_random_frames: int,
    total_frames: int,
    exploration_type: int,
    model_id: str,
    flags: list[bool],
) -> None:
    message = pb.CollectSettings(
        frames_per_batch=frames_per_batch,
        max_frames_per_traj=max_frames_per_traj,
        init_random_frames=init_random_frames,
        total_frames=total_frames,
        exploration_type=exploration_type,
        model_id=model_id,
        reset_at_each_iter=flags[0],
        reset_when_done=flags[1],
        split_trajs=flags[2],
        set_truncated=flags[3],
    )
    try:
        settings = settings_from_proto(message)
    except InvalidSettingsError:
        return
    assert settings.frames_per_batch == frames_per_batch > 0
