"""The actor's part staging on its own: a fake clock for expiry, drops released, buffers pooled."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from actor_service._serve._parts import PartBuffers, PartStaging, StagedPart
from common.errors import StaleVersionError, WeightsError, WeightsTooLargeError
from common.weights import Part

MODEL = {"a": None, "b": None}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _part(index: int, count: int, key: str, *, base: int | None = None) -> StagedPart:
    tensor = torch.zeros(4)
    if base is None:
        return StagedPart(Part(index, count), {key: tensor}, {}, buffer=torch.empty(8))
    delta = {key: (torch.tensor([0]), torch.ones(1))}
    return StagedPart(Part(index, count), {}, delta, base, buffer=torch.empty(8))


@pytest.fixture
def staging():
    clock, released = Clock(), []
    staging = PartStaging(5.0, lambda m, parts, applied: released.append((m, parts)), clock)
    return staging, clock, released


def test_parts_complete_a_version_once_all_arrived(staging) -> None:
    parts, _, released = staging
    assert parts.stage("policy", 3, _part(1, 2, "b"), MODEL, 64)[:2] == (1, None)
    assert parts.staging() == {"policy": (3, [1], 2)}
    count, whole, done = parts.stage("policy", 3, _part(0, 2, "a"), MODEL, 64)
    assert count == 2
    assert whole is not None
    assert sorted(whole.tensors) == ["a", "b"]
    assert [p.part.index for p in done] == [1, 0]
    assert parts.staging() == {}
    assert released == []  # released by the caller once swapped in
    with pytest.raises(StaleVersionError, match="comes too late"):
        parts.admit("policy", 3, Part(0, 2), None)  # a finished version is never taken again


def test_a_version_expires_at_its_deadline_and_its_parts_are_released(staging) -> None:
    parts, clock, released = staging
    first = _part(0, 2, "a")
    parts.stage("policy", 3, first, MODEL, 64)
    clock.now += 4.9
    parts.expire()
    assert parts.staging() == {"policy": (3, [0], 2)}
    clock.now += 0.1
    parts.expire()
    assert parts.staging() == {}
    assert released == [("policy", [first])]
    with pytest.raises(StaleVersionError, match="version 3 expired"):
        parts.admit("policy", 3, Part(1, 2), None)
    with pytest.raises(StaleVersionError, match="comes too late"):
        parts.admit("policy", 2, Part(1, 2), None)  # older than an expired one
    parts.admit("policy", 4, Part(1, 2), None)  # a newer version is welcome


def test_a_newer_version_supersedes_only_once_its_part_is_accepted(staging) -> None:
    parts, _, released = staging
    parts.stage("policy", 3, _part(0, 2, "a"), MODEL, 64)
    with pytest.raises(WeightsTooLargeError):  # refused: version 3 keeps staging
        parts.stage("policy", 4, _part(0, 2, "a"), MODEL, 8)
    assert parts.staging() == {"policy": (3, [0], 2)}
    parts.stage("policy", 4, _part(0, 2, "a"), MODEL, 64)
    assert parts.staging() == {"policy": (4, [0], 2)}
    assert len(released) == 1
    with pytest.raises(StaleVersionError, match="superseded by version 4"):
        parts.admit("policy", 3, Part(1, 2), None)


def test_a_whole_push_drops_a_staging_version_not_newer(staging) -> None:
    parts, _, released = staging
    parts.stage("policy", 3, _part(0, 2, "a"), MODEL, 64)
    parts.settle("policy", 2)
    assert parts.staging() == {"policy": (3, [0], 2)}
    parts.settle("policy", 3)
    assert parts.staging() == {}
    assert len(released) == 1


def _received(part: StagedPart, nbytes: int) -> StagedPart:
    return dataclasses.replace(part, received=nbytes)


def test_the_weight_cap_bounds_a_versions_parts_together_and_drops_it(staging) -> None:
    parts, _, released = staging
    first = _received(_part(0, 2, "a"), 20)  # blobs of 20 bytes: the model's 32 pass its bound
    parts.stage("policy", 3, first, MODEL, 64, max_weight_bytes=30)
    with pytest.raises(WeightsTooLargeError, match="40 bytes exceeds the cap of 30 bytes"):
        parts.stage("policy", 3, _received(_part(1, 2, "b"), 20), MODEL, 64, max_weight_bytes=30)
    assert parts.staging() == {}  # it could never complete: dropped, its part released
    assert released == [("policy", [first])]
    with pytest.raises(StaleVersionError, match="exceeds the cap"):
        parts.admit("policy", 3, Part(1, 2), None)  # another rank's part is told why
    # The cap is on the bytes received: parts sent in a narrower wire dtype (8-byte blobs
    # of 16 bytes each once cast to the model's dtype) pass a cap their cast bytes exceed.
    narrow = [_received(_part(i, 2, key), 8) for i, key in enumerate("ab")]
    assert parts.stage("policy", 4, narrow[0], MODEL, 64, max_weight_bytes=16)[0] == 1
    assert parts.stage("policy", 4, narrow[1], MODEL, 64, max_weight_bytes=16)[1] is not None


def test_the_weight_cap_takes_parts_at_it_and_refuses_one_byte_over(staging) -> None:
    """--max-weight-bytes bounds a version's parts as a whole push's blob: at the cap they
    stage and complete, one byte over it the version is refused and dropped.
    """
    parts, _, released = staging
    at = [_received(_part(i, 2, key), 15) for i, key in enumerate("ab")]  # 30 of a cap of 30
    assert parts.stage("policy", 3, at[0], MODEL, 64, max_weight_bytes=30)[0] == 1
    assert parts.stage("policy", 3, at[1], MODEL, 64, max_weight_bytes=30)[1] is not None
    over = [_received(_part(0, 2, "a"), 15), _received(_part(1, 2, "b"), 16)]  # 31
    parts.stage("policy", 4, over[0], MODEL, 64, max_weight_bytes=30)
    with pytest.raises(WeightsTooLargeError, match="31 bytes exceeds the cap of 30 bytes"):
        parts.stage("policy", 4, over[1], MODEL, 64, max_weight_bytes=30)
    assert parts.staging() == {}
    assert released == [("policy", [over[0]])]


def test_delta_parts_share_a_base_and_need_not_cover_every_key(staging) -> None:
    parts, _, _ = staging
    parts.stage("policy", 3, _part(0, 3, "a", base=2), MODEL, 64)
    with pytest.raises(WeightsError, match="applies on version 1"):
        parts.stage("policy", 3, _part(1, 3, "b", base=1), MODEL, 64)
    parts.stage("policy", 3, _part(1, 3, "b"), MODEL, 64)  # a whole part beside them
    _, whole, _ = parts.stage("policy", 3, StagedPart(Part(2, 3), {}, {}, 2), MODEL, 64)
    assert whole is not None
    assert whole.base_version == 2


def test_part_buffers_lend_the_smallest_fitting_and_keep_within_the_budget() -> None:
    pool = PartBuffers()
    small, large = torch.empty(10, dtype=torch.uint8), torch.empty(20, dtype=torch.uint8)
    pool.give_back("policy", [small, large, small], budget=40)  # the same buffer once
    assert pool.take("policy", 30) is None
    assert pool.take("policy", 5) is small
    assert pool.take("policy", 5) is large
    assert pool.take("policy", 5) is None
    pool.give_back("policy", [small, large], budget=25)  # over budget: the smallest goes
    assert pool.take("policy", 1) is large
    assert pool.take("policy", 1) is None


def test_a_part_arriving_after_the_deadline_never_completes_the_version() -> None:
    """stage() expires too: a part admitted in time whose bytes came too late is refused."""
    clock, released = Clock(), []
    parts = PartStaging(5.0, lambda m, p, a: released.append(p), clock)
    parts.stage("policy", 3, _part(0, 2, "a"), MODEL, 64)
    clock.now += 6.0  # the event loop's expire() has not run yet
    with pytest.raises(StaleVersionError, match="expired"):
        parts.stage("policy", 3, _part(1, 2, "b"), MODEL, 64)
    assert parts.staging() == {}


def test_parts_may_fill_exactly_the_models_bytes_and_no_more() -> None:
    parts = PartStaging(5.0, lambda *a: None, Clock())
    parts.stage("policy", 3, _part(0, 2, "a"), MODEL, 32)  # 16 + 16 == 32: fits
    assert parts.stage("policy", 3, _part(1, 2, "b"), MODEL, 32)[1] is not None
    parts.stage("policy", 4, _part(0, 2, "a"), MODEL, 31)
    with pytest.raises(WeightsTooLargeError, match="32 bytes, more than the model's 31"):
        parts.stage("policy", 4, _part(1, 2, "b"), MODEL, 31)
