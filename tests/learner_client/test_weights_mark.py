"""``WeightsMark``: whether the weights a push read changed since, by the signs it follows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from learner_client._shared_policy import (
    VALUE_CHECKED_BUFFER_ELEMENTS,
    GivenWeights,
    SharedPolicy,
    WeightsMark,
)


def test_a_mark_sees_in_place_changes_new_memory_and_other_tensors() -> None:
    weights = {"w": torch.zeros(3), "b": torch.zeros(1)}
    mark = WeightsMark.of(weights)
    assert mark is not None
    assert mark.matches(weights)
    weights["w"].add_(1.0)  # counter
    assert not mark.matches(weights)
    mark = WeightsMark.of(weights)
    weights["w"].data = torch.ones(3)  # new memory
    assert mark is not None
    assert not mark.matches(weights)
    assert not WeightsMark.of(weights).matches({**weights, "c": torch.zeros(1)})  # type: ignore[union-attr]


def test_small_tensors_are_compared_by_value_large_ones_by_counter_alone() -> None:
    module = nn.Linear(2, 2)
    module.register_buffer("eps", torch.ones(1))
    module.register_buffer("big", torch.zeros(VALUE_CHECKED_BUFFER_ELEMENTS + 1))
    mark = WeightsMark.of(module)
    assert mark is not None
    module.big.data.fill_(1.0)  # through .data: no counter, too large to copy
    assert mark.matches(module)
    module.eps.data.copy_(torch.zeros(1))  # TorchRL's annealing: no counter, seen by value
    assert not mark.matches(module)


def test_a_tensordict_is_marked_leaf_by_leaf_and_other_forms_are_not_followed() -> None:
    td = TensorDict({"a": {"b": torch.zeros(2)}})
    mark = WeightsMark.of(td)
    assert mark is not None
    assert mark.matches(td)
    td["a", "b"].add_(1.0)
    assert not mark.matches(td)
    assert WeightsMark.of({0: {"w": torch.zeros(1)}}) is None  # per-worker: not followed
    assert WeightsMark.of([torch.zeros(1)]) is None
    assert not mark.matches([torch.zeros(1)])


def test_a_lazy_module_is_not_followed_until_it_has_weights() -> None:
    module = nn.LazyLinear(2)
    assert WeightsMark.of(module) is None  # no memory to follow: never "unchanged"
    module(torch.zeros(1, 3))
    mark = WeightsMark.of(module)
    assert mark is not None
    assert mark.matches(module)


def test_the_shared_policy_follows_its_module_by_the_marks_signs() -> None:
    """``policy=``'s module: due before the first push, then only when it changed; a lazy
    module not yet run is due (its push says why it cannot go) and does not raise here."""
    module = nn.Sequential(nn.Linear(2, 2))
    module.register_buffer("eps", torch.ones(1))
    shared = SharedPolicy(module, follow=True)
    assert shared.due()
    shared.mark_pushed()
    assert not shared.due()
    module.eps.data.copy_(torch.zeros(1))  # annealed through .data: seen by value
    assert shared.due()
    shared.mark_pushed()
    with torch.no_grad():
        module[0].weight.add_(1.0)  # an optimiser step's kind of change
    assert shared.due()
    shared.mark_pushed()
    shared.forget()  # a push failed somewhere
    assert shared.due()
    lazy = SharedPolicy(nn.LazyLinear(2), follow=True)
    lazy.mark_pushed()
    assert lazy.changed()
    unfollowed = SharedPolicy(module, follow=False)
    unfollowed.mark_pushed()
    with torch.no_grad():
        module[0].weight.add_(1.0)
    assert unfollowed.changed()
    assert not unfollowed.due()  # push_policy_changes=False: only when asked


def _sent(
    shared: SharedPolicy, given: GivenWeights, **how: Any
) -> tuple[GivenWeights, bool] | None:
    """What a call sends and whether the module counts as pushed, carried out as pushed."""
    plan = shared.planned(given, **how)
    if plan is None:
        return None
    shared.carry_out(plan, lambda: None)
    return plan.given, plan.marks


def test_a_push_call_with_the_shared_policy_sends_what_torchrl_would() -> None:
    """No argument: the module, unless unchanged since its last push (nothing, None); given
    weights it can hold: copied in, the module sent and marked; to a subset: not marked."""
    module = nn.Linear(2, 2)
    shared = SharedPolicy(module, follow=True)
    nothing = GivenWeights(None, None, None, None)
    sent = GivenWeights(None, None, module, None)
    whole = {"default_model": True, "whole": True}
    assert _sent(shared, nothing, **whole, version=None) == (sent, True)
    assert _sent(shared, nothing, **whole, version=None) is None
    asked = _sent(shared, nothing, **whole, version=7)
    assert asked == (sent, True)  # a version asked for: sent
    given = GivenWeights(TensorDict({"weight": torch.ones(2, 2)}), None, None, None)
    assert _sent(shared, given, **whole, version=None) == (
        GivenWeights(module, None, None, None),
        True,
    )
    assert torch.equal(module.weight.detach(), torch.ones(2, 2))
    subset = _sent(shared, nothing, default_model=True, whole=False, version=None)
    assert subset == (sent, False)
    other_model = _sent(shared, nothing, default_model=False, whole=True, version=None)
    assert other_model == (nothing, False)


def test_a_push_call_plan_changes_the_module_only_when_carried_out_and_a_failure_forgets() -> None:
    """A plan is only looked at until it is carried out (a call refused for its arguments
    copies nothing and marks nothing); a push of the module that raises leaves it due."""
    module = nn.Linear(2, 2)
    shared = SharedPolicy(module, follow=True)
    shared.mark_pushed()
    given = GivenWeights({"weight": torch.ones(2, 2)}, None, None, None)
    plan = shared.planned(given, default_model=True, whole=True, version=None)
    assert plan is not None
    assert plan.marks
    assert not torch.equal(module.weight.detach(), torch.ones(2, 2))
    assert not shared.due()

    def refused() -> None:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        shared.carry_out(plan, refused)
    assert torch.equal(module.weight.detach(), torch.ones(2, 2))
    assert shared.due()
