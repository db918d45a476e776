"""Weights given to ``update_policy_weights_`` with ``policy=``: they become the policy's.

TorchRL's ``Collector`` copies the weights ``update_policy_weights_(weights)`` is given into
its policy and acts with them. With ``policy=``, the collector pushed them but left its module
as it was, so the module's own pending first push (before the first batch), or its automatic
push after the next optimiser step, undid them: the fleet acted with the old weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
from tensordict import TensorDict
from torchrl_harness import greedy_cartpole_actor, greedy_cartpole_policy

from learner_client import GrpcCollector, WeightPushError


@pytest.fixture(scope="module")
def actor() -> Iterator[str]:
    with greedy_cartpole_actor() as address:
        yield address


def _policy() -> Any:
    return greedy_cartpole_policy()


def _always_right(policy: Any, form: str) -> Any:
    """Weights for ``policy`` that always pick action 1, as a TensorDict or a state dict."""
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    state["module.linear.weight"].zero_()
    state["module.linear.bias"].copy_(torch.tensor([0.0, 1.0]))
    if form == "subset":  # the linear layer's alone, not the offset buffer
        return {k: v for k, v in state.items() if k.startswith("module.linear.")}
    return TensorDict(state).unflatten_keys(".") if form == "tensordict" else state


def _actions(batch: Any) -> set[int]:
    return set(batch["action"].argmax(-1).flatten().tolist())


@pytest.mark.parametrize("form", ["tensordict", "state_dict", "subset"])
def test_weights_given_before_the_first_batch_are_what_it_acts_with(actor: str, form: str) -> None:
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.update_policy_weights_(_always_right(policy, form))
        batch = collector.next()
        version = collector.policy_version
    assert _actions(batch) == {1}
    assert torch.equal(policy.module.linear.bias.detach(), torch.tensor([0.0, 1.0]))
    assert batch["policy_version"].unique().tolist() == [version]  # one push, not two


def test_weights_given_mid_run_survive_the_next_optimiser_step(actor: str) -> None:
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        first = collector.next()
        collector.update_policy_weights_(_always_right(policy, "tensordict"))
        with torch.no_grad():
            policy.module.linear.weight.add_(0.0)  # an optimiser step: the module is pushed
        second = collector.next()
    assert _actions(second) == {1}
    assert second["policy_version"].min() > first["policy_version"].max()


def test_weights_the_module_cannot_hold_are_sent_as_given_and_leave_it_alone(actor: str) -> None:
    policy = _policy()
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        wrong = {"module.linear.weight": torch.zeros(3, 3)}  # another shape: the actor's check
        with pytest.raises(WeightPushError, match=r"shape mismatch: module\.linear\.weight"):
            collector.update_policy_weights_(wrong)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_module_pushed_under_a_given_version_is_not_pushed_again_automatically(
    actor: str,
) -> None:
    """``update_policy_weights_(version=N)`` sends the module once; the batch acts at N."""
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        auto = collector.stats()["auto_pushes"]
        with torch.no_grad():  # an optimiser step
            policy.module.linear.bias.add_(1.0)
        assert collector.update_policy_weights_(version=10) == {0: 10}
        assert collector.next()["policy_version"].unique().tolist() == [10]
        assert collector.update_policy_weights_(version=20) == {0: 20}  # asked: sent unchanged
        assert collector.next()["policy_version"].unique().tolist() == [20]
        assert collector.stats()["auto_pushes"] == auto


def test_the_module_is_pushed_once_until_it_changes_and_a_refused_push_raises(actor: str) -> None:
    """``policy=``'s automatic push goes once while the module is unchanged (an argument-less
    call sends nothing either); a push the actor refuses raises, it is not merely logged."""
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        versions = [collector.next()["policy_version"].unique().tolist() for _ in range(3)]
        version, sent = collector.policy_version, collector.stats()["push_bytes"]
        assert versions == [[version]] * 3
        assert collector.stats()["auto_pushes"] == 1
        assert collector.update_policy_weights_() == {0: version}
        assert collector.stats()["push_bytes"] == sent
        with torch.no_grad():
            policy.module.linear.bias.fill_(float("nan"))
        with pytest.raises(WeightPushError, match="finite"):
            collector.next()


def test_a_refused_push_of_the_module_is_tried_again_not_dropped_as_pushed(actor: str) -> None:
    """A module the actor refused is not what it holds: the next batch and an argument-less
    call push it again (and raise again), they do not go on with the actor's old weights."""
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        with torch.no_grad():
            policy.module.linear.bias.fill_(float("nan"))
        for _ in range(2):
            with pytest.raises(WeightPushError, match="finite"):
                collector.next()
        with pytest.raises(WeightPushError, match="finite"):
            collector.update_policy_weights_()


def test_an_argumentless_push_after_per_worker_weights_sends_the_policy_module(actor: str) -> None:
    """TorchRL's argument-less ``update_policy_weights_()`` sends the collector's policy to
    every worker; after per-worker weights, the actors do not hold the module any more, so
    "unchanged since its last push" does not hold: the module must be sent."""
    policy, other = _policy(), _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        wid = collector.worker_ids[0]
        version = collector.update_policy_weights_({wid: other})[wid]
        sent = collector.stats()["push_bytes"]
        assert collector.update_policy_weights_() == {wid: version + 1}
        assert collector.stats()["push_bytes"] > sent


def test_the_module_sent_again_after_per_worker_weights_is_then_not_sent_a_third_time(
    actor: str,
) -> None:
    """Once the module went out again after per-worker weights, the actors hold it: a
    further argument-less call, the module unchanged, sends nothing (no new version)."""
    policy, other = _policy(), _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        wid = collector.worker_ids[0]
        version = collector.update_policy_weights_({wid: other})[wid]
        assert collector.update_policy_weights_() == {wid: version + 1}
        sent = collector.stats()["push_bytes"]
        assert collector.update_policy_weights_() == {wid: version + 1}
        assert collector.next()["policy_version"].unique().tolist() == [version + 1]
        assert collector.stats()["push_bytes"] == sent
