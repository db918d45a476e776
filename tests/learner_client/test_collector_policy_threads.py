"""The ``policy=`` module read by one thread while another changes it or pushes it.

A user's thread steps its optimiser, or calls ``update_policy_weights_``, while ``next()`` (or
``start()``'s thread) pushes the module before a batch. Each push carries one state of the
module, never one tensor before a change and another after it; a call that finds the module
unchanged returns only once a push of it by another thread was made; and a push that raised is
made again before the next batch. Each interleaving is held in place at a gate inside the
weights' encoding, against a real actor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")
from torchrl_harness import greedy_cartpole_actor, greedy_cartpole_policy

import common.weights
import learner_client._collector
from learner_client import GrpcCollector
from learner_client._pushes import Pusher

BIAS = "module.linear.bias"  # read after the weight: a gate there splits the module's read


@pytest.fixture(scope="module")
def actor() -> Iterator[str]:
    with greedy_cartpole_actor() as address:
        yield address


def _policy() -> Any:
    return greedy_cartpole_policy()


def _state(policy: Any) -> tuple[torch.Tensor, torch.Tensor]:
    linear = policy.module.linear
    return linear.weight.detach().clone(), linear.bias.detach().clone()


def _acted_with(batch: Any, *states: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether every step of ``batch`` acted with the linear layer of one of ``states``."""
    logits = batch["logits"]
    acted = torch.zeros(logits.shape[:-1], dtype=torch.bool)
    for weight, bias in states:
        expected = batch["observation"] @ weight.T + bias
        acted |= torch.isclose(logits, expected, atol=1e-5).all(-1)
    return bool(acted.all())


class _Gate:
    """Holds the thread named ``holds`` at ``fn``'s first call that ``when`` picks."""

    def __init__(self, holds: str) -> None:
        self.holds, self.reached, self.opened = holds, threading.Event(), threading.Event()

    def wrap(self, fn: Any, when: Any) -> Any:
        def gated(*args: Any, **kwargs: Any) -> Any:
            mine = threading.current_thread().name == self.holds
            if mine and not self.reached.is_set() and when(*args, **kwargs):
                self.reached.set()
                assert self.opened.wait(30), "the gate was never opened"
            return fn(*args, **kwargs)

        return gated


def _hold_at_the_bias(monkeypatch: pytest.MonkeyPatch, holds: str) -> _Gate:
    """Hold ``holds`` while it reads the module for a push: the weight read, the bias not yet."""
    gate = _Gate(holds)
    gated = gate.wrap(common.weights._normalise_tensor, lambda name, *_, **__: name == BIAS)
    monkeypatch.setattr(common.weights, "_normalise_tensor", gated)
    return gate


def _next_in(collector: GrpcCollector, name: str, out: dict[str, Any]) -> threading.Thread:
    thread = threading.Thread(target=lambda: out.update({name: collector.next()}), name=name)
    thread.start()
    return thread


def test_a_push_before_a_batch_carries_one_state_of_an_optimiser_stepping_beside_it(
    actor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimiser step on another thread while the module is read for the push before a
    batch: the batch acts with the module before the step or after it, never with the
    step's bias and the weight from before it."""
    policy = _policy()
    gate, out = _hold_at_the_bias(monkeypatch, "next"), {}
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        with torch.no_grad():
            policy.module.linear.bias.add_(1.0)  # a step: pushed before the next batch
        before = _state(policy)
        thread = _next_in(collector, "next", out)
        assert gate.reached.wait(30)
        with torch.no_grad():  # the next step, on this thread, while the push reads
            policy.module.linear.weight.add_(1.0)
            policy.module.linear.bias.add_(1.0)
        after = _state(policy)
        gate.opened.set()
        thread.join(30)
    assert _acted_with(out["next"], before, after)


def test_weights_given_while_a_batch_pushes_the_module_reach_it_whole_or_not_at_all(
    actor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``update_policy_weights_(weights)`` on another thread copies them into the module only
    between pushes: the batch whose push was reading the module acts with it before or after
    the copy, never with the copied bias beside the old weight (the call's own push is held
    until that batch arrived)."""
    policy = _policy()
    gate, out = _hold_at_the_bias(monkeypatch, "next"), {}
    held = _Gate("push")
    monkeypatch.setattr(Pusher, "update", held.wrap(Pusher.update, lambda *_: True))
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        with torch.no_grad():
            policy.module.linear.bias.add_(1.0)
        before = _state(policy)
        thread = _next_in(collector, "next", out)
        assert gate.reached.wait(30)
        given = {"module.linear.weight": torch.zeros(2, 4), "module.linear.bias": torch.ones(2)}
        pushing = threading.Thread(target=collector.update_policy_weights_, args=(given,))
        pushing.name = "push"
        pushing.start()
        pushing.join(0.5)  # the copy, were it made at once
        gate.opened.set()
        thread.join(30)
        held.opened.set()
        pushing.join(30)
        copied = (given["module.linear.weight"], given[BIAS])
        assert _acted_with(collector.next(), copied)
    assert _acted_with(out["next"], before, copied)


def test_an_unchanged_module_call_returns_once_the_push_another_thread_makes_of_it_applied(
    actor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads call ``update_policy_weights_()`` after a step: the second finds the module
    counted as pushed by the first, and returns the version the first's push installs, not
    the one the actors held before the step."""
    policy = _policy()
    gate, results = _Gate("first"), {}
    original = learner_client._collector.normalize_update_args
    monkeypatch.setattr(
        learner_client._collector, "normalize_update_args", gate.wrap(original, lambda *_, **__: 1)
    )

    def call(name: str) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: results.update({name: collector.update_policy_weights_()}), name=name
        )
        thread.start()
        return thread

    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        version = collector.policy_version
        with torch.no_grad():
            policy.module.linear.bias.add_(1.0)
        first = call("first")
        assert gate.reached.wait(30)
        second = call("second")
        second.join(0.5)  # its answer, were it given at once
        gate.opened.set()
        first.join(30)
        second.join(30)
    assert results == {"first": {0: version + 1}, "second": {0: version + 1}}


def test_a_module_that_cannot_travel_raises_before_every_batch_not_once(actor: str) -> None:
    """A push of the module that raised (a parameter on the meta device) was not made: the
    next batch tries it again and raises again, it does not go on with the old weights."""
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        policy.module.linear.bias = torch.nn.Parameter(torch.empty(2, device="meta"))
        for _ in range(2):
            with pytest.raises(TypeError, match="meta device"):
                collector.next()


def test_a_push_call_refused_for_its_arguments_leaves_the_module_and_its_next_push(
    actor: str,
) -> None:
    """``update_policy_weights_(weights, version=0)`` raises before anything changes: the
    weights are not copied into the module, and the module's step is still pushed before the
    next batch (it was not counted as pushed)."""
    policy = _policy()
    with GrpcCollector([actor], policy=policy, frames_per_batch=8, sync=True) as collector:
        collector.next()
        version = collector.policy_version
        with torch.no_grad():
            policy.module.linear.bias.add_(1.0)
        stepped = _state(policy)
        given = {"module.linear.weight": torch.zeros(2, 4), "module.linear.bias": torch.ones(2)}
        for form in ({}, {"policy_or_weights": given}):
            with pytest.raises(ValueError, match="version must be in"):
                collector.update_policy_weights_(version=0, **form)
        assert all(torch.equal(a, b) for a, b in zip(_state(policy), stepped, strict=True))
        batch = collector.next()
    assert batch["policy_version"].unique().tolist() == [version + 1]
    assert _acted_with(batch, stepped)
