"""The tensor-frame codec: round trips, chunking, and a decoder that trusts nothing."""

from __future__ import annotations

import json
import math
import pickle
import struct
import time
import tracemalloc
import zlib
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from tensordict import (
    LazyStackedTensorDict,
    NonTensorData,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_non_tensor,
)

from common.errors import DataLossError, FrameError, FrameTooLargeError, SessionStateError
from common.frames import (
    MAGIC,
    EncodedFrame,
    FrameAssembler,
    FrameLimits,
    decode_frame,
    encode_frame,
    frame_crc32,
)

DTYPES = [
    torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
]  # fmt: skip
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = st.text(alphabet="abxyzé_.", min_size=1, max_size=4)
TEXTS = st.text(max_size=6)


# ------------------------------------------------------------- strategies --


@st.composite
def tensors(draw: st.DrawFn, batch: tuple[int, ...]) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = (*batch, *draw(st.lists(st.integers(0, 3), max_size=2)))
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytearray(draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize)))
    if not numel:
        return torch.empty(shape, dtype=dtype)
    if dtype is torch.bool:
        tensor = (torch.frombuffer(raw, dtype=torch.uint8) & 1).bool()
    else:
        tensor = torch.frombuffer(raw, dtype=dtype)  # every bit pattern, NaN payloads included
    tensor = tensor.reshape(shape)
    if tensor.ndim >= 2 and draw(st.booleans()):  # the same values, not contiguous
        tensor = tensor.transpose(0, 1).contiguous().transpose(0, 1)
    return tensor


@st.composite
def strings(draw: st.DrawFn, batch: tuple[int, ...]) -> TensorDictBase:
    if batch and all(batch) and draw(st.integers(0, 2)):
        flat = draw(st.lists(TEXTS, min_size=math.prod(batch), max_size=math.prod(batch)))
        nested: list[Any] = flat
        for size in reversed(batch[1:]):
            nested = [nested[i : i + size] for i in range(0, len(nested), size)]
        return NonTensorStack.from_list(nested)
    return NonTensorData(data=draw(TEXTS), batch_size=batch)


@st.composite
def tensordicts(
    draw: st.DrawFn, batch: tuple[int, ...] = (), names: list | None = None, depth: int = 0
) -> TensorDict:
    if depth == 0:
        batch = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        pool = draw(st.permutations(["time", "env", "é"]))
        names = [draw(st.sampled_from([None, pool[i]])) for i in range(len(batch))]
    td = TensorDict({}, batch_size=batch, names=names if any(names) else None)
    for key in draw(st.lists(KEYS, max_size=4 if depth < 2 else 2, unique=True)):
        kind = draw(st.sampled_from(["tensor", "tensor", "str", "td"][: 4 if depth < 3 else 3]))
        if kind == "tensor":
            td.set(key, draw(tensors(batch)))
        elif kind == "str":
            td.set(key, draw(strings(batch)))
        else:
            extra = tuple(draw(st.lists(st.integers(0, 2), max_size=1)))
            sub_names = [*td.names, *(draw(st.sampled_from([None, f"d{depth}"])) for _ in extra)]
            td.set(key, draw(tensordicts((*batch, *extra), sub_names, depth + 1)))
    return td


# ---------------------------------------------------------------- helpers --


