"""EnvCore: batches, settings, weights between steps, seeding, traj ids, backends."""

from __future__ import annotations

import pathlib
import threading
import time

import gymnasium
import pytest
import rlfleet_test_envs  # registers RlfleetScalar-v0
import torch
from helpers import process_gone
from tensordict import TensorDict
from tensordict.nn import set_interaction_type

import common
from actor_service._config import ActorConfig, ModelSpec
from actor_service._core._base import check_abandoned
from actor_service._core._frames import interaction_of
from actor_service._core._placement import PlacementError
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.env.core import EnvCore, derive_seed
from common.config import CollectSettings, ExplorationType
from common.errors import (
    ClosedError,
    EnvError,
    SessionStateError,
    UnknownModelError,
    WeightsError,
)

HERE = str(pathlib.Path(__file__).resolve().parents[2])  # the helpers of tests/actor_service
RANDOM_MODEL = (ModelSpec(factory="random"),)


@pytest.fixture(autouse=True)
def _test_factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(HERE)


def _worker(**overrides) -> EnvCore:
    fields = {"num_envs": 4, "seed": 0, **overrides}
    return EnvCore(ActorConfig(**fields))


def _collect(worker: EnvCore, frames: int = 64, **settings) -> TensorDict:
    worker.configure(CollectSettings(frames_per_batch=frames, **settings))
    return worker.collect_batch()


def _flag(batch: TensorDict, *key: str) -> torch.Tensor:
    return batch.get(key).squeeze(-1)


def test_rollout_worker_collects_a_cartpole_batch_of_the_configured_size() -> None:
    with _worker() as worker:
        batch = _collect(worker)
        assert isinstance(batch, TensorDict)
        assert batch.batch_size == torch.Size([4, 16])
        assert batch.names == [None, "time"]
        assert batch["action"].dtype == torch.int64
        assert batch["action"].sum(-1).eq(1).all()
        assert (worker.frames, worker.batches) == (64, 1)


def test_rollout_worker_links_steps_and_batches_like_torchrl() -> None:
    with _worker(models=RANDOM_MODEL) as worker:
        first, second = _collect(worker, 200), worker.collect_batch()
    done = _flag(first, "next", "done")
    assert done.any()  # 50 random CartPole steps always end an episode
    follows = (first["next", "observation"][:, :-1] == first["observation"][:, 1:]).all(-1)
    assert follows[~done[:, :-1]].all()
    assert not follows[done[:, :-1]].any()  # after a done comes a reset observation
    traj = first["collector", "traj_ids"]
    assert torch.equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    assert not first["done"].any()
    assert not first["terminated"].any()
    assert not first["truncated"].any()
    carried = (first["next", "observation"][:, -1] == second["observation"][:, 0]).all(-1)
    assert carried[~done[:, -1]].all()


@pytest.mark.parametrize(("frames", "num_envs"), [(30, 4), (0, 4), (-8, 4)])
def test_rollout_worker_configure_raises_if_frames_per_batch_is_not_a_multiple(
    frames: int, num_envs: int
) -> None:
    with _worker(num_envs=num_envs) as worker, pytest.raises(ValueError, match="frames_per_batch"):
        worker.configure(CollectSettings(frames_per_batch=frames))


def test_rollout_worker_configure_names_both_numbers() -> None:
    with _worker() as worker, pytest.raises(ValueError, match=r"frames_per_batch=30 .* num_envs=4"):
        worker.configure(CollectSettings(frames_per_batch=30))


def test_rollout_worker_configure_raises_if_model_unknown() -> None:
    with _worker() as worker, pytest.raises(UnknownModelError, match="critic"):
        worker.configure(CollectSettings(frames_per_batch=8, model_id="critic"))


def test_rollout_worker_collect_raises_if_not_configured_or_closed() -> None:
    worker = _worker()
    with pytest.raises(SessionStateError, match="configure"):
        worker.collect_batch()
    worker.configure(CollectSettings(frames_per_batch=8))
    worker.close()
    worker.close()  # idempotent
    with pytest.raises(SessionStateError, match="closed"):
        worker.collect_batch()


