"""Env actors with the policy on a device: the step's staging, and CUDA parity with the CPU."""

from __future__ import annotations

import gymnasium
import pytest
import torch
from helpers import start_actor
from tensordict.nn import InteractionType, set_interaction_type

from actor_service._config import ModelSpec
from actor_service._kinds.env.device_stage import DeviceStage
from actor_service._kinds.env.models import ModelRegistry
from common.config import ExplorationType
from common.errors import InternalError
from learner_client import GrpcCollector


def cartpole_registry(device: str, factory: str = "mlp", **kwargs) -> ModelRegistry:
    env = gymnasium.make("CartPole-v1")
    spec = ModelSpec("policy", factory, kwargs)
    registry = ModelRegistry([spec], env.observation_space, env.action_space, device)
    env.close()
    return registry


def test_stage_on_the_cpu_copies_nothing_in():
    stage = DeviceStage(torch.device("cpu"))
    observation = torch.zeros(4, 3)
    assert not stage.staged
    assert stage.to_device(observation) is observation


def test_stage_on_the_cpu_returns_host_tensors():
    action, extras = DeviceStage(torch.device("cpu")).to_host(
        torch.ones(4, dtype=torch.long), {("a", "b"): torch.zeros(4, 2)}
    )
    assert action.tolist() == [1, 1, 1, 1]
    assert extras[("a", "b")].shape == (4, 2)


def bad_index_policy(observation_space, action_space):
    """A plain module whose discrete action is out of range (index 7 of CartPole's 2)."""

    class Bad(torch.nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return torch.full((observation.shape[0],), 7, dtype=torch.long)

    return Bad()


def test_registry_refuses_out_of_range_indices_on_the_host():
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        cartpole_registry("cpu", f"{__name__}:bad_index_policy")


@pytest.mark.cuda
def test_stage_on_cuda_moves_in_and_out_through_pinned_memory():
    stage = DeviceStage(torch.device("cuda"))
    observation = torch.arange(12.0).reshape(4, 3)
    on_device = stage.to_device(observation)
    assert on_device.is_cuda
    action, extras = stage.to_host(on_device.sum(-1), {"x": on_device * 2})
    assert action.is_pinned()
    assert extras["x"].is_pinned()
    assert torch.equal(action, observation.sum(-1))
    assert torch.equal(extras["x"], observation * 2)


@pytest.mark.cuda
def test_registry_on_cuda_acts_like_the_cpu_one():
    cpu, cuda = cartpole_registry("cpu"), cartpole_registry("cuda")
    cuda.module("policy").load_state_dict(cpu.module("policy").state_dict())
    observation = torch.randn(8, 4)
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        _, a_cpu, x_cpu = cpu.act_compact("policy", observation)
        _, a_cuda, x_cuda = cuda.act_compact("policy", observation)
    assert a_cuda.device.type == "cpu"
    assert torch.equal(a_cpu, a_cuda)
    for key, value in x_cpu.items():
        torch.testing.assert_close(x_cuda[key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_actor_on_cuda_collects_the_batches_of_an_actor_on_the_cpu():
    """A deterministic policy (mode), the same seed: the same batches up to float tolerance."""
    batches = {}
    for device in ("cpu", "cuda"):
        actor = start_actor(["--num-envs", "4", "--seed", "3", "--device", device])
        try:
            with GrpcCollector(
                [actor.address],
                frames_per_batch=64,
                total_frames=192,
                exploration_type=ExplorationType.DETERMINISTIC,
            ) as collector:
                collector.set_seed(5)
                batches[device] = [b.exclude(("collector", "traj_ids")) for b in collector]
        finally:
            actor.close()
    for on_cpu, on_cuda in zip(batches["cpu"], batches["cuda"], strict=True):
        assert torch.equal(on_cpu["action"], on_cuda["action"])
        torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-4, atol=1e-5)


def test_internal_error_is_what_a_bad_policy_raises_at_run_time():
    registry = cartpole_registry("cpu")
    with pytest.raises(InternalError, match="outside"):
        registry.action_codec.check_range(torch.tensor([0, 2]))
    registry.action_codec.check_range(torch.tensor([0, 1]))