def assert_same(expected: TensorDictBase, actual: TensorDictBase, parent_names: list = ()) -> None:
    assert type(actual) is TensorDict
    assert actual.batch_size == expected.batch_size
    # a nested td's leading names are its parent's (frames state that form; see below)
    names = [*parent_names, *expected.names[len(parent_names) :]]
    assert actual.names == names
    assert sorted(actual.keys()) == sorted(expected.keys())
    for key in expected.keys():  # noqa: SIM118 (a TensorDict, not a dict)
        want, got = expected.get(key), actual.get(key)
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), key
            assert (got.dtype, got.shape) == (want.dtype, want.shape), key
            assert torch.equal(as_bytes(got), as_bytes(want)), key  # bit-exact, NaNs included
        elif is_non_tensor(want):
            assert type(got) is type(want), key
            assert got.batch_size == want.batch_size, key
            if isinstance(want, NonTensorStack):
                assert got.tolist() == want.tolist(), key
            else:
                assert got.data == want.data, key
        else:
            assert_same(want, got, names)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def raw_frame(header: Any, payload: bytes = b"", *, pad: bool = True) -> bytearray:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-(12 + len(text)) % 16)
    return bytearray(MAGIC + struct.pack("<Q", len(text)) + text + payload)


def header_of(frame: bytes | bytearray) -> dict:
    (length,) = struct.unpack_from("<Q", frame, 4)
    return json.loads(bytes(frame[12 : 12 + length]))


def payload_of(frame: bytes | bytearray) -> bytes:
    (length,) = struct.unpack_from("<Q", frame, 4)
    return bytes(frame[12 + length :])


def one_entry(dtype: str = "float32", shape: list | None = None, **fields: Any) -> dict:
    shape = [2] if shape is None else shape
    entry = {"key": ["x"], "dtype": dtype, "shape": shape, "offset": 0, "nbytes": 8}
    entry.update(fields)
    return {"batch_size": [2], "names": [None], "tds": [], "entries": [entry], "payload_bytes": 8}


def cartpole_batch(envs: int = 8, steps: int = 125) -> TensorDict:
    shape = (envs, steps)
    flags = {name: torch.rand(*shape, 1) < 0.05 for name in ("done", "terminated", "truncated")}
    batch = TensorDict(
        {
            "action": torch.nn.functional.one_hot(torch.randint(2, shape), 2),
            "observation": torch.randn(*shape, 4),
            "policy_version": torch.full(shape, 3),
            **flags,
            "collector": {"traj_ids": torch.arange(envs).repeat_interleave(steps).view(shape)},
            "next": {
                "observation": torch.randn(*shape, 4),
                "reward": torch.ones(*shape, 1),
                "policy_version": torch.full(shape, 3),
                **{name: flag.clone() for name, flag in flags.items()},
            },
        },
        batch_size=shape,
        names=[None, "time"],
    )
    return batch


# ------------------------------------------------------------- round trips --


@FAST
@given(td=tensordicts())
def test_decode_frame_round_trips_random_tensordicts(td: TensorDict) -> None:
    assert_same(td, decode_frame(encode_frame(td).tobytes()))


@FAST
@given(td=tensordicts(), chunk_bytes=st.integers(1, 300), data=st.data())
def test_frame_assembler_round_trips_random_tensordicts_in_chunks(
    td: TensorDict, chunk_bytes: int, data: st.DataObject
) -> None:
    frame = encode_frame(td)
    chunks = list(frame.chunks(chunk_bytes))
    assert all(len(chunk) == chunk_bytes for chunk in chunks[:-1])
    assert 0 < len(chunks[-1]) <= chunk_bytes
    assert b"".join(chunks) == frame.tobytes()
    assert len(frame.tobytes()) == frame.nbytes
    assembler = FrameAssembler(frame.nbytes)
    for chunk in chunks:
        # transports may hand over bytes or views
        assembler.add(memoryview(chunk) if data.draw(st.booleans()) else chunk)
    assert assembler.received == assembler.total_bytes == frame.nbytes
    assert_same(td, assembler.finish(expected_crc32=frame_crc32(frame)))


def test_decode_frame_round_trips_a_cartpole_batch_with_names() -> None:
    batch = cartpole_batch()
    frame = encode_frame(batch)
    assembler = FrameAssembler(frame.nbytes)
    for chunk in frame.chunks(4096):
        assembler.add(chunk)
    out = assembler.finish(expected_crc32=zlib.crc32(frame.tobytes()))
    assert out.batch_size == (8, 125)
    assert out.names == [None, "time"]
    assert out["collector"].batch_size == (8, 125)
    assert out["collector", "traj_ids"].shape == (8, 125)
    assert out["next", "reward"].dtype == torch.float32
    assert out["action"].dtype == torch.int64
    assert_same(batch, out)


