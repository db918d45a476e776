"""Env and LLM actors follow one set of rules for weight swaps, restored states and seeds."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from actor_service import ActorConfig, ModelSpec
from actor_service._kinds.env.core import EnvCore
from actor_service._kinds.llm.core import LLMCore
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import MAX_MODEL_ID, MAX_SEED, check_model_id, check_seed
from common.errors import StaleVersionError, WeightsError

pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 1, "seed": 0}
MAX_INT64 = 2**63 - 1


def _env_worker() -> EnvCore:
    return EnvCore(ActorConfig(num_envs=2, seed=0))


def _llm_worker() -> LLMCore:
    config = ActorConfig(
        kind="llm",
        llm=LLMActorSettings(task="arith"),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
        num_envs=2,
        seed=0,
    )
    return LLMCore(config)


_NO_TRANSFORMERS = importlib.util.find_spec("transformers") is None
WORKERS = [
    pytest.param(_env_worker, id="env"),
    pytest.param(
        _llm_worker,
        id="llm",
        marks=pytest.mark.skipif(_NO_TRANSFORMERS, reason="the llm extra is not installed"),
    ),
]


def _weights(worker: EnvCore | LLMCore) -> dict[str, torch.Tensor]:
    return worker.state_dict()["models"]["policy"]["weights"]


@pytest.mark.parametrize("make", WORKERS)
@pytest.mark.parametrize("version", [MAX_INT64 + 1, 2**64 - 1, -1, True])
def test_load_weights_raises_if_the_version_is_outside_int64(make, version) -> None:
    with make() as worker:
        with pytest.raises(WeightsError, match="policy version"):
            worker.models.load_weights("policy", version, _weights(worker))
        assert worker.models.policy_version("policy") == 0


@pytest.mark.parametrize("make", WORKERS)
def test_load_weights_raises_if_not_newer_or_not_finite(make) -> None:
    with make() as worker:
        weights = _weights(worker)
        assert worker.models.load_weights("policy", MAX_INT64, weights) == MAX_INT64
        with pytest.raises(StaleVersionError, match="not newer"):
            worker.models.load_weights("policy", MAX_INT64, weights)
        poisoned = dict(weights)
        key = next(k for k, v in poisoned.items() if v.is_floating_point())
        poisoned[key] = torch.full_like(poisoned[key], float("nan"))
        with pytest.raises(WeightsError):
            worker.models.validate("policy", poisoned)
        with pytest.raises(WeightsError, match="must be a mapping"):
            worker.models.validate("policy", [1, 2])


@pytest.mark.parametrize("make", WORKERS)
@pytest.mark.parametrize("key", ["frames", "batches", "traj_counter"])
@pytest.mark.parametrize("value", [MAX_INT64 + 1, -1, 1.5, None])
def test_load_state_dict_raises_if_a_counter_is_outside_int64(make, key, value) -> None:
    with make() as worker:
        state = worker.state_dict()
        before = (worker.frames, worker.batches)
        state[key] = value
        with pytest.raises(WeightsError, match=key):
            worker.load_state_dict(state)
        assert (worker.frames, worker.batches) == before


@pytest.mark.parametrize("make", WORKERS)
@pytest.mark.parametrize("key", ["frames", "batches"])
def test_load_state_dict_leaves_a_count_room_to_count_on(make, key) -> None:
    with make() as worker:
        state = worker.state_dict()
        for value in (2**53 + 1, MAX_INT64):
            with pytest.raises(WeightsError, match=f"{key}.*above"):
                worker.load_state_dict({**state, key: value})
        worker.load_state_dict({**state, key: 2**53})
        assert getattr(worker, key) == 2**53


@pytest.mark.parametrize("make", WORKERS)
def test_load_state_dict_refuses_an_older_version_unless_rolling_back(make) -> None:
    with make() as worker:
        old = worker.state_dict()
        worker.models.load_weights("policy", 5, _weights(worker))
        with pytest.raises(StaleVersionError, match="allow_rollback"):
            worker.load_state_dict(old)
        assert worker.load_state_dict(old, allow_rollback=True) == {"policy": (5, 0)}


@pytest.mark.parametrize("make", WORKERS)
def test_set_seed_takes_the_whole_uint64_range_and_nothing_beyond(make) -> None:
    with make() as worker:
        assert isinstance(worker.set_seed(MAX_SEED, static_seed=True), int)
        for bad in (MAX_SEED + 1, -1, True, 1.0):
            with pytest.raises(ValueError, match="seed must be an int in"):
                worker.set_seed(bad)


@pytest.mark.parametrize("make", WORKERS)
def test_load_state_dict_refuses_other_weights_under_the_version_in_force(make) -> None:
    with make() as worker:
        worker.models.load_weights("policy", 5, _weights(worker))
        same = worker.state_dict()
        assert worker.load_state_dict(same) == {"policy": (5, 5)}  # the same state: a no-op
        other = worker.state_dict()
        weights = other["models"]["policy"]["weights"]
        key = next(k for k, v in weights.items() if v.is_floating_point())
        weights.update({k: v + 1 for k, v in weights.items() if v.is_floating_point()})
        with pytest.raises(StaleVersionError, match="version in force, with other weights"):
            worker.load_state_dict(other)
        assert torch.equal(_weights(worker)[key], same["models"]["policy"]["weights"][key])
        assert worker.load_state_dict(other, allow_rollback=True) == {"policy": (5, 5)}
        assert torch.equal(_weights(worker)[key], weights[key])


@pytest.mark.parametrize("make", WORKERS)
def test_load_state_dict_takes_another_actors_first_weights_at_version_0(make) -> None:
    with make() as worker:
        other = worker.state_dict()  # version 0: the weights an actor built, its own
        weights = other["models"]["policy"]["weights"]
        weights.update({k: v + 1 for k, v in weights.items() if v.is_floating_point()})
        assert worker.load_state_dict(other) == {"policy": (0, 0)}


def test_check_seed_and_check_model_id_name_the_value() -> None:
    assert check_seed(0) == 0
    assert check_seed(MAX_SEED) == MAX_SEED
    with pytest.raises(ValueError, match=str(MAX_SEED + 1)):
        check_seed(MAX_SEED + 1)
    assert check_model_id("critic") == "critic"
    assert check_model_id("m" * MAX_MODEL_ID) == "m" * MAX_MODEL_ID
    assert check_model_id("critic-2.v1_a") == "critic-2.v1_a"
    for bad in ("", None, 3, "m" * (MAX_MODEL_ID + 1), "my model", ".hidden", "-x", "a/b", "é"):
        with pytest.raises(ValueError, match=f"model_id must be 1 to {MAX_MODEL_ID} letters"):
            check_model_id(bad)
