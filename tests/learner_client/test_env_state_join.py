"""``learner_client._env_state``: the actors' pool states laid out as the script's env's, and
loaded all or nothing."""

from __future__ import annotations

import pytest
import torch

from common.env_state import env_has_state, quiet_fresh_vecnorm
from learner_client._env_state import joined_state, load_env_state, pool_size

pytest.importorskip("torchrl")
from torchrl.envs import (
    CatFrames,
    Compose,
    GymEnv,
    ObservationNorm,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    Transform,
    TransformedEnv,
    VecNorm,
)


class _Unbatched:
    batch_size = torch.Size([])


class _Batched:
    batch_size = torch.Size([4])


def test_pool_size_counts_workers_only_when_every_key_is_a_worker() -> None:
    assert pool_size({"worker0": {}, "worker1": {}}) == 2
    assert pool_size({"worker0": {}, "transforms.0.loc": 1}) is None
    assert pool_size({"loc": 1}) is None
    assert pool_size({}) is None


def test_one_actors_pool_gives_an_unbatched_env_its_first_envs_state() -> None:
    pool = {"worker0": {"loc": 0}, "worker1": {"loc": 1}}
    assert joined_state([pool], _Unbatched()) == {"loc": 0}
    assert joined_state([pool], _Batched()) == pool  # a batched env takes the pool whole


def test_a_state_that_is_not_a_pools_is_taken_as_it_is() -> None:
    mixed = {"worker0": {"loc": 0}, "loc": 5}
    assert joined_state([mixed], _Unbatched()) == mixed
    assert joined_state([mixed, {"worker0": {"loc": 1}}], _Batched()) == mixed


def test_several_actors_envs_are_joined_in_numeric_worker_order() -> None:
    first = {f"worker{i}": {"n": i} for i in range(12)}  # worker10 sorts before worker2 as text
    second = {"worker1": {"n": 101}, "worker0": {"n": 100}}
    joined = joined_state([first, second], _Batched())
    assert list(joined) == [f"worker{i}" for i in range(14)]
    assert [v["n"] for v in joined.values()] == [*range(12), 100, 101]


def _vecnorm_env() -> TransformedEnv:
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(VecNorm(in_keys=["observation"])))


def test_a_state_of_other_transforms_is_refused_and_nothing_is_loaded() -> None:
    stepped = _vecnorm_env()
    stepped.rollout(5)
    state = stepped.state_dict()
    env = TransformedEnv(GymEnv("Pendulum-v1"), Compose(RewardSum()))
    with pytest.raises((KeyError, RuntimeError)):
        load_env_state(env, state)
    fresh = _vecnorm_env()
    load_env_state(fresh, state)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(fresh.state_dict()[key], value), key


def _stacked_env() -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1"), CatFrames(N=4, dim=-1, in_keys=["observation"]))


@pytest.mark.parametrize("started", [False, True], ids=["never-started", "started"])
def test_a_serial_env_that_never_stepped_takes_the_buffers_its_envs_build_at_their_first_step(
    started: bool,
) -> None:
    """A script's ``SerialEnv`` of ``CatFrames`` envs takes a state of as many envs: each env's
    frames buffer, built at its first step, is made in the state's shape and loaded."""
    stepped = SerialEnv(2, _stacked_env)
    stepped.rollout(3)
    state = stepped.state_dict()
    env = SerialEnv(2, _stacked_env)
    if started:
        env.start()
    try:
        load_env_state(env, state)
        loaded = env.state_dict()
        for worker, entries in state.items():
            for key, value in entries.items():
                assert torch.equal(loaded[worker][key], value), (worker, key)
    finally:
        env.close(raise_if_closed=False)
        stepped.close()


@pytest.mark.long
def test_a_parallel_env_that_never_started_takes_the_state_and_its_workers_live() -> None:
    """A script's ``ParallelEnv`` of ``CatFrames`` envs, never started: asking whether it has
    state starts no worker, and the load resets it (its workers build their frames buffers,
    and would die on a state read before that), loads the state and leaves it stepping."""
    stepped = SerialEnv(1, _stacked_env)
    stepped.rollout(3)
    state = stepped.state_dict()
    env = ParallelEnv(1, _stacked_env, mp_start_method="spawn")
    try:
        assert env_has_state(env)
        assert env.is_closed
        load_env_state(env, state)
        loaded = env.state_dict()
        for key, value in state["worker0"].items():
            assert torch.equal(loaded["worker0"][key], value), key
        assert env.rollout(2).batch_size == (1, 2)
    finally:
        env.close(raise_if_closed=False)
        stepped.close()


def _normed_env() -> TransformedEnv:
    normed = ObservationNorm(loc=torch.zeros(3), scale=torch.ones(3), in_keys=["observation"])
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(VecNorm(in_keys=["observation"]), normed))


def test_a_state_that_fits_in_part_leaves_the_env_as_it_was() -> None:
    """torch loads every entry that fits before it raises for the others: an entry too many
    or one of another shape beside VecNorm's and ObservationNorm's statistics loads none."""
    stepped = _normed_env()
    stepped.rollout(5)
    stepped.transform[1].loc.fill_(5.0)
    state = dict(stepped.state_dict())
    scale = next(k for k in state if k.endswith(".scale") and state[k].shape == (3,))
    for bad in (
        {**state, "transform.9.loc": torch.zeros(3)},
        {**state, scale: torch.ones(7)},
    ):
        env = _normed_env()
        env.rollout(2)
        before = _tensors(env)
        with pytest.raises(RuntimeError):
            load_env_state(env, bad)
        now = _tensors(env)
        assert now.keys() == before.keys()
        assert all(torch.equal(now[k], v) for k, v in before.items()), "half loaded"
    env = _normed_env()
    load_env_state(env, state)
    assert torch.equal(env.transform[1].loc, torch.full((3,), 5.0))


class _WithNet(Transform):
    """A transform holding a network (the learner's: never loaded from an actor's state)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 3)


def _net_env() -> TransformedEnv:
    return TransformedEnv(
        GymEnv("Pendulum-v1"), Compose(VecNorm(in_keys=["observation"]), _WithNet())
    )


def test_an_env_with_weights_refuses_a_state_with_an_entry_too_many_or_too_few() -> None:
    stepped = _net_env()
    stepped.rollout(5)
    state = dict(stepped.state_dict())
    env = _net_env()
    before = _tensors(env)
    extra = {**state, "transform.9.loc": torch.zeros(3)}
    dropped = next(k for k in state if ".net." not in k)  # VecNorm's, not the network's
    short = {k: v for k, v in state.items() if k != dropped}
    for bad, word in ((extra, "unexpected"), (short, "missing")):
        with pytest.raises(KeyError, match=f"the env states differ.*{word} \\['"):
            load_env_state(env, bad)
        now = _tensors(env)
        assert now.keys() == before.keys()
        assert all(torch.equal(now[k], v) for k, v in before.items())  # nothing loaded
    load_env_state(env, state)
    weight = env.transform[1].net.weight
    assert not torch.equal(weight, stepped.transform[1].net.weight)  # the learner's kept


def _tensors(env: TransformedEnv) -> dict[str, torch.Tensor]:
    with quiet_fresh_vecnorm():
        state = env.state_dict()
    return {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
