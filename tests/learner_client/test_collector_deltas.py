"""``update_policy_weights_(..., delta=True)`` on real actors: bit-exact, smaller, self-healing.

The actors' weights are read back through ``collector.state_dict()`` (GetState).
"""

from __future__ import annotations

import asyncio
import signal

import pytest
import safetensors.torch
import torch
from learner_fleet import cartpole_policy

from learner_client import GrpcCollector, LocalFleet, WeightPushError, WeightPushSettings
from learner_client._transport import ActorChannel


def _actor_weights(collector: GrpcCollector, worker_id: int) -> dict[str, torch.Tensor]:
    blob = collector.state_dict()["workers"][worker_id]
    state = safetensors.torch.load(blob.numpy().tobytes())
    prefix = "models/policy/weights/"
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _bits_equal(actor: dict[str, torch.Tensor], policy: torch.nn.Module) -> bool:
    mine = {k: v.detach() for k, v in policy.state_dict().items()}
    return actor.keys() == mine.keys() and all(
        actor[k].view(torch.uint8).equal(mine[k].contiguous().view(torch.uint8)) for k in mine
    )


def _train_step(policy: torch.nn.Module, seed: int) -> None:
    """A few elements of every tensor change, in place, as an optimizer step would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.parameters():
            flat = param.view(-1)
            index = torch.randint(0, flat.numel(), (max(1, flat.numel() // 100),), generator=gen)
            flat[index] += 0.01 * torch.randn(index.numel(), generator=gen)


def test_delta_pushes_are_bit_exact_and_smaller_with_periodic_full_pushes(fleet) -> None:
    addresses = [fleet[0].address, fleet[2].address]
    settings = WeightPushSettings(full_push_every=3)
    with GrpcCollector(addresses, frames_per_batch=8, weight_push=settings) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy, delta=True)  # nothing held yet: full
        full_bytes = collector.stats()["last_push_bytes"]
        sizes, deltas = [], []
        for step in range(7):
            _train_step(policy, step)
            versions = collector.update_policy_weights_(policy, delta=True)
            assert sorted(versions) == [0, 2]
            stats = collector.stats()
            sizes.append(stats["last_push_bytes"])
            deltas.append(stats["delta_pushes"])
            assert 0 < stats["last_push_pause"] <= stats["push_pause_max"]
        for wid in (0, 2):
            assert _bits_equal(_actor_weights(collector, wid), policy)
        # Per worker: 3 deltas, then a full push, then 3 deltas.
        assert [d - deltas[0] for d in deltas] == [0, 2, 4, 4, 6, 8, 10]
        assert [s < full_bytes / 10 for s in sizes] == [True] * 3 + [False] + [True] * 3
        assert stats["delta_fallbacks"] == 0
        with torch.no_grad():  # a dense change (every element): cheaper as a full push
            for param in policy.parameters():
                param.mul_(1.01)
        collector.update_policy_weights_(policy, delta=True)
        dense = collector.stats()
        assert dense["delta_pushes"] == stats["delta_pushes"]
        assert dense["last_push_bytes"] == full_bytes
        assert _bits_equal(_actor_weights(collector, 0), policy)


def test_delta_push_falls_back_to_a_full_push_when_an_actor_holds_another_version(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy, delta=True)
        behind_its_back = collector.state_dict()["workers"][0].numpy().tobytes()
        _train_step(policy, 1)
        collector.update_policy_weights_(policy, delta=True)
        # Roll the actor back without telling the collector: its next delta has the wrong base.
        asyncio.run(_load_state(fleet[0].address, behind_its_back))
        _train_step(policy, 2)
        version = collector.update_policy_weights_(policy, delta=True)[0]
        stats = collector.stats()
        assert stats["delta_fallbacks"] == 1
        assert version == collector.policy_version
        assert _bits_equal(_actor_weights(collector, 0), policy)
        _train_step(policy, 3)  # the fallback's full push is a base for the next delta
        collector.update_policy_weights_(policy, delta=True)
        assert collector.stats()["delta_pushes"] == stats["delta_pushes"] + 1
        assert _bits_equal(_actor_weights(collector, 0), policy)


async def _load_state(address: str, blob: bytes) -> None:
    channel = ActorChannel(address)
    try:
        await channel.load_state(blob, 30.0, allow_rollback=True)
    finally:
        await channel.close()


def test_a_delta_an_actor_missed_for_another_reason_is_not_sent_again_whole() -> None:
    """Only a delta on another base is retried whole at once: the delta a killed actor missed
    fails as any push does, naming it, with no full push after it (no fallback counted)."""
    with (
        LocalFleet(2, "CartPole-v1", num_envs=1, seed=0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=2, sync=True) as collector,
    ):
        policy = cartpole_policy()
        collector.update_policy_weights_(policy, delta=True)
        fleet.kill(1, signal.SIGKILL)
        _train_step(policy, 1)
        with pytest.raises(WeightPushError, match="worker_id 1"):
            collector.update_policy_weights_(policy, delta=True)
        stats = collector.stats()
    assert stats["delta_fallbacks"] == 0
    assert stats["delta_pushes"] == 1  # the second push: a delta to both, nothing after it


def test_delta_push_raises_if_given_per_worker_weights(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        with pytest.raises(ValueError, match="per-worker"):
            collector.update_policy_weights_({0: cartpole_policy()}, delta=True)
        with pytest.raises(TypeError, match="delta"):
            collector.update_policy_weights_(cartpole_policy(), delta="yes")


def test_sha256_pushes_are_an_operator_option(fleet) -> None:
    settings = WeightPushSettings(checksum="sha256")
    with GrpcCollector([fleet[0].address], frames_per_batch=8, weight_push=settings) as c:
        policy = cartpole_policy(action=1)
        c.update_policy_weights_(policy)
        assert _bits_equal(_actor_weights(c, 0), policy)
    for bad in (dict(checksum="md5"), dict(full_push_every=0), dict(full_push_every=True)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            WeightPushSettings(**bad)