@pytest.mark.parametrize("worker_id", [-1, 65536])
def test_rollout_worker_raises_if_worker_id_out_of_range(worker_id: int) -> None:
    with pytest.raises(ValueError, match="worker_id"):
        _worker(worker_id=worker_id)


def test_rollout_worker_deterministic_exploration_acts_on_the_logits_mode() -> None:
    with _worker() as worker:
        batch = _collect(worker, 64, exploration_type=ExplorationType.DETERMINISTIC)
        observation = batch["observation"].reshape(-1, 4)
        with torch.no_grad(), set_interaction_type(interaction_of(ExplorationType.DETERMINISTIC)):
            _, action, _ = worker.models.act_compact("policy", observation)
        again = {"action": worker.models.action_codec.to_batch(action)}
    assert torch.equal(batch["action"].argmax(-1), batch["logits"].argmax(-1))
    assert torch.equal(again["action"].reshape(4, 16, 2), batch["action"])


def test_rollout_worker_records_the_pushed_version_on_later_frames() -> None:
    with _worker() as worker:
        assert _collect(worker)["policy_version"].eq(0).all()
        state = worker.models.module("policy").state_dict()
        worker.models.load_weights("policy", 5, {k: v + 0.1 for k, v in state.items()})
        batch = worker.collect_batch()
    assert batch["policy_version"].eq(5).all()
    assert batch["next", "policy_version"].eq(5).all()


def test_rollout_worker_swaps_weights_between_steps_and_tags_each_frame() -> None:
    model = ModelSpec(factory="rlfleet_test_policies:versioned_policy")
    with _worker(models=(model,)) as worker:
        worker.configure(CollectSettings(frames_per_batch=4 * 100))
        stop = threading.Event()

        def push() -> None:
            version = 0
            while not stop.is_set():
                version += 1
                value = torch.tensor(float(version))
                worker.models.load_weights(
                    "policy", version, {"module.a": value, "module.b": value}
                )

        pusher = threading.Thread(target=push)
        pusher.start()
        try:
            batch = worker.collect_batch()
        finally:
            stop.set()
            pusher.join()
    versions = batch["policy_version"].float()
    assert torch.equal(batch["weight_a"], batch["weight_b"])  # never half-applied
    assert torch.equal(batch["weight_a"], versions)  # the version is the one that acted
    assert versions[0, -1] > versions[0, 0]


def test_rollout_worker_acts_randomly_for_init_random_frames() -> None:
    with _worker() as worker:
        settings = {"exploration_type": ExplorationType.DETERMINISTIC, "init_random_frames": 64}
        random_batch, policy_batch = _collect(worker, 64, **settings), worker.collect_batch()
    assert random_batch["logits"].eq(0).all()
    assert not torch.equal(
        random_batch["action"][..., 0], random_batch["action"][:, :1, 0].expand(4, 16)
    )
    assert torch.equal(policy_batch["action"].argmax(-1), policy_batch["logits"].argmax(-1))
    assert policy_batch["logits"].ne(0).all()


def test_rollout_worker_counts_init_random_frames_per_session_not_per_life() -> None:
    # TorchRL counts init_random_frames with the collector's own frames: a new
    # session (a new collector) gets its random frames even on an actor that
    # already collected many.
    settings = {"exploration_type": ExplorationType.DETERMINISTIC, "init_random_frames": 64}
    with _worker() as worker:
        _collect(worker, 64)
        _collect(worker, 64)
        assert worker.frames == 128
        random_batch, policy_batch = _collect(worker, 64, **settings), worker.collect_batch()
    assert random_batch["logits"].eq(0).all()
    assert policy_batch["logits"].ne(0).all()


def test_rollout_worker_reset_at_each_iter_starts_new_trajectories() -> None:
    with _worker(models=RANDOM_MODEL) as worker:
        first = _collect(worker, 16, reset_at_each_iter=True)
        second = worker.collect_batch()
    old = set(first["collector", "traj_ids"].unique().tolist())
    assert not old & set(second["collector", "traj_ids"][:, 0].tolist())
    assert second["observation"][:, 0].abs().max() <= 0.05  # CartPole reset states


