"""The swap of a checked push under the model lock, and the kept receive buffers."""

from __future__ import annotations

import threading

import pytest
import torch

from actor_service._core._swap import ReceiveBuffers, swap_delta, swap_full
from common.errors import SessionStateError, StaleVersionError


class _Model:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 3
        self.weight = torch.zeros(4)


def _newer(version: int, current: int) -> None:
    if version <= current:
        raise StaleVersionError(f"{version} <= {current}")


def test_swaps_write_under_the_lock_and_report_the_pause() -> None:
    model = _Model()
    swap = swap_full(model, 4, lambda: model.weight.copy_(torch.ones(4)), _newer)
    assert (swap.version, model.version) == (4, 4)
    assert 0 < swap.pause_seconds < 1
    assert model.weight.tolist() == [1.0] * 4
    delta = {"w": (torch.tensor([2]), torch.tensor([7.0]))}
    assert swap_delta(model, "policy", 4, 5, {"w": model.weight}, delta, _newer).version == 5
    assert model.weight.tolist() == [1.0, 1.0, 7.0, 1.0]


def test_swap_delta_raises_if_the_base_is_not_in_force_and_writes_nothing() -> None:
    model = _Model()
    delta = {"w": (torch.tensor([0]), torch.tensor([9.0]))}
    with pytest.raises(SessionStateError, match=r"on top of version 2.*version 3 is in force"):
        swap_delta(model, "policy", 2, 4, {"w": model.weight}, delta, _newer)
    with pytest.raises(StaleVersionError):
        swap_delta(model, "policy", 3, 3, {"w": model.weight}, delta, _newer)
    assert model.version == 3
    assert model.weight.tolist() == [0.0] * 4
    assert not model.lock.locked()


def test_receive_buffers_lend_one_buffer_at_a_time_and_keep_the_largest() -> None:
    buffers = ReceiveBuffers()
    assert buffers.take("policy", 10) is None
    small, large = torch.empty(10, dtype=torch.uint8), torch.empty(20, dtype=torch.uint8)
    buffers.give_back("policy", small)
    buffers.give_back("policy", large)
    assert buffers.take("policy", 30) is None  # too small: the push allocates its own
    lent = buffers.take("policy", 15)
    assert lent is large
    assert buffers.take("policy", 15) is None  # lent out: a concurrent push gets a fresh one
    assert buffers.take("critic", 1) is None


def test_llm_models_swap_a_delta_between_decode_steps_bit_exactly() -> None:
    from actor_service._kinds.llm.models import LLMModels
    from common.weights import to_state_dict
    from common.weights._delta import decode_delta, encode_delta

    models = LLMModels("rlfleet:tiny-qwen2", {}, torch.device("cpu"))
    old = to_state_dict(models.model)
    models.load_weights("policy", 1, old)
    new = {k: v.clone() for k, v in old.items()}
    key = next(k for k in new if "layers.0" in k and k.endswith("proj.weight"))
    new[key].view(-1)[:3] += 1.0
    blob = memoryview(bytearray(encode_delta(old, new)))
    delta = decode_delta(blob, models.parameters_info("policy"), max_bytes=1 << 20)
    with pytest.raises(SessionStateError):
        models.swap_delta("policy", 0, 2, delta)
    assert models.policy_version("policy") == 1
    swap = models.swap_delta("policy", 1, 2, delta)
    assert swap.version == models.policy_version("policy") == 2
    now = to_state_dict(models.model)
    assert all(now[k].view(torch.uint8).equal(new[k].view(torch.uint8)) for k in new)


def test_swap_full_checks_the_version_again_under_the_lock_and_writes_nothing() -> None:
    """A newer push that landed while this one was staged wins: versions only go up."""
    model = _Model()
    model.version = 5  # applied after this push (version 4) passed its first check
    with pytest.raises(StaleVersionError):
        swap_full(model, 4, lambda: model.weight.copy_(torch.ones(4)), _newer)
    assert model.version == 5
    assert model.weight.tolist() == [0.0] * 4
