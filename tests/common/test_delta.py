"""Sparse-delta weights: bit-exact round trips, and every bound checked on decode."""

from __future__ import annotations

import pytest
import torch

from common.errors import DataLossError, WeightsError, WeightsTooLargeError
from common.weights import BlobAssembler, check_ties, checksums, crc32c
from common.weights._delta import apply_delta, changed_elements, decode_delta, encode_delta
from common.weights._safetensors import write_blob

MB = 1 << 20


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(6, 5, generator=gen),
        "b": torch.randn(5, generator=gen).to(torch.bfloat16),
        "steps": torch.arange(4, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "z": torch.zeros(3, dtype=torch.complex64),
    }


def _expected(state: dict[str, torch.Tensor]) -> dict:
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))
    )


def _apply(held: dict[str, torch.Tensor], blob: bytes) -> None:
    view = memoryview(bytearray(blob))
    apply_delta(held, decode_delta(view, _expected(held), max_bytes=10 * MB))


def test_delta_sequence_is_bit_identical_to_the_last_full_state() -> None:
    old = _state()
    held = {k: v.clone() for k, v in old.items()}
    for step in range(5):
        new = {k: v.clone() for k, v in old.items()}
        new["w"][step, :2] += 1e-3
        new["b"][step] = -new["b"][step]
        new["steps"][step % 4] += 7
        new["mask"][step % 3] = ~new["mask"][step % 3]
        new["z"][step % 3] = complex(step, -step)
        if step == 2:
            new["w"][0, 4] = -0.0  # equal to 0.0 by value, not by bits
            old["w"][0, 4] = 0.0
            held["w"][0, 4] = 0.0
        _apply(held, encode_delta(old, new))
        assert all(_bits_equal(held[k], new[k]) for k in new), step
        old = new


def test_delta_holds_only_changed_elements() -> None:
    old = _state()
    new = {k: v.clone() for k, v in old.items()}
    new["w"][1, 1] = 3.0
    blob = encode_delta(old, new)
    delta = decode_delta(memoryview(bytearray(blob)), _expected(old), max_bytes=MB)
    assert list(delta) == ["w"]
    index, values = delta["w"]
    assert index.tolist() == [6]
    assert values.tolist() == [3.0]
    assert len(blob) < 300
    assert len(encode_delta(old, old)) < 100  # nothing changed: only the header


def test_changed_elements_compares_bits_and_refuses_other_shapes() -> None:
    assert changed_elements(torch.zeros(3), torch.tensor([0.0, -0.0, 0.0])).tolist() == [1]
    with pytest.raises(WeightsError, match="equal shapes"):
        changed_elements(torch.zeros(3), torch.zeros(4))
    with pytest.raises(WeightsError, match="same keys"):
        encode_delta({"a": torch.zeros(1)}, {"b": torch.zeros(1)})


def _raw(parts: dict[str, torch.Tensor], mark: bool = True) -> memoryview:
    meta = {"rlfleet.delta": "1"} if mark else {}
    return memoryview(bytearray(write_blob(parts, meta)))