def test_rollout_worker_traj_ids_are_unique_across_workers() -> None:
    ids = []
    for worker_id in (1, 2):
        with _worker(worker_id=worker_id, models=RANDOM_MODEL) as worker:
            traj = _collect(worker, 200)["collector", "traj_ids"]
        assert (traj >> 47).eq(worker_id).all()
        assert ((traj >> 32) & 0x7FFF).eq(worker.epoch & 0x7FFF).all()
        ids.append(set(traj.unique().tolist()))
    assert not ids[0] & ids[1]


def test_rollout_worker_epoch_is_random_and_nonzero_even_when_seeded() -> None:
    with _worker() as one, _worker() as two:
        assert one.epoch != two.epoch
        assert 0 < one.epoch < 2**63


def test_rollout_worker_set_seed_reproduces_batches_and_chains_seeds() -> None:
    with _worker() as worker:
        next_seed = worker.set_seed(123)
        first = _collect(worker, 64, init_random_frames=32)
        assert worker.set_seed(123) == next_seed
        second = _collect(worker, 64, init_random_frames=32)  # a new session: random again
        assert worker.set_seed(123, static_seed=True) == 123
    expected = 123
    for _ in range(4):
        expected = derive_seed(expected)
    assert next_seed == expected
    for key in first.keys(include_nested=True, leaves_only=True):
        if key != ("collector", "traj_ids"):
            assert torch.equal(first[key], second[key]), key


