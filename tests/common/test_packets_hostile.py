"""The packet decoder facing hostile input: fuzzed packets and named refusals.

Every malformed packet must raise ProtocolError (PacketTooLargeError for caps), quickly
and without allocating what the packet claims; nothing else may escape.
"""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given
from packet_strategies import FAST, header_of, one_entry, payload_of, raw_packet, tensordicts
from tensordict import TensorDict

from common.errors import PacketTooLargeError, ProtocolError
from common.packets import (
    MAGIC,
    PacketLimits,
    decode_packet,
    encode_packet,
)

# ----------------------------------------------------- hostile input: fuzz --


def decodes_or_refuses(buffer: bytes | bytearray) -> None:
    try:
        out = decode_packet(buffer)
    except ProtocolError:
        return
    assert isinstance(out, TensorDict)
    encode_packet(out)  # whatever decodes is a well-formed batch


@FAST
@given(td=tensordicts(), data=st.data())
def test_decode_packet_raises_only_packet_error_on_mutated_packets(
    td: TensorDict, data: st.DataObject
) -> None:
    packet = bytearray(encode_packet(td).tobytes())
    (length,) = struct.unpack_from("<Q", packet, 4)
    region = data.draw(st.sampled_from([(12, 12 + length), (12 + length, len(packet)), (0, 12)]))
    at = data.draw(st.integers(*region))
    op = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "duplicate"]))
    if op == "flip" and at < len(packet):
        packet[at] ^= data.draw(st.integers(1, 255))
    elif op == "truncate":
        del packet[at:]
    elif op == "insert":
        packet[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    elif op == "delete":
        del packet[at : at + data.draw(st.integers(1, 16))]
    else:
        packet[at:at] = packet[at : at + data.draw(st.integers(1, 64))]
    decodes_or_refuses(packet)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@FAST
@given(td=tensordicts(), data=st.data())
def test_decode_packet_raises_only_packet_error_on_mutated_headers(
    td: TensorDict, data: st.DataObject
) -> None:
    packet = encode_packet(td).tobytes()
    header = header_of(packet)
    spots = list(json_spots(header))[::-1]  # deepest first: hypothesis favours early items
    node, slot = data.draw(st.sampled_from(spots))
    if type(node[slot]) is int and data.draw(st.booleans()):
        node[slot] += data.draw(st.sampled_from([-17, -16, -1, 1, 8, 16, 2**63]))
    elif isinstance(node, list) and data.draw(st.booleans()):
        node.insert(slot, data.draw(JSON) if data.draw(st.booleans()) else node[slot])
    else:
        node[slot] = data.draw(JSON)
    decodes_or_refuses(raw_packet(json.dumps(header).encode(), payload_of(packet)))


def json_spots(node: Any) -> Any:
    """Yields (container, index) for every value inside a parsed JSON header."""
    for slot in list(node) if isinstance(node, dict) else range(len(node)):
        yield node, slot
        if isinstance(node[slot], (dict, list)):
            yield from json_spots(node[slot])


# ------------------------------------------ hostile input: named refusals --


def refused_fast(
    buffer: bytes | bytearray, error: type[ProtocolError] = ProtocolError, **limits: int
):
    """Decodes hostile input; returns the error after checking time and Python allocations."""
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(error) as caught:
            decode_packet(buffer, PacketLimits(**limits))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - began < 2.0
    assert peak < len(buffer) * 8 + (4 << 20), f"decoder allocated {peak} bytes"
    return caught.value


def test_decode_packet_raises_if_the_header_claims_2_to_63_payload_bytes() -> None:
    header = {**one_entry(), "payload_bytes": 2**63}
    assert "payload_bytes" in str(refused_fast(raw_packet(header, bytes(8)), PacketTooLargeError))


def test_decode_packet_raises_if_the_header_length_is_2_to_63() -> None:
    packet = bytearray(MAGIC + struct.pack("<Q", 2**63) + b"{}" + bytes(14))
    assert "max_header_bytes" in str(refused_fast(packet, PacketTooLargeError))


def test_decode_packet_raises_if_the_header_runs_past_the_packet() -> None:
    packet = bytearray(MAGIC + struct.pack("<Q", 1000) + b"{}")
    assert "runs past" in str(refused_fast(packet))


@pytest.mark.parametrize("shape", [[2**62, 2**62], [2, 2**20, 2**20, 2**20], [2, 2**64]])
def test_decode_packet_raises_if_a_shape_overflows(shape: list[int]) -> None:
    refused_fast(raw_packet(one_entry(shape=shape), bytes(8)), PacketTooLargeError)


def test_decode_packet_raises_if_there_are_too_many_keys() -> None:
    entries = [{"key": [f"k{i}"], "dtype": "uint8", "shape": [0], "offset": 0, "nbytes": 0}
               for i in range(4097)]  # fmt: skip
    header = {"batch_size": [0], "names": [None], "tds": [], "entries": entries, "payload_bytes": 0}
    assert "max_entries" in str(refused_fast(raw_packet(header), PacketTooLargeError))


def test_decode_packet_raises_if_groups_and_entries_together_are_too_many_keys() -> None:
    """Each list under the cap, both together over it (4,097 keys): refused before either."""
    tds = [{"key": [f"t{i}"], "batch_size": [0], "names": [None]} for i in range(2048)]
    entries = [{"key": [f"k{i}"], "dtype": "uint8", "shape": [0], "offset": 0, "nbytes": 0}
               for i in range(2049)]  # fmt: skip
    header = {"batch_size": [0], "names": [None], "tds": tds, "entries": entries,
              "payload_bytes": 0}  # fmt: skip
    error = refused_fast(raw_packet(header), PacketTooLargeError)
    assert "2048 tds + 2049 entries exceed max_entries=4096" in str(error)


def test_decode_packet_raises_if_a_key_is_too_deep() -> None:
    error = refused_fast(raw_packet(one_entry(key=["k"] * 17), bytes(8)), PacketTooLargeError)
    assert "max_depth" in str(error)


def test_decode_packet_raises_if_a_key_is_too_long() -> None:
    error = refused_fast(raw_packet(one_entry(key=["k" * 257]), bytes(8)), PacketTooLargeError)
    assert "max_key_length" in str(error)


@pytest.mark.parametrize("dtype", ["complex64", "object", "float8_e4m3fn", "uint16", "", 4])
def test_decode_packet_raises_if_the_dtype_is_unknown(dtype: Any) -> None:
    assert "dtype" in str(refused_fast(raw_packet(one_entry(dtype), bytes(8))))


@pytest.mark.parametrize(
    "entry",
    [{"offset": False}, {"nbytes": True}, {"shape": [True]}, {"shape": [2.0]}, {"offset": 0.0},
     {"shape": [-2]}, {"nbytes": -8}, {"key": "x"}, {"key": []}, {"key": [""]}, {"shape": 2}],
)  # fmt: skip
def test_decode_packet_raises_if_a_field_has_the_wrong_type_or_sign(entry: dict) -> None:
    error = refused_fast(raw_packet(one_entry(**entry), bytes(8)))
    if entry in ({"shape": [-2]}, {"nbytes": -8}):  # the sign check, not a later one
        assert "must be non-negative" in str(error)


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
def test_decode_packet_raises_if_the_header_is_not_a_clean_json_object(
    header: bytes, match: str
) -> None:
    assert match in str(refused_fast(raw_packet(header)))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"names": [None, None]}, "one item per batch dim"),
        ({"batch_size": [3]}, "does not start with the batch size"),
        ({"payload_bytes": 16}, "entries end at"),
        ({"extra": 1}, "exactly the fields"),
    ],
)
def test_decode_packet_raises_if_the_header_is_inconsistent(change: dict, match: str) -> None:
    header = one_entry()
    header.update(change)
    assert match in str(refused_fast(raw_packet(header, bytes(header["payload_bytes"]))))