def _u8(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ({"indices:w": torch.tensor([30]), "values:w": torch.tensor([1.0])}, "outside"),
        ({"indices:w": torch.tensor([2**63 - 1]), "values:w": torch.tensor([1.0])}, "outside"),
        ({"indices:w": torch.tensor([-1]), "values:w": torch.tensor([1.0])}, "outside"),
        ({"indices:w": torch.tensor([3, 3]), "values:w": torch.ones(2)}, "strictly increasing"),
        ({"indices:w": torch.tensor([4, 1]), "values:w": torch.ones(2)}, "strictly increasing"),
        ({"indices:w": torch.tensor([1]), "values:w": torch.ones(1, dtype=torch.float64)}, "1-D"),
        ({"indices:w": torch.tensor([1, 2]), "values:w": torch.ones(1)}, "one value per index"),
        ({"indices:w": torch.tensor([1]), "values:w": torch.ones(1, 1)}, "1-D"),
        ({"indices:w": torch.tensor([1.0]), "values:w": torch.ones(1)}, "int32 or int64"),
        ({"indices:w": _u8([1]), "values:w": torch.ones(1)}, "int32 or int64"),
        ({"indices:w": torch.tensor([[1]]), "values:w": torch.ones(1)}, "int32 or int64"),
        ({"indices:w": torch.tensor([1])}, "lacks its values"),
        ({"values:w": torch.ones(1)}, "lacks its indices"),
        ({"indices:nope": torch.tensor([1]), "values:nope": torch.ones(1)}, "names no parameter"),
        ({"w": torch.zeros(6, 5)}, "names no parameter"),
        ({"indices:w": torch.tensor([1]), "values:w": torch.tensor([float("nan")])}, "non-finite"),
        ({"gaps:w": _u8([2, 0]), "values:w": torch.ones(2)}, "1 to 255"),
        ({"gaps:w": _u8([255]), "values:w": torch.ones(1)}, "outside"),
        ({"gaps:w": _u8([30, 1]), "values:w": torch.ones(2)}, "outside"),
        ({"gaps:w": torch.tensor([2]), "values:w": torch.ones(1)}, "1-D uint8"),
        ({"gaps:w": _u8([[2]]), "values:w": torch.ones(1)}, "1-D uint8"),
        ({"gaps:w": _u8([2, 1]), "values:w": torch.ones(1)}, "one value per index"),
        ({"gaps:w": _u8([2]), "indices:w": torch.tensor([1]), "values:w": torch.ones(1)}, "both"),
        ({"gaps:nope": _u8([1]), "values:nope": torch.ones(1)}, "names no parameter"),
    ],
)
def test_decode_delta_raises_if_an_entry_breaks_a_bound(parts: dict, match: str) -> None:
    expected = {"w": ((6, 5), torch.float32), "b": ((5,), torch.float32)}
    with pytest.raises(WeightsError, match=match):
        decode_delta(_raw(parts), expected, max_bytes=MB)


@pytest.mark.parametrize(
    "values",
    [
        torch.tensor([complex(float("nan"), 0.0)], dtype=torch.complex64),
        torch.tensor([float("nan")]).to(torch.float8_e4m3fn),
    ],
    ids=["complex64", "float8"],
)
def test_decode_delta_raises_if_complex_or_float8_values_are_not_finite(
    values: torch.Tensor,
) -> None:
    expected = {"w": ((4,), values.dtype)}
    parts = {"indices:w": torch.tensor([1]), "values:w": values}
    with pytest.raises(WeightsError, match="non-finite"):
        decode_delta(_raw(parts), expected, max_bytes=MB)