def test_rollout_worker_truncates_at_max_frames_per_traj() -> None:
    with _worker(
        env_pool=EnvPoolSettings(env="Pendulum-v1"), num_envs=2, models=RANDOM_MODEL
    ) as worker:
        batch = _collect(worker, 20, max_frames_per_traj=3)
    count = _flag(batch, "step_count")
    assert count[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert torch.equal(_flag(batch, "next", "step_count"), count + 1)
    truncated = _flag(batch, "next", "truncated")
    assert torch.equal(truncated, count == 2)
    assert torch.equal(_flag(batch, "next", "done"), truncated)
    traj = batch["collector", "traj_ids"]
    assert torch.equal(traj[:, 1:] != traj[:, :-1], truncated[:, :-1])
    after = batch["observation"][:, 1:][truncated[:, :-1]]
    final = batch["next", "observation"][:, :-1][truncated[:, :-1]]
    assert not (after == final).all(-1).any()  # reset observations follow the cut


def test_rollout_worker_set_truncated_marks_the_last_frame_only() -> None:
    with _worker(
        env_pool=EnvPoolSettings(env="Pendulum-v1"), num_envs=2, models=RANDOM_MODEL
    ) as worker:
        batch = _collect(worker, 20, set_truncated=True)
        following = worker.collect_batch()
    truncated = _flag(batch, "next", "truncated")
    assert truncated[:, -1].all()
    assert not truncated[:, :-1].any()
    assert _flag(batch, "next", "done")[:, -1].all()
    assert torch.equal(
        following["collector", "traj_ids"][:, 0], batch["collector", "traj_ids"][:, -1]
    )


def test_rollout_worker_split_trajs_pads_trajectories_with_a_mask() -> None:
    with _worker(
        env_pool=EnvPoolSettings(env="Pendulum-v1"), num_envs=2, models=RANDOM_MODEL
    ) as worker:
        worker.set_seed(7)
        worker.configure(CollectSettings(frames_per_batch=20, max_frames_per_traj=3))
        plain = worker.collect_batch()
        worker.set_seed(7)
        worker.configure(
            CollectSettings(frames_per_batch=20, max_frames_per_traj=3, split_trajs=True)
        )
        split = worker.collect_batch()
    mask = split["collector", "mask"]
    assert split.batch_size == (8, 3)
    assert mask.sum(-1).tolist() == [3, 3, 3, 1] * 2
    assert torch.equal(split["observation"][mask], plain["observation"].reshape(20, 3))
    assert split["observation"][~mask].eq(0).all()


def test_rollout_worker_state_dict_round_trips_weights_versions_and_counters() -> None:
    with _worker() as source, _worker() as target:
        _collect(source)
        state = {k: v.clone() for k, v in source.models.module("policy").state_dict().items()}
        source.models.load_weights("policy", 4, {k: v * 2 for k, v in state.items()})
        saved = source.state_dict()
        target.load_state_dict(saved)
        assert (target.frames, target.batches) == (64, 1)
        assert target.models.policy_version("policy") == 4
        restored = target.models.module("policy").state_dict()
        assert all(torch.equal(restored[k], v * 2) for k, v in state.items())
        assert target.state_dict()["traj_counter"] > saved["traj_counter"]


def test_a_checkpoint_of_the_same_life_never_gives_a_trajectory_id_twice() -> None:
    """Loading an earlier checkpoint into the running actor keeps its counter: the ids it
    gave since the checkpoint are not given again (to other trajectories)."""
    with _worker() as worker:
        _collect(worker)
        saved = worker.state_dict()
        given = set(
            _collect(worker, max_frames_per_traj=2)["collector", "traj_ids"].unique().tolist()
        )
        worker.load_state_dict(saved)
        again = set(
            _collect(worker, max_frames_per_traj=2)["collector", "traj_ids"].unique().tolist()
        )
    assert given
    assert not given & again


def test_rollout_worker_load_state_dict_raises_and_changes_nothing_if_state_is_bad() -> None:
    with _worker() as worker:
        state = worker.state_dict()
        state["frames"] = 99
        first = next(iter(state["models"]["policy"]["weights"]))
        state["models"]["policy"]["weights"][first] = torch.zeros(1)
        with pytest.raises(WeightsError, match="shape mismatch"):
            worker.load_state_dict(state)
        with pytest.raises(WeightsError, match="frames"):
            worker.load_state_dict({**state, "frames": -1})
        assert worker.frames == 0


def test_rollout_worker_describes_itself() -> None:
    with _worker(worker_id=9, models=(ModelSpec(), ModelSpec("explorer", "random"))) as worker:
        description = worker.describe()
    assert (description.worker_id, description.epoch) == (9, worker.epoch)
    assert (description.env_id, description.num_slots, description.backend) == (
        "CartPole-v1",
        4,
        "sync",
    )
    assert description.models["explorer"] == (0, {})
    assert description.models["policy"][1] == worker.models.parameters_info("policy")
    assert description.software_version == common.__version__
    assert description.device == "cpu"
    assert description.action_space == worker.action_space


def test_rollout_worker_batches_multi_binary_and_multi_discrete_spaces() -> None:
    with _worker(
        env_pool=EnvPoolSettings(env_factory="rlfleet_test_envs:multi_env"), models=RANDOM_MODEL
    ) as worker:
        batch = _collect(worker, 40)
    assert (batch["observation"].dtype, batch["observation"].shape) == (torch.int8, (4, 10, 3))
    assert (batch["action"].dtype, batch["action"].shape) == (torch.int64, (4, 10, 2))
    assert batch["action"][..., 0].max() <= 2
    assert batch["action"][..., 1].max() <= 1
    assert batch["action"].min() >= 0
    # the env rewards the action it received: the compact index plus the space's start
    assert torch.equal(_flag(batch, "next", "reward"), batch["action"].sum(-1).float() + 1)
    assert _flag(batch, "next", "terminated")[:, 4].all()


def test_rollout_worker_rebuilds_the_pool_after_an_env_crash() -> None:
    rlfleet_test_envs._CRASHED["done"] = False
    with _worker(
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:crash_once_cartpole", env_kwargs={"steps": 5}
        )
    ) as worker:
        worker.configure(CollectSettings(frames_per_batch=40))
        with pytest.raises(EnvError, match="simulator crashed") as info:
            worker.collect_batch()
        batch = worker.collect_batch()
    assert info.value.exception_type == "RuntimeError"
    assert info.value.env == "rlfleet_test_envs:crash_once_cartpole"
    assert batch.batch_size == (4, 10)