# torchrl warns from abc.__new__ on import, so pyproject's "torchrl.*" module filter misses it.
@pytest.mark.filterwarnings("ignore:Creating .* inherits from WeightUpdaterBase:DeprecationWarning")
def test_decode_frame_round_trips_a_torchrl_collector_batch() -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=16, total_frames=16)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    out = decode_frame(encode_frame(batch).tobytes())
    assert out.names == ["time"]
    assert_same(batch, out)


def test_encode_frame_states_nested_names_in_their_consistent_form() -> None:
    inner = TensorDict({}, [2, 3], names=[None, "d"])
    td = TensorDict({"mid": TensorDict({"inner": inner}, [2, 3], names=["env", "d"])}, [2])
    td.names = None  # erases "mid"'s names but, in tensordict, not "inner"'s
    assert td["mid", "inner"].names == ["env", "d"]
    out = decode_frame(encode_frame(td).tobytes())
    assert out["mid"].names == [None, None]
    assert out["mid", "inner"].names == [None, None]


def test_encode_frame_densifies_lazy_stacks_and_keeps_strings() -> None:
    parts = [
        TensorDict({"obs": torch.full((3,), float(i)), "text": NonTensorData(f"turn {i}")}, [])
        for i in range(4)
    ]
    lazy = LazyStackedTensorDict.lazy_stack(parts)
    out = decode_frame(encode_frame(lazy).tobytes())
    assert out.get("text").tolist() == ["turn 0", "turn 1", "turn 2", "turn 3"]
    assert_same(lazy.contiguous(), out)


def test_encode_frame_keeps_sub_tensordict_batch_sizes_and_names() -> None:
    td = TensorDict({"a": torch.zeros(2, 3)}, [2], names=["env"])
    td["sub"] = TensorDict({"b": torch.ones(2, 3, 5)}, [2, 3], names=["env", "time"])
    td["empty"] = TensorDict({}, [2])
    out = decode_frame(encode_frame(td).tobytes())
    assert out["sub"].batch_size == (2, 3)
    assert out["sub"].names == ["env", "time"]
    assert out["empty"].batch_size == (2,)
    assert_same(td, out)


def test_encode_frame_borrows_contiguous_tensors_without_copying() -> None:
    obs = torch.zeros(4, 4)
    frame = encode_frame(TensorDict({"obs": obs, "t": torch.zeros(4, 4).t()}, [4]))
    obs.fill_(1.0)  # a zero-copy view sees the change
    assert decode_frame(frame.tobytes())["obs"].eq(1.0).all()


def test_decode_frame_views_a_bytearray_and_copies_bytes() -> None:
    frame = encode_frame(TensorDict({"x": torch.zeros(4, dtype=torch.int32)}, [4])).tobytes()
    mutable = bytearray(frame)
    shared = decode_frame(mutable)
    mutable[-4:] = struct.pack("<i", 7)
    assert shared["x"][-1].item() == 7
    copied = decode_frame(frame)  # bytes are immutable: one copy, no warning
    assert copied["x"].tolist() == [0, 0, 0, 0]


def test_frame_assembler_decodes_views_of_one_buffer() -> None:
    frame = encode_frame(cartpole_batch(2, 5))
    assembler = FrameAssembler(frame.nbytes)
    for chunk in frame.chunks(100):
        assembler.add(chunk)
    out = assembler.finish()
    pointers = {t.untyped_storage().data_ptr() for t in out.values(True, True)}
    assert len(pointers) == 1


