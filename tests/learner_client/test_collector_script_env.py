"""``create_env_fn`` given as the script's own TorchRL env, as TorchRL's scripts pass it.

``ppo_mujoco.py``, ``sac.py``, ``mappo_ippo.py`` and ``coding_ppo.py`` hand their env
object to ``Collector``: the collector must read it without calling it (an ``EnvBase``
call is ``forward``, which raises) or closing it (the script goes on using it), and a
script that reads the env's state (``VecNorm``'s statistics, for its checkpoints) must find
what the actors' envs hold. Real ``--kind torchrl`` actors on loopback.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDictBase

pytest.importorskip("torchrl")
import rlfleet_test_torchrl  # the actors' own factories (on the path learner_fleet sets)
from learner_fleet import ACTOR_ENV, start_actors
from torchrl.data import LazyTensorStorage, ReplayBuffer

from learner_client import GrpcCollector

# The warning of a fleet stepping another number of envs than the script's env.
LAYOUT_WARNING = r"TorchRL's collector would give .* LocalFleet\(1, num_envs=1"

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def vecnorm_actors() -> Iterator[list[str]]:
    yield from _two_actors("rlfleet_test_torchrl:normalized_pendulum")


def _two_actors(factory: str) -> Iterator[list[str]]:
    """Two TorchRL actors of one env each from ``factory``, seeds 0 and 1."""
    base = ["--kind", "torchrl", "--env-factory", factory]
    args = [[*base, "--worker-id", str(w), "--num-envs", "1", "--seed", str(w)] for w in range(2)]
    actors = start_actors(args, env=ACTOR_ENV)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


def _vecnorm_count(env: object) -> float:
    return _vecnorm_count_of_state(env.state_dict())  # type: ignore[attr-defined]


def _leaves(state: object, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        return [(prefix, state)]
    items = state.items() if hasattr(state, "items") else []  # type: ignore[union-attr]
    return [leaf for k, v in items for leaf in _leaves(v, f"{prefix}.{k}")]


def test_collector_reads_the_scripts_env_without_calling_or_closing_it(
    vecnorm_actors: list[str],
) -> None:
    env = rlfleet_test_torchrl.normalized_pendulum()
    with (
        pytest.warns(UserWarning, match=LAYOUT_WARNING),
        GrpcCollector(
            vecnorm_actors, create_env_fn=env, frames_per_batch=32, total_frames=64, sync=True
        ) as collector,
    ):
        for _ in collector:
            pass
    assert not env.is_closed
    assert env.rollout(3).batch_size == (3,)  # still the script's, usable


@pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning")  # its subject is another
def test_torchrl_accessors_read_the_learners_buffer_policy_and_env(
    vecnorm_actors: list[str],
) -> None:
    """What TorchRL's Trainer and scripts call: getattr_rb/_env/_policy, env, iterator."""
    env = rlfleet_test_torchrl.normalized_pendulum()
    policy = torch.nn.Identity()  # the actors act at random: a module without weights
    policy.tag = "learner's"
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    with GrpcCollector(
        vecnorm_actors,
        create_env_fn=env,
        frames_per_batch=32,
        total_frames=64,
        sync=True,
        replay_buffer=rb,
        policy=policy,
        push_policy_changes=False,
    ) as collector:
        assert collector.env is env
        assert collector.getattr_env("action_spec") is env.action_spec
        assert collector.getattr_policy("tag") == "learner's"
        assert list(collector.iterator()) == [None, None]
        assert collector.getattr_rb("write_count") == rb.write_count == 64
        assert collector.get_policy_version() == collector.policy_version
        collector.shutdown(close_env=False, raise_on_error=False)
    assert not env.is_closed  # the script's env stays the script's
    with GrpcCollector(vecnorm_actors, frames_per_batch=32) as bare:
        with pytest.raises(AttributeError, match="create_env_fn="):
            bare.getattr_env("action_spec")
        with pytest.raises(AttributeError, match="policy="):
            bare.getattr_policy("tag")
        with pytest.raises(AttributeError, match="no replay_buffer"):
            bare.getattr_rb("write_count")
        bare.async_shutdown(close_env=True)


@pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning")  # its subject is another
def test_collector_scripts_env_follows_the_actors_vecnorm_state(
    vecnorm_actors: list[str],
) -> None:
    env = rlfleet_test_torchrl.normalized_pendulum()
    env.rollout(2)  # VecNorm initialised here, with 2 frames (3 with the reset) of its own
    before = _vecnorm_count(env)
    with GrpcCollector(
        vecnorm_actors, create_env_fn=env, frames_per_batch=32, total_frames=64, sync=True
    ) as collector:
        counts = []
        for _ in collector:
            counts.append(_vecnorm_count(env))
            actor = collector.actor_state(collector.worker_ids[0])
            assert counts[-1] == _vecnorm_count_of_state(actor["env"])
    assert counts[0] > before
    assert counts[1] > counts[0]  # each batch brings the actor's statistics


def test_a_scripts_env_of_several_actors_envs_follows_each_of_them(
    vecnorm_actors: list[str],
) -> None:
    """A script's ``SerialEnv(2)`` against two actors of one env each: its env ``i`` holds
    actor ``i``'s statistics, as the batch's row ``i`` came from it (TorchRL's
    ``ParallelEnv(2)`` layout). A ``SerialEnv(3)`` fits no fleet of two envs: nothing of it
    is loaded, not two of its three envs, and a UserWarning names both."""
    from torchrl.envs import SerialEnv

    env = SerialEnv(2, single_env_factory)
    with GrpcCollector(
        vecnorm_actors, create_env_fn=env, frames_per_batch=32, total_frames=64, sync=True
    ) as collector:
        for _ in collector:
            for index, worker_id in enumerate(collector.worker_ids):
                actor = collector.actor_state(worker_id)["env"]["worker0"]
                mine = env.state_dict()[f"worker{index}"]
                assert _vecnorm_count_of_state(mine) == _vecnorm_count_of_state(actor)
                assert _vecnorm_count_of_state(mine) > 0
    three = SerialEnv(3, single_env_factory)
    with (
        pytest.warns(
            UserWarning, match=r"no longer follows .* state holds 2 envs, create_env_fn's env 3"
        ),
        pytest.warns(UserWarning, match="the fleet steps 2 envs per batch"),
        GrpcCollector(
            vecnorm_actors, create_env_fn=three, frames_per_batch=32, sync=True
        ) as collector,
    ):
        collector.next()
    assert [_vecnorm_count_of_state(s) for s in three.state_dict().values()] == [0.0] * 3


def _vecnorm_count_of_state(state: object) -> float:
    """Frames VecNorm has seen (its ``count`` entry, as ``VecNorm(new_api=True)`` names it)."""
    (count,) = [v for k, v in _leaves(state) if "count" in k]
    return float(count.sum())


@pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning")  # its subject is another
def test_collector_does_not_follow_an_env_constructor_or_a_stateless_env(
    vecnorm_actors: list[str],
) -> None:
    built = []

    def make() -> object:
        built.append(rlfleet_test_torchrl.normalized_pendulum())
        return built[-1]

    with GrpcCollector(
        vecnorm_actors, create_env_fn=make, frames_per_batch=32, sync=True
    ) as collector:
        collector.next()
        assert collector._env is not None
        assert not collector._env.followed  # checked once, nothing to follow
    assert built[0].is_closed  # an env it built for the check is its own to close


def test_a_multi_worker_scripts_per_worker_env_kwargs_build_the_first_workers_env(
    vecnorm_actors: list[str],
) -> None:
    """MultiSyncCollector's ``create_env_kwargs`` is a list, one per worker (it raised a
    dict-update error): the first worker's build the env read, as its first env is."""
    tags = []

    def make(tag: int) -> object:
        tags.append(tag)
        return rlfleet_test_torchrl.normalized_pendulum()

    with GrpcCollector(
        vecnorm_actors,
        create_env_fn=[make, make],
        create_env_kwargs=[{"tag": 1}, {"tag": 2}],
        frames_per_batch=32,
        sync=True,
    ) as collector:
        assert collector.next().numel() == 32
    assert tags == [1]