def test_rollout_worker_raises_env_error_if_the_env_factory_fails_to_rebuild_the_pool() -> None:
    rlfleet_test_envs._UNBUILDABLE["crashed"] = False
    factory = "rlfleet_test_envs:unbuildable_after_crash_cartpole"
    with _worker(env_pool=EnvPoolSettings(env_factory=factory)) as worker:
        worker.configure(CollectSettings(frames_per_batch=40))
        with pytest.raises(EnvError, match="simulator crashed"):
            worker.collect_batch()
        for _ in range(2):  # the factory's failure, batch after batch: an env's, not a bug
            with pytest.raises(EnvError, match="licence server is unreachable") as info:
                worker.collect_batch()
            assert info.value.env == factory


def test_rollout_worker_rebuilds_the_pool_after_a_crash_if_an_envs_close_raises() -> None:
    factory = "rlfleet_test_envs:close_raising_crashing_cartpole"
    with _worker(env_pool=EnvPoolSettings(env_factory=factory, env_kwargs={"steps": 5})) as worker:
        worker.configure(CollectSettings(frames_per_batch=40))
        with pytest.raises(EnvError, match="simulator crashed"):
            worker.collect_batch()
        worker.configure(CollectSettings(frames_per_batch=16))  # 4 steps: before the crash
        assert worker.collect_batch().batch_size == (4, 4)  # on a rebuilt pool
    assert worker._pool.closed  # closed with the worker, though each env's close raised


def test_rollout_worker_async_backend_collects_and_close_reaps_subprocesses() -> None:
    worker = _worker(num_envs=2, env_pool=EnvPoolSettings(env_backend="async"), models=RANDOM_MODEL)
    pids = [p.pid for p in worker._pool.processes]
    batch = _collect(worker, 120, max_frames_per_traj=15)
    worker.close()
    assert batch.batch_size == (2, 60)
    assert all(process_gone(pid) for pid in pids)
    done = _flag(batch, "next", "done")
    assert _flag(batch, "next", "terminated").any()  # autoreset inside the subprocesses
    assert _flag(batch, "step_count").max() == 14  # and cuts with a masked reset
    follows = (batch["next", "observation"][:, :-1] == batch["observation"][:, 1:]).all(-1)
    assert torch.equal(follows, ~done[:, :-1])


def test_rollout_worker_raises_the_envs_timeout_if_an_async_env_hangs() -> None:
    worker = _worker(
        num_envs=2,
        env_pool=EnvPoolSettings(
            env_backend="async",
            step_timeout=0.3,
            env_factory="rlfleet_test_envs:hanging_cartpole",
            env_kwargs={"steps": 3},
        ),
    )
    pids = [p.pid for p in worker._pool.processes]
    worker.configure(CollectSettings(frames_per_batch=20))
    started = time.monotonic()
    with pytest.raises(EnvError, match="step_timeout") as raised:
        worker.collect_batch()
    assert raised.value.exception_type == "TimeoutError"
    assert time.monotonic() - started < 10.0
    worker.close()
    assert all(process_gone(pid) for pid in pids)


def test_rollout_worker_keeps_each_steps_outputs_when_the_policy_reuses_its_tensors() -> None:
    # The rollout copies a step's action and extras as it records them: a policy that
    # overwrites the tensors it returned (preallocated outputs, CUDA-graph replays) must
    # not rewrite the steps before.
    model = (ModelSpec(factory="rlfleet_test_policies:reused_output_policy"),)
    with _worker(models=model) as worker:
        batch = _collect(worker, 64)
    steps = batch["step"][0]
    assert steps.unique().numel() == 16  # one value per step, not the last step's everywhere
    assert torch.equal(steps, steps[0] + torch.arange(16.0))
    assert torch.equal(batch["action"].argmax(-1)[0], steps.long() % 2)
    assert torch.equal(batch["step"], steps.expand(4, 16))


def test_set_seed_resets_env_i_with_the_ith_link_of_the_seed_chain() -> None:
    # As TorchRL's env.set_seed: env 0 gets the seed itself, env i+1 derive_seed(env i's).
    with _worker(num_envs=3, models=RANDOM_MODEL) as worker:
        worker.set_seed(123)
        batch = _collect(worker, 3)
    seed = 123
    for env in range(3):
        expected, _ = gymnasium.make("CartPole-v1").reset(seed=seed)
        assert torch.equal(batch["observation"][env, 0], torch.from_numpy(expected)), env
        seed = derive_seed(seed)