def test_encoded_frame_chunks_stay_under_the_grpc_limit() -> None:
    frame = encode_frame(TensorDict({"pixels": torch.zeros(7 << 20, dtype=torch.uint8)}, []))
    sizes = [len(chunk) for chunk in frame.chunks()]
    assert sizes == [3 << 20, 3 << 20, frame.nbytes - (6 << 20)]
    with pytest.raises(ValueError, match="chunk_bytes"):
        next(frame.chunks(0))


def test_decode_frame_never_unpickles(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pickle reached")

    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    td = cartpole_batch(2, 3)
    td["text"] = NonTensorStack.from_list([["a", "b", "c"], ["d", "e", "f"]])
    assert_same(td, decode_frame(encode_frame(td).tobytes()))


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
def test_encode_frame_raises_if_a_value_is_unsupported(value: Any, match: str) -> None:
    td = TensorDict({"ok": torch.zeros(2)}, [2])
    td.set("bad", value)
    with pytest.raises(TypeError, match=match):
        encode_frame(td)


def test_encode_frame_raises_if_not_given_a_tensordict() -> None:
    with pytest.raises(TypeError, match="TensorDict"):
        encode_frame({"a": torch.zeros(2)})  # type: ignore[arg-type]


def test_encode_frame_raises_if_a_lazy_stack_is_ragged() -> None:
    ragged = LazyStackedTensorDict.lazy_stack(
        [TensorDict({"a": torch.zeros(2)}, []), TensorDict({"a": torch.zeros(3)}, [])]
    )
    with pytest.raises(FrameError, match="densify"):
        encode_frame(ragged)


# ----------------------------------------------------- hostile input: fuzz --


def decodes_or_refuses(buffer: bytes | bytearray) -> None:
    try:
        out = decode_frame(buffer)
    except FrameError:
        return
    assert isinstance(out, TensorDict)
    encode_frame(out)  # whatever decodes is a well-formed batch


@FAST
@given(td=tensordicts(), data=st.data())
def test_decode_frame_raises_only_frame_error_on_mutated_frames(
    td: TensorDict, data: st.DataObject
) -> None:
    frame = bytearray(encode_frame(td).tobytes())
    (length,) = struct.unpack_from("<Q", frame, 4)
    region = data.draw(st.sampled_from([(12, 12 + length), (12 + length, len(frame)), (0, 12)]))
    at = data.draw(st.integers(*region))
    op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "duplicate"]))
    if op == "flip" and at < len(frame):
        frame[at] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del frame[at:]
    elif op == "insert":
        frame[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    elif op == "delete":
        del frame[at : at + data.draw(st.integers(1, 16))]
    else:
        frame[at:at] = frame[at : at + data.draw(st.integers(1, 64))]
    decodes_or_refuses(frame)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@FAST
@given(td=tensordicts(), data=st.data())
def test_decode_frame_raises_only_frame_error_on_mutated_headers(
    td: TensorDict, data: st.DataObject
) -> None:
    frame = encode_frame(td).tobytes()
    header = header_of(frame)
    spots = list(json_spots(header))[::-1]  # deepest first: hypothesis favours early items
    node, slot = data.draw(st.sampled_from(spots))
    if type(node[slot]) is int and data.draw(st.booleans()):
        node[slot] += data.draw(st.sampled_from([-17, -16, -1, 1, 8, 16, 2**63]))
    elif isinstance(node, list) and data.draw(st.booleans()):
        node.insert(slot, data.draw(JSON) if data.draw(st.booleans()) else node[slot])
    else:
        node[slot] = data.draw(JSON)
    decodes_or_refuses(raw_frame(json.dumps(header).encode(), payload_of(frame)))


def json_spots(node: Any) -> Any:
    """Yields (container, index) for every value inside a parsed JSON header."""
    for slot in list(node) if isinstance(node, dict) else range(len(node)):
        yield node, slot
        if isinstance(node[slot], (dict, list)):
            yield from json_spots(node[slot])


# ------------------------------------------ hostile input: named refusals --


def refused_fast(buffer: bytes | bytearray, error: type[FrameError] = FrameError, **limits: int):
    """Decodes hostile input; returns the error after checking time and Python allocations."""
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(error) as caught:
            decode_frame(buffer, FrameLimits(**limits))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - began < 2.0
    assert peak < len(buffer) * 8 + (4 << 20), f"decoder allocated {peak} bytes"
    return caught.value


def test_decode_frame_raises_if_the_header_claims_2_to_63_payload_bytes() -> None:
    header = {**one_entry(), "payload_bytes": 2**63}
    assert "payload_bytes" in str(refused_fast(raw_frame(header, bytes(8)), FrameTooLargeError))


def test_decode_frame_raises_if_the_header_length_is_2_to_63() -> None:
    frame = bytearray(MAGIC + struct.pack("<Q", 2**63) + b"{}" + bytes(14))
    assert "max_header_bytes" in str(refused_fast(frame, FrameTooLargeError))


def test_decode_frame_raises_if_the_header_runs_past_the_frame() -> None:
    frame = bytearray(MAGIC + struct.pack("<Q", 1000) + b"{}")
    assert "runs past" in str(refused_fast(frame))


@pytest.mark.parametrize("shape", [[2**62, 2**62], [2, 2**20, 2**20, 2**20], [2, 2**64]])
def test_decode_frame_raises_if_a_shape_overflows(shape: list[int]) -> None:
    refused_fast(raw_frame(one_entry(shape=shape), bytes(8)), FrameTooLargeError)


def test_decode_frame_raises_if_there_are_too_many_keys() -> None:
    entries = [{"key": [f"k{i}"], "dtype": "uint8", "shape": [0], "offset": 0, "nbytes": 0}
               for i in range(4097)]  # fmt: skip
    header = {"batch_size": [0], "names": [None], "tds": [], "entries": entries, "payload_bytes": 0}
    assert "max_entries" in str(refused_fast(raw_frame(header), FrameTooLargeError))


def test_decode_frame_raises_if_a_key_is_too_deep() -> None:
    error = refused_fast(raw_frame(one_entry(key=["k"] * 17), bytes(8)), FrameTooLargeError)
    assert "max_depth" in str(error)


def test_decode_frame_raises_if_a_key_is_too_long() -> None:
    error = refused_fast(raw_frame(one_entry(key=["k" * 257]), bytes(8)), FrameTooLargeError)
    assert "max_key_length" in str(error)


@pytest.mark.parametrize("dtype", ["complex64", "object", "float8_e4m3fn", "uint16", "", 4])
def test_decode_frame_raises_if_the_dtype_is_unknown(dtype: Any) -> None:
    assert "dtype" in str(refused_fast(raw_frame(one_entry(dtype), bytes(8))))


@pytest.mark.parametrize(
    "entry",
    [{"offset": False}, {"nbytes": True}, {"shape": [True]}, {"shape": [2.0]}, {"offset": 0.0},
     {"shape": [-2]}, {"nbytes": -8}, {"key": "x"}, {"key": []}, {"key": [""]}, {"shape": 2}],
)  # fmt: skip
def test_decode_frame_raises_if_a_field_has_the_wrong_type_or_sign(entry: dict) -> None:
    refused_fast(raw_frame(one_entry(**entry), bytes(8)))


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b'{"batch_size":[2],"batch_size":[2]}', "duplicate"),
        (b'{"batch_size":NaN}', "NaN"),
        (b"[1, 2]", "JSON object"),
        (b'{"batch_size": [2]}', "exactly the fields"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
        (('{"payload_bytes": ' + "9" * 5000 + "}").encode(), "JSON"),
    ],
)
def test_decode_frame_raises_if_the_header_is_not_a_clean_json_object(
    header: bytes, match: str
) -> None:
    assert match in str(refused_fast(raw_frame(header)))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"names": [None, None]}, "one item per batch dim"),
        ({"batch_size": [3]}, "does not start with the batch size"),
        ({"payload_bytes": 16}, "entries end at"),
        ({"extra": 1}, "exactly the fields"),
    ],
)
def test_decode_frame_raises_if_the_header_is_inconsistent(change: dict, match: str) -> None:
    header = one_entry()
    header.update(change)
    assert match in str(refused_fast(raw_frame(header, bytes(header["payload_bytes"]))))