def test_decode_packet_raises_if_entries_overlap_or_are_unaligned() -> None:
    a = {"key": ["a"], "dtype": "uint8", "shape": [2], "offset": 0, "nbytes": 2}
    for offset in (0, 2, 8, 32):
        b = {**a, "key": ["b"], "offset": offset}
        header = {"batch_size": [2], "names": [None], "tds": [], "entries": [a, b],
                  "payload_bytes": offset + 2}  # fmt: skip
        assert "offset" in str(refused_fast(raw_packet(header, bytes(offset + 2))))


def test_decode_packet_raises_if_the_payload_length_differs() -> None:
    packet = encode_packet(TensorDict({"a": torch.zeros(2)}, [2])).tobytes()
    for buffer in (packet + b"\0", packet[:-1]):
        assert "payload has" in str(refused_fast(buffer))


def test_decode_packet_raises_if_padding_is_not_zero() -> None:
    td = TensorDict(
        {"a": torch.zeros(3, dtype=torch.uint8), "b": torch.zeros(3, dtype=torch.uint8)}
    )
    packet = bytearray(encode_packet(td).tobytes())
    packet[-14] = 1
    assert "padding" in str(refused_fast(packet))


def test_decode_packet_raises_if_a_bool_is_not_0_or_1() -> None:
    packet = bytearray(
        encode_packet(TensorDict({"done": torch.zeros(4, dtype=torch.bool)}, [4])).tobytes()
    )
    packet[-1] = 2
    assert "bool" in str(refused_fast(packet))


