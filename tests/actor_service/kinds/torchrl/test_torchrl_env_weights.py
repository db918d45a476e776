"""A TorchRL-env actor whose envs hold weights (an ``RNDTransform``'s networks).

The actor holds them as the model ``"env"``, one set shared by every env of its pool, so a
push reaches each env between two steps, and a pool rebuilt after a crash steps with the
weights last pushed. The tests drive a :class:`TorchRLCore` directly.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_torchrl as factories
from torchrl_harness import torchrl_config

from actor_service import ModelSpec
from actor_service._kinds.torchrl.core import TorchRLCore
from actor_service._kinds.torchrl.pool import pool_envs
from common.config import CollectSettings
from common.env_weights import ENV_MODEL_ID, env_parameters
from common.errors import EnvError, WeightsError


def _rnd(env: torch.nn.Module) -> torch.nn.Module:
    (rnd,) = [t for t in env.transform if type(t).__name__ == "RNDTransform"]
    return rnd


def _learner_weights() -> dict[str, torch.Tensor]:
    """The weights a learner's ``rnd_pendulum(seed=0)`` pushes (other than the actor's)."""
    return {k: v.detach().clone() for k, v in env_parameters(factories.rnd_pendulum(0)).items()}


def _intrinsic(weights: dict[str, torch.Tensor], observation: torch.Tensor) -> torch.Tensor:
    env = factories.rnd_pendulum(0)
    for name, parameter in env_parameters(env).items():
        parameter.data.copy_(weights[name])
    rnd = _rnd(env)
    with torch.no_grad():
        error = rnd.predictor_network(observation) - rnd.target_network(observation)
        return error.pow(2).mean(dim=-1, keepdim=True)


def _assert_steps_with(batch: torch.Tensor, weights: dict[str, torch.Tensor]) -> None:
    got = batch["next", "intrinsic_reward"]
    assert torch.allclose(got, _intrinsic(weights, batch["next", "observation"]), atol=1e-6)


def test_every_env_of_the_pool_steps_with_the_pushed_env_weights() -> None:
    config = torchrl_config("rnd_pendulum", "random", num_envs=3)
    with TorchRLCore(config) as core:
        assert core.models.model_ids == ("policy", ENV_MODEL_ID)
        envs = pool_envs(core._base)
        assert envs is not None
        assert len(envs) == 3
        first = env_parameters(envs[0])
        for env in envs[1:]:  # one set of Parameter objects
            assert all(p is first[n] for n, p in env_parameters(env).items())
        weights = _learner_weights()
        assert not torch.equal(first[next(iter(weights))], next(iter(weights.values())))
        core.models.load_weights(ENV_MODEL_ID, 1, weights)
        assert core.models.policy_version(ENV_MODEL_ID) == 1
        core.configure(CollectSettings(frames_per_batch=30))
        batch = core.collect_batch()
    assert batch.batch_size == (3, 10)
    _assert_steps_with(batch, weights)


def test_a_rebuilt_pool_steps_with_the_env_weights_last_pushed() -> None:
    config = torchrl_config("rnd_pendulum", "random", num_envs=2, env_kwargs={"crash_after": 4})
    with TorchRLCore(config) as core:
        weights = _learner_weights()
        core.models.load_weights(ENV_MODEL_ID, 1, weights)
        core.configure(CollectSettings(frames_per_batch=20))
        with pytest.raises(EnvError, match="simulator crashed"):
            core.collect_batch()
        core.configure(CollectSettings(frames_per_batch=4))
        batch = core.collect_batch()  # new envs, built with their own random networks
    _assert_steps_with(batch, weights)


def test_the_env_weights_do_not_act_and_no_policy_may_take_their_id() -> None:
    with (
        TorchRLCore(torchrl_config("rnd_pendulum", "random")) as core,
        pytest.raises(ValueError, match="holds the env's weights: it does not act"),
    ):
        core.configure(CollectSettings(frames_per_batch=8, model_id=ENV_MODEL_ID))
    taken = torchrl_config(
        "rnd_pendulum", "random", models=(ModelSpec(model_id=ENV_MODEL_ID, factory="random"),)
    )
    with pytest.raises(ValueError, match="give the policy model another id"):
        TorchRLCore(taken)


def test_envs_without_weights_hold_no_env_model() -> None:
    with TorchRLCore(torchrl_config("pendulum", "random")) as core:
        assert core.models.model_ids == ("policy",)


@pytest.mark.long
def test_envs_in_other_processes_cannot_take_env_weights_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = torchrl_config("rnd_pendulum", "random", env_backend="async", num_envs=1)
    with caplog.at_level(logging.WARNING), TorchRLCore(config) as core:
        assert core.models.model_ids == ("policy",)
    assert "use 'sync' if the learner trains them" in caplog.text


def _predictor_copies(env_state: dict) -> list[torch.Tensor]:
    return [
        weights[key]
        for weights in env_state.values()
        for key in weights
        if key.startswith("transforms.2.predictor_network.0.weight")
    ]


def test_load_state_cannot_change_the_env_weights_past_their_models_version() -> None:
    """The env's state_dict() holds its RND networks too, which the actor holds as the model
    "env" under a version. A LoadState whose env section carries other values for them (its
    models/env untouched), or new models/env weights with the env section's old copies, is
    refused with nothing applied; the round trip of a GetState stays accepted."""
    config = torchrl_config("rnd_pendulum", "random", num_envs=2)
    with TorchRLCore(config) as core:
        core.models.load_weights(ENV_MODEL_ID, 3, _learner_weights())
        state = core.state_dict()
        before = {k: v.detach().clone() for k, v in core._env_weights.items()}
        core.load_state_dict(state)  # its own state: accepted
        forged = core.state_dict()
        for copy in _predictor_copies(forged["env"]):
            copy.fill_(42.0)
        with pytest.raises(WeightsError, match="change only with that model"):
            core.load_state_dict(forged)
        del forged["models"][ENV_MODEL_ID]  # no env weights of its own: those held now rule
        with pytest.raises(WeightsError, match="change only with that model"):
            core.load_state_dict(forged)
        malformed = core.state_dict()  # weights that are no mapping: refused as such
        malformed["models"][ENV_MODEL_ID]["weights"] = []
        with pytest.raises(WeightsError):
            core.load_state_dict(malformed)
        newer = core.state_dict()  # version 4 with new weights, the env section's old copies
        newer["models"][ENV_MODEL_ID]["version"] = 4
        for weights in newer["models"][ENV_MODEL_ID]["weights"].values():
            weights.add_(1.0)
        with pytest.raises(WeightsError, match="change only with that model"):
            core.load_state_dict(newer)
        assert core.models.policy_version(ENV_MODEL_ID) == 3
        assert all(torch.equal(p, before[n]) for n, p in core._env_weights.items())
        consistent = core.state_dict()  # both sections moved together: applied
        consistent["models"][ENV_MODEL_ID]["version"] = 4
        for weights in consistent["models"][ENV_MODEL_ID]["weights"].values():
            weights.add_(1.0)
        for worker in consistent["env"].values():
            for key, value in worker.items():
                if "_network" in key:
                    value.add_(1.0)
        core.load_state_dict(consistent)
        assert core.models.policy_version(ENV_MODEL_ID) == 4
        assert all(torch.equal(p, before[n] + 1.0) for n, p in core._env_weights.items())


def test_a_push_of_the_env_weights_during_a_state_load_stays_in_force_with_its_version(
    monkeypatch,
) -> None:
    """A LoadState restores the model "env" (under its lock), then the env's own state, whose
    copies of those weights are the restored ones. A push of "env" landing between the two
    (pushes run on another thread) must not be undone by the env's state: its version stays
    in force with its weights, not with the restored ones."""
    config = torchrl_config("rnd_pendulum", "random", num_envs=2)
    with TorchRLCore(config) as core:
        state = core.state_dict()  # version 0, the actor's own weights
        pushed = _learner_weights()
        restored = core._restored  # after the models' restore, before the env's state

        def restored_then_pushed() -> None:
            restored()
            push = threading.Thread(target=core.models.load_weights, args=(ENV_MODEL_ID, 1, pushed))
            push.start()  # on its own thread, as the actor applies a push
            push.join()

        monkeypatch.setattr(core, "_restored", restored_then_pushed)
        core.load_state_dict(state)
        assert core.models.policy_version(ENV_MODEL_ID) == 1
        for name, parameter in core._env_weights.items():
            assert torch.equal(parameter.detach(), pushed[name]), name


def test_a_state_taken_while_the_env_weights_are_pushed_holds_one_version_of_them(
    monkeypatch,
) -> None:
    """A GetState reads the models (the model "env" under its lock), then the env's own state,
    whose copies of those weights must be the model's. A push of "env" landing between the two
    reads (pushes run on another thread) must not leave the state the model's old version and
    weights beside the env's new copies: such a state is refused when it is loaded back."""
    config = torchrl_config("rnd_pendulum", "random", num_envs=2)
    with TorchRLCore(config) as core:
        pushed = _learner_weights()
        models_state = core.models.state_dict  # read before the env's state
        landed: list[bool] = []

        def read_then_pushed() -> dict:
            state = models_state()
            if not landed:
                landed.append(True)
                push = threading.Thread(
                    target=core.models.load_weights, args=(ENV_MODEL_ID, 1, pushed)
                )
                push.start()  # on its own thread, as the actor applies a push
                push.join()
            return state

        monkeypatch.setattr(core.models, "state_dict", read_then_pushed)
        state = core.state_dict()
        assert landed
        assert state["models"][ENV_MODEL_ID]["version"] == 1
        for name, weight in state["models"][ENV_MODEL_ID]["weights"].items():
            assert torch.equal(weight, pushed[name]), name
        core.load_state_dict(state)  # its own state, read back: accepted
        assert core.models.policy_version(ENV_MODEL_ID) == 1


def test_a_state_of_an_actor_whose_policy_is_named_env_and_whose_envs_hold_no_weights() -> None:
    """The model id "env" is the envs' weights only when they hold some: a policy may take it
    otherwise, and a GetState of such an actor reads its state once (it does not wait for
    envs' weights to agree with a model that is not theirs)."""
    config = torchrl_config("cartpole", "greedy_policy")
    policy = dataclasses.replace(config.models[0], model_id=ENV_MODEL_ID)
    with TorchRLCore(dataclasses.replace(config, models=(policy,))) as core:
        assert core.models.model_ids == (ENV_MODEL_ID,)
        states: list[dict] = []
        reader = threading.Thread(target=lambda: states.append(core.state_dict()), daemon=True)
        reader.start()
        reader.join(10)
        assert states, "GetState never returned"
        assert states[0]["models"][ENV_MODEL_ID]["version"] == 0
        assert "env" in states[0]
