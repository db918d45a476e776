"""``delta=True`` with a wire dtype (bf16) and ``only_trainable`` on real actors.

The promise: after any sequence of bf16 deltas an actor holds, bit for bit, what a
bf16 full push of the same state gives; a change of form is sent whole. The
actors' weights are read back through ``collector.state_dict()`` (GetState).
"""

from __future__ import annotations

import asyncio

import safetensors.torch
import torch
from learner_fleet import cartpole_policy

from learner_client import GrpcCollector, WeightPushSettings
from learner_client._transport import ActorChannel

BF16 = torch.bfloat16


def _actor_weights(collector: GrpcCollector, worker_id: int) -> dict[str, torch.Tensor]:
    blob = collector.state_dict()["workers"][worker_id]
    state = safetensors.torch.load(blob.numpy().tobytes())
    prefix = "models/policy/weights/"
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _through(policy: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The policy's state as an fp32 actor holds it after a full push in ``dtype``."""
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    if dtype is None:
        return state
    return {k: v.to(dtype).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}


def _bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].view(torch.uint8).equal(b[k].view(torch.uint8)) for k in a
    )


def _adam_step(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One real Adam step on a random linear loss: every trainable fp32 element moves."""
    gen = torch.Generator().manual_seed(seed)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    loss = sum((p * torch.randn(p.shape, generator=gen)).sum() for p in trainable)
    optimizer.zero_grad()
    loss.backward()  # type: ignore[union-attr]
    optimizer.step()


def test_bf16_deltas_match_a_bf16_full_push_bit_for_bit_and_anchor_in_bf16(fleet) -> None:
    addresses = [fleet[0].address, fleet[2].address]
    settings = WeightPushSettings(full_push_every=2)
    with GrpcCollector(addresses, frames_per_batch=8, weight_push=settings) as collector:
        policy = cartpole_policy()
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-5)
        collector.update_policy_weights_(policy)
        fp32_bytes = collector.stats()["last_push_bytes"]
        collector.update_policy_weights_(policy, worker_ids=[0], delta=True, dtype=BF16)
        bf16_bytes = collector.stats()["last_push_bytes"]  # nothing held in bf16 yet: full
        assert bf16_bytes < 0.6 * fp32_bytes
        sizes, deltas = [], []
        for step in range(5):
            _adam_step(policy, optimizer, step)
            collector.update_policy_weights_(policy, worker_ids=[0], delta=True, dtype=BF16)
            sizes.append(collector.stats()["last_push_bytes"])
            deltas.append(collector.stats()["delta_pushes"])
            collector.update_policy_weights_(policy, worker_ids=[2], dtype=BF16)  # full
            by_delta, by_full = _actor_weights(collector, 0), _actor_weights(collector, 2)
            assert _bits_equal(by_delta, by_full), step
            assert _bits_equal(by_delta, _through(policy, BF16)), step
            assert not _bits_equal(by_delta, _through(policy, None))  # it did travel in bf16
        # 2 deltas, the periodic full push (in bf16, not fp32), 2 deltas.
        assert [d - deltas[0] for d in deltas] == [0, 1, 1, 2, 3]
        assert [s < bf16_bytes / 2 for s in sizes] == [True, True, False, True, True]
        assert abs(sizes[2] - bf16_bytes) < 64
        assert collector.stats()["delta_fallbacks"] == 0


def test_a_change_of_form_is_sent_whole(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        policy = cartpole_policy()
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-5)
        steps = iter(range(100))
        forms = [(None, False), (BF16, True), (BF16, True), (None, True), (BF16, True)]
        expect_delta = [False, False, True, False, False]
        for (dtype, delta), is_delta in zip(forms, expect_delta, strict=True):
            _adam_step(policy, optimizer, next(steps))
            before = collector.stats()["delta_pushes"]
            collector.update_policy_weights_(policy, delta=delta, dtype=dtype)
            assert collector.stats()["delta_pushes"] - before == int(is_delta), (dtype, delta)
            assert _bits_equal(_actor_weights(collector, 0), _through(policy, dtype))


def test_bf16_delta_on_a_wrong_base_falls_back_to_a_bf16_full_push(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        policy = cartpole_policy()
        optimizer = torch.optim.Adam(policy.parameters(), lr=1e-5)
        collector.update_policy_weights_(policy, delta=True, dtype=BF16)
        behind_its_back = collector.state_dict()["workers"][0].numpy().tobytes()
        _adam_step(policy, optimizer, 1)
        collector.update_policy_weights_(policy, delta=True, dtype=BF16)
        asyncio.run(_load_state(fleet[0].address, behind_its_back))  # the base is gone
        _adam_step(policy, optimizer, 2)
        collector.update_policy_weights_(policy, delta=True, dtype=BF16)
        stats = collector.stats()
        assert stats["delta_fallbacks"] == 1
        assert _bits_equal(_actor_weights(collector, 0), _through(policy, BF16))
        _adam_step(policy, optimizer, 3)  # the fallback's full push is a base for the next delta
        collector.update_policy_weights_(policy, delta=True, dtype=BF16)
        assert collector.stats()["delta_pushes"] == stats["delta_pushes"] + 1
        assert _bits_equal(_actor_weights(collector, 0), _through(policy, BF16))


async def _load_state(address: str, blob: bytes) -> None:
    channel = ActorChannel(address)
    try:
        await channel.load_state(blob, 30.0, allow_rollback=True)
    finally:
        await channel.close()


def test_only_trainable_bf16_deltas_leave_frozen_weights_alone(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)  # everything, in fp32
        frozen_then = _through(policy, None)
        first = next(p for p in policy.parameters())
        first.requires_grad_(False)
        frozen = {k for k, v in policy.state_dict().items() if v.data_ptr() == first.data_ptr()}
        optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
        for step in range(3):
            _adam_step(policy, optimizer, step)
            with torch.no_grad():
                first.add_(1.0)  # changed on the learner, never sent
            before = collector.stats()["delta_pushes"]
            collector.update_policy_weights_(policy, delta=True, dtype=BF16, only_trainable=True)
            assert collector.stats()["delta_pushes"] - before == int(step > 0)
            actor, want = _actor_weights(collector, 0), _through(policy, BF16)
            for key in frozen:
                want[key] = frozen_then[key]
            assert _bits_equal(actor, want), step


def test_a_delta_of_other_keys_than_the_base_is_sent_whole(fleet) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy, delta=True, dtype=BF16)
        before = collector.stats()["delta_pushes"]
        first = next(iter(policy.state_dict()))
        with torch.no_grad():
            next(policy.parameters()).add_(0.5)
        part = {first: policy.state_dict()[first]}  # a subset of the keys last sent
        collector.update_policy_weights_(part, delta=True, dtype=BF16)
        assert collector.stats()["delta_pushes"] == before
        assert _bits_equal(_actor_weights(collector, 0), _through(policy, BF16))