def test_a_header_seen_before_still_has_every_payload_checked() -> None:
    # Batches of one layout share their header bytes, whose parse the decoder reuses:
    # what the payload holds is checked anew each time.
    td = TensorDict({"done": torch.zeros(4, dtype=torch.bool), "x": torch.zeros(3)}, [])
    good = encode_packet(td).tobytes()
    assert decode_packet(bytearray(good))["done"].dtype is torch.bool
    # The payload's last 28 bytes: "done" (4), zero padding (12), "x" (12).
    bad_bool = bytearray(good)
    bad_bool[len(good) - 28] = 2
    assert "bool" in str(refused_fast(bad_bool))
    bad_padding = bytearray(good)
    bad_padding[len(good) - 13] = 1
    assert "padding" in str(refused_fast(bad_padding))
    assert decode_packet(bytearray(good))["x"].shape == (3,)


def test_a_header_accepted_under_loose_limits_is_refused_under_strict_ones() -> None:
    packet = encode_packet(TensorDict({f"k{i}": torch.zeros(1) for i in range(8)}, [])).tobytes()
    assert len(decode_packet(bytearray(packet)).keys()) == 8
    with pytest.raises(PacketTooLargeError, match="max_entries"):
        decode_packet(bytearray(packet), PacketLimits(max_entries=4))


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_ten_thousand_distinct_headers_keep_the_decoder_s_memory_bounded() -> None:
    tracemalloc.start()
    try:
        for i in range(200):  # warm: whatever the decoder keeps, it keeps by now
            decode_packet(bytearray(encode_packet(TensorDict({f"w{i}": torch.zeros(1)})).tobytes()))
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            key = f"k{i}" + "x" * 200  # a header of ~300 bytes, different every time
            decode_packet(bytearray(encode_packet(TensorDict({key: torch.zeros(1)})).tobytes()))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1 << 20, f"the decoder kept {grown} bytes after 10,000 distinct headers"


def test_decode_packet_raises_if_keys_collide_or_have_no_parent() -> None:
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
        assert match in str(refused_fast(raw_packet(header)))


def string_packet(ends: list[int], text: bytes) -> bytearray:
    region = np.array(ends, dtype="<u8").tobytes() + text
    entry = {"key": ["s"], "dtype": "str", "shape": [len(ends)], "offset": 0, "nbytes": len(region)}
    header = {"batch_size": [len(ends)], "names": [None], "tds": [], "entries": [entry],
              "payload_bytes": len(region)}  # fmt: skip
    return raw_packet(header, region)


