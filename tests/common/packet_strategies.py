"""Hypothesis strategies and helpers shared by the packet tests."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import HealthCheck, settings
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase, is_non_tensor

from common.packets import MAGIC

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
    # a nested td's leading names are its parent's (packets state that form; see below)
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


def raw_packet(header: Any, payload: bytes = b"", *, pad: bool = True) -> bytearray:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-(12 + len(text)) % 16)
    return bytearray(MAGIC + struct.pack("<Q", len(text)) + text + payload)


def header_of(packet: bytes | bytearray) -> dict:
    (length,) = struct.unpack_from("<Q", packet, 4)
    return json.loads(bytes(packet[12 : 12 + length]))


def payload_of(packet: bytes | bytearray) -> bytes:
    (length,) = struct.unpack_from("<Q", packet, 4)
    return bytes(packet[12 + length :])


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