def test_decode_frame_raises_if_entries_overlap_or_are_unaligned() -> None:
    a = {"key": ["a"], "dtype": "uint8", "shape": [2], "offset": 0, "nbytes": 2}
    for offset in (0, 2, 8, 32):
        b = {**a, "key": ["b"], "offset": offset}
        header = {"batch_size": [2], "names": [None], "tds": [], "entries": [a, b],
                  "payload_bytes": offset + 2}  # fmt: skip
        assert "offset" in str(refused_fast(raw_frame(header, bytes(offset + 2))))


def test_decode_frame_raises_if_the_payload_length_differs() -> None:
    frame = encode_frame(TensorDict({"a": torch.zeros(2)}, [2])).tobytes()
    for buffer in (frame + b"\0", frame[:-1]):
        assert "payload has" in str(refused_fast(buffer))


def test_decode_frame_raises_if_padding_is_not_zero() -> None:
    td = TensorDict(
        {"a": torch.zeros(3, dtype=torch.uint8), "b": torch.zeros(3, dtype=torch.uint8)}
    )
    frame = bytearray(encode_frame(td).tobytes())
    frame[-14] = 1
    assert "padding" in str(refused_fast(frame))


def test_decode_frame_raises_if_a_bool_is_not_0_or_1() -> None:
    frame = bytearray(
        encode_frame(TensorDict({"done": torch.zeros(4, dtype=torch.bool)}, [4])).tobytes()
    )
    frame[-1] = 2
    assert "bool" in str(refused_fast(frame))


