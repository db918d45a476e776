"""An env whose transforms hold networks the script trains (TorchRL's ``rnd_mujoco.py``).

TorchRL's ``Collector(create_env_fn=env, ...)`` steps the script's own env, whose
``RNDTransform`` shares its predictor with the loss: each batch's intrinsic reward comes
from the predictor as trained so far. On a fleet the actors step their own envs: the
learner pushes the script's env's weights (model ``"env"``) whenever they changed, and the
script's env, which follows the actor's env state (its ``VecNorm``), keeps its own networks.
Real ``--kind torchrl`` actors on loopback, on Pendulum-v1.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_torchrl  # the actors' own factories (on the path learner_fleet sets)
from learner_fleet import ACTOR_ENV, start_actors

from common.env_weights import ENV_MODEL_ID
from common.errors import UnknownModelError
from learner_client import GrpcCollector

pytestmark = [
    pytest.mark.usefixtures("loopback_only"),
    pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning"),  # another test's subject
]


def _actor(factory: str, *args: str) -> Iterator[str]:
    base = ["--kind", "torchrl", "--env-factory", f"rlfleet_test_torchrl:{factory}"]
    (actor,) = start_actors([[*base, "--worker-id", "0", "--seed", "0", *args]], ACTOR_ENV)
    yield actor.address
    actor.close()


@pytest.fixture(scope="module")
def rnd_actor() -> Iterator[str]:
    yield from _actor("rnd_pendulum", "--num-envs", "2")


@pytest.fixture(scope="module")
def plain_actor() -> Iterator[str]:
    yield from _actor("vecnorm_v1_pendulum", "--num-envs", "1")


def _rnd(env: torch.nn.Module) -> torch.nn.Module:
    (rnd,) = [t for t in env.transform if type(t).__name__ == "RNDTransform"]
    return rnd


def _intrinsic(rnd: torch.nn.Module, observation: torch.Tensor) -> torch.Tensor:
    """The intrinsic reward ``rnd`` gives (its raw prediction error) for ``observation``."""
    with torch.no_grad():
        error = rnd.predictor_network(observation) - rnd.target_network(observation)
        return error.pow(2).mean(dim=-1, keepdim=True)


def test_every_batch_steps_with_the_predictor_as_trained_so_far(rnd_actor: str) -> None:
    env = rlfleet_test_torchrl.rnd_pendulum(seed=0)  # other networks than the actor's
    rnd = _rnd(env)
    batches = 4
    with GrpcCollector(
        [rnd_actor], create_env_fn=env, frames_per_batch=32, total_frames=32 * batches, sync=True
    ) as collector:
        for i, batch in enumerate(collector):
            observation = batch["next", "observation"]
            got = batch["next", "intrinsic_reward"]
            assert torch.allclose(got, _intrinsic(rnd, observation), atol=1e-6), i
            trained = {k: v.clone() for k, v in rnd.predictor_network.state_dict().items()}
            with torch.no_grad():  # the script's optimiser step: bumps version counters
                for parameter in rnd.predictor_network.parameters():
                    parameter.add_(0.05 * (i + 1))
            after = rnd.predictor_network.state_dict()
            assert not all(torch.equal(after[k], trained[k]) for k in trained)
        stats = collector.stats()
        env_state = collector.actor_state(0)["env"]
    assert stats["auto_pushes"] >= batches  # the first push, then one per training step
    # Both of the actor's envs hold the weights of the last batch (pushed before it); the
    # script's env kept its own, trained once more since, though it follows the actor's state.
    assert any(k.endswith("_extra_state") for k in env_state["worker0"])
    held = [k for k in env_state["worker1"] if "predictor_network" in k]
    assert len(held) == 4  # two layers, weight and bias
    for key in held:
        name = key.rpartition("predictor_network.")[2]
        for worker in ("worker0", "worker1"):
            assert torch.equal(env_state[worker][key], trained[name]), (worker, key)
        assert not torch.equal(rnd.predictor_network.state_dict()[name], trained[name])


def test_unchanged_env_weights_are_pushed_once(rnd_actor: str) -> None:
    env = rlfleet_test_torchrl.rnd_pendulum(seed=0)
    with GrpcCollector(
        [rnd_actor], create_env_fn=env, frames_per_batch=32, total_frames=96, sync=True
    ) as collector:
        for batch in collector:
            expected = _intrinsic(_rnd(env), batch["next", "observation"])
            assert torch.allclose(batch["next", "intrinsic_reward"], expected, atol=1e-6)
        assert collector.stats()["auto_pushes"] == 1


def test_actors_whose_envs_hold_no_weights_name_the_fix(plain_actor: str) -> None:
    env = rlfleet_test_torchrl.rnd_pendulum(seed=0)
    with (
        GrpcCollector(
            [plain_actor], create_env_fn=env, frames_per_batch=16, total_frames=32, sync=True
        ) as collector,
        pytest.raises(UnknownModelError, match="create_env_fn's env holds weights") as info,
    ):
        next(iter(collector))
    assert f"model_id {ENV_MODEL_ID!r}" in str(info.value)
    assert "env_backend 'sync'" in str(info.value)


def test_a_script_env_without_trained_weights_pushes_nothing(plain_actor: str) -> None:
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    with GrpcCollector(
        [plain_actor], create_env_fn=env, frames_per_batch=16, total_frames=32, sync=True
    ) as collector:
        assert len(list(collector)) == 2
        assert collector.stats()["auto_pushes"] == 0