class _Recorder:
    """A replay buffer that records what it is extended with."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def extend(self, data: TensorDictBase) -> None:
        self.shapes.append(tuple(data.batch_size))


def test_collector_batches_take_the_scripts_env_layout(vecnorm_actors: list[str]) -> None:
    from torchrl.envs import SerialEnv

    single = rlfleet_test_torchrl.normalized_pendulum()
    assert single.batch_size == ()
    shapes = {}
    for name, env in (("single", single), ("serial", SerialEnv(2, single_env_factory))):
        # a fleet of 2 envs for a script of 1: warned once, naming both layouts and the knob
        warned = pytest.warns(UserWarning, match=LAYOUT_WARNING)
        with (
            warned if name == "single" else contextlib.nullcontext(),
            GrpcCollector(
                vecnorm_actors, create_env_fn=env, frames_per_batch=32, total_frames=32, sync=True
            ) as collector,
        ):
            batch = collector.next()
            shapes[name] = tuple(batch.batch_size)
            assert batch.names[-1] == "time"  # reshaped or not, as TorchRL names its batches
        if name == "single":
            assert len(warned) == 1
            assert "[2, 1, 16]" in str(warned[0].message)
            assert "[16]" in str(warned[0].message)
        assert set(collector.worker_ids) == {0, 1}
    # Two actors of one env each: TorchRL's [2, T] for the script's 2 envs; the fleet's
    # [actors, envs, T] for a script of one env, which two actors cannot give its [T].
    assert shapes == {"serial": (2, 16), "single": (2, 1, 16)}
    buffer = _Recorder()
    with GrpcCollector(
        vecnorm_actors,
        create_env_fn=single,
        replay_buffer=buffer,
        frames_per_batch=32,
        total_frames=32,
        sync=True,
    ) as collector:
        assert list(collector) == [None]
    assert buffer.shapes == [(16,), (16,)]  # each actor's part is one env's [T], as TorchRL's


def test_split_batches_stay_trajectories_by_time_whatever_the_scripts_env(
    vecnorm_actors: list[str],
) -> None:
    env = rlfleet_test_torchrl.normalized_pendulum()  # one env, as the one actor steps
    shapes = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layout warning: the rows are trajectories
        for max_steps in (-1, 10):
            with GrpcCollector(
                vecnorm_actors[:1],
                create_env_fn=env,
                frames_per_batch=32,
                total_frames=32,
                max_frames_per_traj=max_steps,
                split_trajs=True,
                sync=True,
            ) as collector:
                batch = collector.next()
            assert batch["collector", "mask"].shape == batch.batch_size
            shapes.append(tuple(batch.batch_size))
    assert shapes == [(1, 32), (4, 10)]  # TorchRL's [n_traj, T_max], one trajectory or four


def single_env_factory() -> object:
    return rlfleet_test_torchrl.normalized_pendulum()


@pytest.fixture
def string_actors() -> Iterator[list[str]]:
    yield from _two_actors("rlfleet_test_torchrl:string_counting")


def test_text_keys_take_the_scripts_env_layout_too(string_actors: list[str]) -> None:
    # [actors=2, envs=1, T] becomes the SerialEnv's [2, T]: a NonTensorStack included, row
    # for row (tensordict's reshape alone leaves it [2, 1, T] when a unit dimension goes).
    from torchrl.envs import SerialEnv

    env = SerialEnv(2, rlfleet_test_torchrl.string_counting)
    with GrpcCollector(
        string_actors, create_env_fn=env, frames_per_batch=8, total_frames=8, sync=True
    ) as collector:
        batch = collector.next()
    assert tuple(batch.batch_size) == (2, 4)
    for key in ("string", ("next", "string")):
        text = batch.get(key)
        assert tuple(text.batch_size) == (2, 4), key
        rows = text.tolist()
        assert [len(row) for row in rows] == [4, 4]
        assert all(isinstance(item, str) for row in rows for item in row)
        # each row is one actor's trajectory: its text is that step's, as the actor sent it
        assert rows[1][2] == batch[1, 2][key]


def test_a_scripts_env_of_heterogeneous_agents_is_refused_naming_the_fix(
    vecnorm_actors: list[str],
) -> None:
    """TorchRL's Collector takes lazy-stacked agent groups; the fleet's dense batches cannot
    hold them: the collector says so as the actors do, not with tensordict's stacking error."""
    env = rlfleet_test_torchrl.heterogeneous_counting()
    with pytest.raises(ValueError, match="agents of different shapes under 'lazy'") as refused:
        GrpcCollector(vecnorm_actors, create_env_fn=env, frames_per_batch=32, sync=True)
    assert "a group of its own" in str(refused.value)


def test_a_scripts_env_of_a_varying_shape_is_refused_naming_the_fix(
    vecnorm_actors: list[str],
) -> None:
    """TorchRL lazy-stacks an entry whose spec has a -1 dim; the fleet refuses it as its actors
    do, before any batch."""
    env = rlfleet_test_torchrl.dynamic_spec()
    with pytest.raises(ValueError, match="varying shape under 'observation'") as refused:
        GrpcCollector(vecnorm_actors, create_env_fn=env, frames_per_batch=32, sync=True)
    assert "pad them to one shape" in str(refused.value)