def test_decode_delta_raises_if_unmarked_too_large_or_too_many_entries() -> None:
    expected = {"w": ((6, 5), torch.float32)}
    parts = {"indices:w": torch.tensor([1]), "values:w": torch.ones(1)}
    with pytest.raises(WeightsError, match=r"rlfleet\.delta"):
        decode_delta(_raw(parts, mark=False), expected, max_bytes=MB)
    with pytest.raises(WeightsTooLargeError):
        decode_delta(_raw(parts), expected, max_bytes=16)
    blob = _raw(parts)  # the cap holds exactly: its own size passes, a byte less does not
    assert sorted(decode_delta(blob, expected, max_bytes=len(blob))) == ["w"]
    with pytest.raises(WeightsTooLargeError, match=f"{len(blob)} bytes exceeds the cap"):
        decode_delta(blob, expected, max_bytes=len(blob) - 1)
    many = {f"indices:k{i}": torch.tensor([0]) for i in range(300_000 // 1000)}
    with pytest.raises(WeightsTooLargeError, match="tensors"):
        decode_delta(_raw(many), expected, max_bytes=100 * MB)


def test_apply_delta_writes_into_a_non_contiguous_target() -> None:
    live = torch.zeros(4, 3).t()  # a transposed view: not contiguous
    old = {"w": live.clone()}
    new = {"w": live.clone().contiguous()}
    new["w"][2, 1] = 5.0
    blob = encode_delta({"w": old["w"].contiguous()}, new)
    apply_delta(
        {"w": live}, decode_delta(memoryview(bytearray(blob)), _expected(old), max_bytes=MB)
    )
    assert live[2, 1] == 5.0
    assert float(live.abs().sum()) == 5.0


def test_blob_assembler_checks_crc32c() -> None:
    blob = bytes(range(256)) * 40
    digest, crc = checksums(blob, "crc32c")
    assert digest == ""
    assert crc == crc32c(blob)
    good = BlobAssembler(len(blob), crc32c=crc)
    for start in range(0, len(blob), 1000):
        good.add(blob[start : start + 1000])
    assert bytes(good.finish()) == blob
    bad = BlobAssembler(len(blob), crc32c=crc ^ 1)
    bad.add(blob)
    with pytest.raises(DataLossError, match="crc32c"):
        bad.finish()
    for value in (-1, 2**32, 2**64 - 1, True):
        with pytest.raises(WeightsError, match="crc32c"):
            BlobAssembler(4, crc32c=value)
    with pytest.raises(ValueError, match="checksum"):
        checksums(blob, "md5")


def _wire(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v.clone() for k, v in state.items()}


def test_bf16_delta_sequence_gives_the_bits_of_a_bf16_full_push() -> None:
    """Deltas diffed in bf16, cast on receipt, equal a bf16 full push whatever the model dtype."""
    gen = torch.Generator().manual_seed(1)
    fp32 = {"w": torch.randn(64, 32, generator=gen), "steps": torch.arange(5)}
    for model_dtype in (torch.float32, torch.float16, torch.float64):
        state = {k: v.clone() for k, v in fp32.items()}
        sent = _wire(state, torch.bfloat16)
        held = {"w": sent["w"].to(model_dtype), "steps": sent["steps"].clone()}  # a full push
        meta = {"rlfleet.dtype": "bfloat16"}
        for step in range(6):  # an Adam-like step: every fp32 element moves a little
            state["w"] += 1e-4 * torch.randn(state["w"].shape, generator=gen)
            state["steps"][step % 5] += 1
            new = _wire(state, torch.bfloat16)
            changed = changed_elements(sent["w"], new["w"]).numel()
            assert 0 < changed < state["w"].numel() // 2  # most bf16 values did not move
            _apply(held, encode_delta(sent, new, metadata=meta))
            assert _bits_equal(held["w"], new["w"].to(model_dtype)), (model_dtype, step)
            assert held["steps"].equal(state["steps"])
            sent = new


def test_wire_dtype_deltas_are_checked_and_cast_before_anything_is_applied() -> None:
    model = {"w": torch.zeros(4, dtype=torch.float16), "n": torch.zeros(3, dtype=torch.int64)}
    index = torch.tensor([1], dtype=torch.int32)

    def blob(values: torch.Tensor, key: str = "w", wire: str | None = "bfloat16") -> memoryview:
        meta = {"rlfleet.delta": "1", **({"rlfleet.dtype": wire} if wire else {})}
        parts = {f"indices:{key}": index, f"values:{key}": values}
        return memoryview(bytearray(write_blob(parts, meta)))

    good = decode_delta(
        blob(torch.tensor([0.5], dtype=torch.bfloat16)), _expected(model), max_bytes=MB
    )
    assert good["w"][1].dtype == torch.float16
    assert float(good["w"][1][0]) == 0.5
    bad = [
        (blob(torch.tensor([0.5], dtype=torch.bfloat16), wire=None), "float16"),  # undeclared
        (blob(torch.tensor([1], dtype=torch.int32), key="n"), "int64"),  # integers never cast
        (blob(torch.tensor([1e30], dtype=torch.bfloat16)), "non-finite"),  # fp16 overflow
        (blob(torch.tensor([0.5], dtype=torch.bfloat16), wire="int8"), "rlfleet.dtype"),
    ]
    for view, match in bad:
        with pytest.raises(WeightsError, match=match):
            decode_delta(view, _expected(model), max_bytes=MB)
    assert not model["w"].any()


def test_scattered_changes_travel_as_one_byte_gaps_with_fillers_and_stay_exact() -> None:
    gen = torch.Generator().manual_seed(3)
    old = {"w": torch.randn(10_000, generator=gen).to(torch.bfloat16)}
    new = {"w": old["w"].clone()}
    changed = torch.cat([torch.arange(0, 5000, 17), torch.tensor([9_999])])  # then a step of 5001
    new["w"][changed] += 1.0
    blob = encode_delta(old, new)
    delta = decode_delta(memoryview(bytearray(blob)), _expected(old), max_bytes=MB)
    index, _ = delta["w"]
    assert set(changed.tolist()) <= set(index.tolist())
    assert bool((index.diff() <= 255).all())  # fillers in the long step
    assert index.numel() == changed.numel() + 19  # the fewest: ceil(5001 / 255) - 1
    assert len(blob) < 200 + index.numel() * 3  # one byte per index, two per bf16 value
    held = {"w": old["w"].clone()}
    _apply(held, blob)
    assert _bits_equal(held["w"], new["w"])


def test_a_lone_change_in_a_large_tensor_travels_as_an_index() -> None:
    old = {"w": torch.zeros(1_000_000)}
    new = {"w": old["w"].clone()}
    new["w"][500_000] = 1.0
    blob = encode_delta(old, new)  # gaps would need 1,960 fillers
    assert len(blob) < 300
    delta = decode_delta(memoryview(bytearray(blob)), _expected(old), max_bytes=MB)
    assert delta["w"][0].tolist() == [500_000]


def _tied(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"embed": weight, "head": weight, "bias": torch.zeros(3)}  # one tensor, two keys


def test_a_change_of_tied_keys_travels_once_and_is_given_to_both() -> None:
    old, new = _tied(torch.zeros(4, 3)), _tied(torch.zeros(4, 3))
    new["embed"][1, 2] = 5.0
    blob = encode_delta(old, new)
    from_blob = decode_delta(memoryview(bytearray(blob)), _expected(new), max_bytes=MB)
    assert from_blob["head"] is from_blob["embed"]  # the alias is given the very entry
    untied = {k: v.clone() for k, v in new.items()}
    untied_old = {k: v.clone() for k, v in old.items()}
    assert len(blob) < len(encode_delta(untied_old, untied))  # untied: both keys travel
    held = _tied(torch.zeros(4, 3))
    _apply(held, blob)
    assert held["embed"][1, 2] == 5.0
    assert held["embed"] is held["head"]
    loose = {k: v.clone() for k, v in old.items()}  # a receiver holding them apart
    _apply(loose, blob)
    assert torch.equal(loose["head"], new["head"])
    assert torch.equal(loose["embed"], new["embed"])


def test_decode_delta_raises_if_an_alias_is_not_shaped_as_its_target() -> None:
    old, new = _tied(torch.zeros(4, 3)), _tied(torch.zeros(4, 3))
    new["embed"][0, 0] = 1.0
    blob = encode_delta(old, new)
    expected = _expected(new) | {"head": ((2, 3), torch.float32)}
    with pytest.raises(WeightsError, match="alias 'head' names no parameter"):
        decode_delta(memoryview(bytearray(blob)), expected, max_bytes=MB)
    with pytest.raises(WeightsError, match="alias 'head' names no parameter"):
        decode_delta(memoryview(bytearray(blob)), _expected({"embed": new["embed"]}), max_bytes=MB)


def test_check_ties_refuses_a_delta_that_changes_tied_keys_apart() -> None:
    reference = _tied(torch.zeros(4, 3))
    same = (torch.tensor([1]), torch.tensor([2.0]))
    check_ties({}, reference, {"embed": same, "head": (same[0].clone(), same[1].clone())})
    for delta in (
        {"embed": same},  # head keeps its value
        {"embed": same, "head": (torch.tensor([1]), torch.tensor([3.0]))},
        {"embed": (same[0], torch.tensor([0.0])), "head": (same[0], torch.tensor([-0.0]))},
    ):
        with pytest.raises(WeightsError, match="'head and embed'"):
            check_ties({}, reference, delta)
    whole = torch.zeros(4, 3)
    whole.view(-1)[1] = 2.0  # a whole part beside a delta part giving the same values
    check_ties({"head": whole}, reference, {"embed": same})
    with pytest.raises(WeightsError, match="'head and embed'"):
        check_ties({"head": torch.ones(4, 3)}, reference, {"embed": same})


def test_encode_delta_sends_a_complex_element_whose_imaginary_part_alone_changed() -> None:
    old = {"c": torch.zeros(4, dtype=torch.complex64)}
    new = {"c": torch.tensor([0, 0, 1j, 0], dtype=torch.complex64)}
    live = old["c"].clone()
    blob = encode_delta(old, new)
    assert blob is not None
    apply_delta(
        {"c": live}, decode_delta(memoryview(bytearray(blob)), _expected(old), max_bytes=MB)
    )
    assert torch.equal(live, new["c"])


def test_encode_delta_gives_up_when_its_encoded_entries_pass_max_bytes() -> None:
    # 10 changes far apart: 50 bytes at the lower bound (one byte an index), 80 encoded
    # (int32 indices beat the gaps' fillers), so only the check after encoding sees it.
    old = {"w": torch.zeros(1_000_000)}
    new = {"w": old["w"].clone()}
    new["w"][::100_000] = 1.0
    assert encode_delta(old, new, max_bytes=79) is None
    delta = encode_delta(old, new, max_bytes=80)
    assert delta is not None
    expected = {"w": ((1_000_000,), torch.float32)}
    apply_delta(old, decode_delta(memoryview(delta), expected, max_bytes=1 << 20))
    assert old["w"].equal(new["w"])