def test_decode_frame_raises_if_keys_collide_or_have_no_parent() -> None:
    entry = {"key": ["a"], "dtype": "uint8", "shape": [0], "offset": 0, "nbytes": 0}
    cases = [
        ([], [entry, entry], "appears twice"),
        ([], [{**entry, "key": ["a", "b"]}], "not a declared td"),
        ([{"key": ["a"], "batch_size": [0], "names": [None]}], [entry], "appears twice"),
        ([{"key": ["a"], "batch_size": [1], "names": [None]}], [], "do not extend"),
        ([{"key": ["a"], "batch_size": [0], "names": ["x"]}], [], "do not extend"),
    ]
    for tds, entries, match in cases:
        header = {"batch_size": [0], "names": [None], "tds": tds, "entries": entries,
                  "payload_bytes": 0}  # fmt: skip
        assert match in str(refused_fast(raw_frame(header)))


def string_frame(ends: list[int], text: bytes) -> bytearray:
    region = np.array(ends, dtype="<u8").tobytes() + text
    entry = {"key": ["s"], "dtype": "str", "shape": [len(ends)], "offset": 0, "nbytes": len(region)}
    header = {"batch_size": [len(ends)], "names": [None], "tds": [], "entries": [entry],
              "payload_bytes": len(region)}  # fmt: skip
    return raw_frame(header, region)


def test_decode_frame_reads_a_well_formed_string_region() -> None:
    assert decode_frame(string_frame([1, 4], b"ab\xc3\xa9")).get("s").tolist() == ["a", "bé"]


@pytest.mark.parametrize(
    ("ends", "text", "match"),
    [([2, 1], b"abc", "monotonic"), ([1, 2], b"abc", "monotonic"), ([1, 4], b"abc", "monotonic"),
     ([1, 2], b"a\xc3", "UTF-8"), ([1, 3], b"a\xc3\xa9"[:2] + b"x", "UTF-8")],
)  # fmt: skip
def test_decode_frame_raises_if_a_string_region_is_malformed(ends, text, match) -> None:
    assert match in str(refused_fast(string_frame(ends, text)))