def test_a_limit_an_episode_reaches_as_it_ends_resets_its_env_once() -> None:
    # RlfleetScalar episodes end at step 7; each reset draws its start from the env's
    # generator. A limit of 7 ends them where they end anyway: the same observations as
    # without a limit (a second reset would draw other starts), truncated as well.
    def collect(limit: int) -> TensorDict:
        with _worker(
            env_pool=EnvPoolSettings(env="RlfleetScalar-v0"), num_envs=2, models=RANDOM_MODEL
        ) as worker:
            worker.set_seed(5)
            return _collect(worker, 40, max_frames_per_traj=limit)

    limited, free = collect(7), collect(0)
    assert free["next", "terminated"].any()
    assert torch.equal(limited["observation"], free["observation"])
    assert torch.equal(limited["next", "observation"], free["next", "observation"])
    assert torch.equal(limited["next", "terminated"], free["next", "terminated"])
    assert torch.equal(limited["next", "truncated"], free["next", "terminated"])
    assert torch.equal(
        limited["collector", "traj_ids"] & 0xFFFF_FFFF, free["collector", "traj_ids"] & 0xFFFF_FFFF
    )


def test_a_new_session_right_after_seeding_keeps_the_seeded_reset() -> None:
    # A server calls start_anew as a new collector's session opens: envs just reset by
    # set_seed stay as they are (TorchRL's first batch after env.set_seed).
    with _worker(num_envs=2, models=RANDOM_MODEL) as worker:
        worker.set_seed(11)
        worker.start_anew()
        batch = _collect(worker, 2)
    expected, _ = gymnasium.make("CartPole-v1").reset(seed=11)
    assert torch.equal(batch["observation"][0, 0], torch.from_numpy(expected))


def test_a_new_session_after_collecting_starts_new_trajectories_from_resets() -> None:
    with _worker(models=RANDOM_MODEL) as worker:
        first = _collect(worker, 40)
        worker.start_anew()
        second = worker.collect_batch()
        assert not first["next", "done"][:, -1].all()  # trajectories were cut mid-episode
    old = set(first["collector", "traj_ids"].flatten().tolist())
    assert not old & set(second["collector", "traj_ids"][:, 0].tolist())
    assert second["observation"][:, 0].abs().max() <= 0.05  # CartPole reset states


def test_random_frames_carry_the_version_of_the_weights_in_force() -> None:
    with _worker(models=RANDOM_MODEL) as worker:
        worker.models.load_weights("policy", 5, {})
        batch = _collect(worker, 16, init_random_frames=16)
    assert batch["policy_version"].eq(5).all()
    assert batch["next", "policy_version"].eq(5).all()


def test_a_batch_the_policy_broke_mid_way_is_followed_by_reset_envs() -> None:
    # The envs stepped before the policy raised: the next batch must not continue from
    # the observations of the batch before (the envs moved on), but from resets.
    model = (ModelSpec(factory="rlfleet_test_policies:failing_policy"),)
    with _worker(models=model) as worker:
        first = _collect(worker, 16)
        worker.models.module("policy").module.fail_in = 3
        with pytest.raises(Exception, match="failed mid-batch"):
            worker.collect_batch()
        after = worker.collect_batch()
    assert not first["next", "done"][:, -1].any()
    old = set(first["collector", "traj_ids"].flatten().tolist())
    assert not old & set(after["collector", "traj_ids"][:, 0].tolist())
    assert after["observation"][:, 0].abs().max() <= 0.05  # CartPole reset states


def _offset_discrete_worker() -> EnvCore:
    return _worker(
        env_pool=EnvPoolSettings(env_factory="rlfleet_test_envs:offset_discrete_env"),
        num_envs=2,
    )


def test_an_actor_builds_on_discrete_observations_that_start_above_zero() -> None:
    # The policy is probed on placeholder observations before any step: they must lie in
    # the space (10..13 here), or the one-hot of one below the start fails the build.
    with _offset_discrete_worker() as worker:
        assert worker.observation_space == gymnasium.spaces.Discrete(4, start=10)
        assert worker.describe().models["policy"][0] == 0