def test_decode_packet_reads_a_well_formed_string_region() -> None:
    assert decode_packet(string_packet([1, 4], b"ab\xc3\xa9")).get("s").tolist() == ["a", "bé"]


@pytest.mark.parametrize(
    ("ends", "text", "match"),
    [([2, 1], b"abc", "monotonic"), ([1, 2], b"abc", "monotonic"), ([1, 4], b"abc", "monotonic"),
     ([1, 2], b"a\xc3", "UTF-8"), ([1, 3], b"a\xc3\xa9"[:2] + b"x", "UTF-8")],
)  # fmt: skip
def test_decode_packet_raises_if_a_string_region_is_malformed(ends, text, match) -> None:
    assert match in str(refused_fast(string_packet(ends, text)))


def test_decode_packet_raises_if_there_are_too_many_strings() -> None:
    count = PacketLimits().max_strings + 1
    entry = {"key": ["s"], "dtype": "str", "shape": [count], "offset": 0, "nbytes": 8 * count}
    header = {"batch_size": [count], "names": [None], "tds": [], "entries": [entry],
              "payload_bytes": 8 * count}  # fmt: skip
    assert "max_strings" in str(refused_fast(raw_packet(header), PacketTooLargeError))
    small = string_packet([1, 2, 3], b"abc")
    assert "max_strings" in str(refused_fast(small, PacketTooLargeError, max_strings=2))


STACKS_WITHOUT_STRINGS = [[70_000, 0], [300, 300, 0], [2**30, 0], [2**30, 2**30, 0, 5]]


@pytest.mark.parametrize(
    "shape", STACKS_WITHOUT_STRINGS, ids=[str(s) for s in STACKS_WITHOUT_STRINGS]
)
def test_decode_packet_raises_if_a_string_stack_without_strings_nests_too_many_lists(
    shape: list[int],
) -> None:
    """A string stack of 2^30 empty rows holds no string and no byte, yet would be built
    as 2^30 lists: its rows count against max_strings."""
    entry = {"key": ["s"], "dtype": "str", "shape": shape, "offset": 0, "nbytes": 0}
    header = {"batch_size": [], "names": [], "tds": [], "entries": [entry], "payload_bytes": 0}
    error = refused_fast(raw_packet(header), PacketTooLargeError)
    assert f"entry ['s'] shape {shape}: more than max_strings" in str(error)


@pytest.mark.parametrize(
    ("buffer", "match"),
    [(b"RLF", "at least 12"), (b"RLF2" + bytes(12), "bad magic"),
     (bytes(raw_packet(b"{}", pad=False)), "multiple of 16")],
)  # fmt: skip
def test_decode_packet_raises_if_the_preamble_is_wrong(buffer: bytes, match: str) -> None:
    assert match in str(refused_fast(buffer))


def test_decode_packet_raises_if_the_packet_is_over_the_cap() -> None:
    packet = encode_packet(TensorDict({"a": torch.zeros(64)}, [64])).tobytes()
    refused_fast(packet, PacketTooLargeError, max_packet_bytes=len(packet) - 1)
    assert decode_packet(packet, PacketLimits(max_packet_bytes=len(packet)))["a"].shape == (64,)


def test_decode_packet_raises_if_not_given_bytes() -> None:
    with pytest.raises(TypeError, match="bytes-like"):
        decode_packet("RLF1")  # type: ignore[arg-type]


def test_decode_packet_raises_if_string_offsets_fall_back_yet_end_at_the_text() -> None:
    """Offsets that go back (overlapping strings) are refused even when the last one ends
    exactly at the text: no string is read twice, none is made up."""
    assert "monotonic" in str(refused_fast(string_packet([2, 1, 3], b"abc")))
    assert "monotonic" in str(refused_fast(string_packet([3, 0, 3], b"abc")))