def test_decode_frame_raises_if_there_are_too_many_strings() -> None:
    count = (1 << 20) + 1
    entry = {"key": ["s"], "dtype": "str", "shape": [count], "offset": 0, "nbytes": 8 * count}
    header = {"batch_size": [count], "names": [None], "tds": [], "entries": [entry],
              "payload_bytes": 8 * count}  # fmt: skip
    assert "max_strings" in str(refused_fast(raw_frame(header), FrameTooLargeError))
    small = string_frame([1, 2, 3], b"abc")
    assert "max_strings" in str(refused_fast(small, FrameTooLargeError, max_strings=2))


@pytest.mark.parametrize(
    ("buffer", "match"),
    [(b"RLF", "at least 12"), (b"RLF2" + bytes(12), "bad magic"),
     (bytes(raw_frame(b"{}", pad=False)), "multiple of 16")],
)  # fmt: skip
def test_decode_frame_raises_if_the_preamble_is_wrong(buffer: bytes, match: str) -> None:
    assert match in str(refused_fast(buffer))


def test_decode_frame_raises_if_the_frame_is_over_the_cap() -> None:
    frame = encode_frame(TensorDict({"a": torch.zeros(64)}, [64])).tobytes()
    refused_fast(frame, FrameTooLargeError, max_frame_bytes=len(frame) - 1)
    assert decode_frame(frame, FrameLimits(max_frame_bytes=len(frame)))["a"].shape == (64,)


def test_decode_frame_raises_if_not_given_bytes() -> None:
    with pytest.raises(TypeError, match="bytes-like"):
        decode_frame("RLF1")  # type: ignore[arg-type]


# ------------------------------------------------------------- assembler --


def test_frame_assembler_raises_before_allocating_if_the_frame_is_over_the_cap() -> None:
    # torch would raise RuntimeError (not FrameTooLargeError) had it tried to allocate 2^62 bytes
    with pytest.raises(FrameTooLargeError, match="max_frame_bytes"):
        FrameAssembler(2**62)
    with pytest.raises(FrameTooLargeError):
        FrameAssembler(1001, FrameLimits(max_frame_bytes=1000))
    for bad in (11, -1, True, 12.0):
        with pytest.raises(FrameError):
            FrameAssembler(bad)  # type: ignore[arg-type]


def test_frame_assembler_raises_if_chunks_overflow_or_fall_short() -> None:
    frame = encode_frame(cartpole_batch(2, 3))
    data = frame.tobytes()
    assembler = FrameAssembler(frame.nbytes)
    assembler.add(data)
    with pytest.raises(FrameError, match="overflow"):
        assembler.add(b"x")
    short = FrameAssembler(frame.nbytes)
    short.add(data[:-1])
    with pytest.raises(FrameError, match="incomplete"):
        short.finish()
    with pytest.raises(SessionStateError):
        short.add(b"x")


def test_frame_assembler_raises_data_loss_if_the_checksum_differs() -> None:
    frame = encode_frame(cartpole_batch(2, 3))
    assembler = FrameAssembler(frame.nbytes)
    assembler.add(frame.tobytes())
    with pytest.raises(DataLossError, match="checksum"):
        assembler.finish(expected_crc32=frame_crc32(frame) ^ 1)
    with pytest.raises(SessionStateError):
        assembler.finish()


def test_frame_crc32_matches_zlib_over_the_bytes() -> None:
    frame = encode_frame(cartpole_batch(2, 3))
    assert isinstance(frame, EncodedFrame)
    assert frame_crc32(frame) == zlib.crc32(frame.tobytes()) == frame_crc32(frame.tobytes())


def test_frame_limits_raise_if_a_cap_is_not_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        FrameLimits(max_entries=0)