def test_discrete_observations_that_start_above_zero_are_one_hot_from_their_start() -> None:
    # configure sized a batch by encoding zero observations, below the start: it raised
    with _offset_discrete_worker() as worker:
        batch = _collect(worker, 12)
    assert batch["observation"].shape == (2, 6, 4)
    assert batch["observation"][:, 0].argmax(-1).eq(0).all()  # 10, the reset state
    assert batch["observation"].sum(-1).eq(1).all()


def test_a_cut_at_max_frames_per_traj_resets_only_the_envs_it_cuts() -> None:
    # CartPole's episodes end at different steps, so its envs reach the limit at
    # different steps. Every frame not done must follow CartPole's dynamics from the
    # observation it holds (x' = x + 0.02 x_dot): an env reset behind its back breaks it.
    with _worker(models=RANDOM_MODEL) as worker:
        batch = _collect(worker, 400, max_frames_per_traj=20)
    cut = (batch["next", "truncated"] & ~batch["next", "terminated"]).squeeze(-1)
    done = batch["next", "done"].squeeze(-1)
    assert (cut.any(0) & (~done).any(0)).any()  # a cut while other envs go on
    obs, nxt = batch["observation"], batch["next", "observation"]
    expected = obs[..., 0] + 0.02 * obs[..., 1]
    assert torch.allclose(nxt[..., 0][~done], expected[~done], atol=1e-5)


@pytest.mark.parametrize("exploration", list(ExplorationType))
def test_each_exploration_type_sets_the_interaction_type_of_the_same_name(
    exploration: ExplorationType,
) -> None:
    assert interaction_of(exploration).name == exploration.name


def test_rollout_worker_force_close_leaves_every_later_call_raising_closed() -> None:
    worker = _worker()
    worker.configure(CollectSettings(frames_per_batch=8))
    worker.force_close()
    with pytest.raises(ClosedError):
        worker.collect_batch()
    with pytest.raises(ClosedError):
        worker.set_seed(1)
    worker.close()


def test_rollout_worker_is_closed_when_its_with_block_ends() -> None:
    with _worker() as worker:
        worker.configure(CollectSettings(frames_per_batch=8))
    with pytest.raises(ClosedError):
        worker.collect_batch()


def test_rollout_worker_seed_zero_is_a_seed_not_a_random_one() -> None:
    with _worker(seed=0) as first, _worker(seed=0) as second:
        first_obs = _collect(first)["observation"][:, 0]
        assert torch.equal(first_obs, _collect(second)["observation"][:, 0])


def test_rollout_worker_load_state_dict_keeps_the_32_bits_of_a_huge_trajectory_counter() -> None:
    with _worker() as worker:
        state = worker.state_dict()
        worker.load_state_dict({**state, "traj_counter": 2**62 + 5})
        assert worker.state_dict()["traj_counter"] < 2**32


def test_rollout_worker_load_state_dict_refuses_another_kinds_state_or_a_non_dict() -> None:
    with _worker() as worker:
        state = worker.state_dict()
        with pytest.raises(WeightsError, match="another kind of actor"):
            worker.load_state_dict({**state, "llm_slots": {}})
        with pytest.raises(WeightsError, match="must be a dict"):
            worker.load_state_dict([("frames", 0)])  # type: ignore[arg-type]
        assert worker.frames == 0


def test_an_abandoned_batch_raises_and_a_live_one_goes_on() -> None:
    abandon = threading.Event()
    check_abandoned(None, 1, 4)
    check_abandoned(abandon, 1, 4)
    abandon.set()
    with pytest.raises(SessionStateError, match="abandoned after 1 of 4 steps"):
        check_abandoned(abandon, 1, 4)


@pytest.mark.parametrize("asked", [{"policy_device": "meta"}, {"env_device": "meta"}])
def test_rollout_worker_refuses_a_session_asking_for_another_device(asked: dict) -> None:
    with _worker(worker_id=3) as worker, pytest.raises(PlacementError, match="actor 3 runs its"):
        worker.check(CollectSettings(frames_per_batch=8, **asked))
