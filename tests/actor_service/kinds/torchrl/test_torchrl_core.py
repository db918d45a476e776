"""The TorchRL-env actor (``kind="torchrl"``) against TorchRL 0.14.1's own ``Collector``.

The parity tests run a real actor server on loopback and a real learner
(``GrpcCollector``), and TorchRL's ``Collector`` on the same env factory, policy factory
and seed: the batches must be equal but for what rlfleet adds (``torchrl_harness``).
The other tests drive a :class:`TorchRLCore` directly.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("torchrl")
import rlfleet_test_envs
import rlfleet_test_torchrl as factories
from actor_harness import RawCollect, open_request
from torchrl.envs import SerialEnv
from torchrl_harness import (
    TRAJ_IDS,
    any_done,
    assert_equal_batches,
    fleet_batches,
    torchrl_batches,
    torchrl_config,
)

from actor_service import ActorConfig, ModelSpec, create_server
from actor_service._core._settings import EnvPoolSettings
from actor_service._core._state import decode_state
from actor_service._kinds.torchrl.batch import flat_state
from actor_service._kinds.torchrl.core import TorchRLCore
from actor_service._kinds.torchrl.pool import check_torchrl_config
from common.config import CollectSettings
from common.errors import EnvError, StaleVersionError, UnknownWorkerError, WeightsError
from common.packets import decode_packet, encode_packet
from common.packets.folding import FoldedBatch
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import GrpcCollector


def _config(env: str = "cartpole", policy: str = "greedy_policy", **overrides: Any) -> ActorConfig:
    return torchrl_config(env, policy, **overrides)


@pytest.mark.parametrize(
    ("env", "policy", "settings"),
    [
        ("cartpole", "greedy_policy", {}),
        ("cartpole", "sampling_policy", {}),
        ("cartpole", "sampling_policy", {"init_random_frames": 60}),
        ("cartpole", "greedy_policy", {"set_truncated": True, "reset_at_each_iter": True}),
        ("stacked_cartpole", "greedy_policy", {}),
        ("stacked_cartpole", "sampling_policy", {"max_frames_per_traj": 7}),
        ("stacked_cartpole", "sampling_policy", {"split_trajs": True}),
        ("pendulum", "ou_policy", {}),
        ("pendulum", "batch_norm_policy", {}),
        ("lstm_cartpole", "lstm_policy", {}),
        ("categorical_cartpole", "egreedy_policy", {}),
        ("nested_counting", "random", {}),
        ("crowded_counting", "random", {}),
        ("counting", "random", {}),
        # CountingEnv has no truncated key: the collector's StepCounter adds one (TorchRL's
        # test_collector.py runs it so); the first frame must hold it too.
        ("counting", "random", {"max_frames_per_traj": 3}),
        ("counting", "random", {"max_frames_per_traj": 3, "split_trajs": True}),
        # ... and that truncated key is the one set_truncated marks (TorchRL takes it so).
        ("counting", "random", {"max_frames_per_traj": 3, "set_truncated": True}),
        ("multi_key_counting", "random", {}),
        ("end_of_life_cartpole", "sampling_policy", {}),
        ("normalized_pendulum", "batch_norm_policy", {"max_frames_per_traj": 20}),
    ],
    ids=[
        "greedy",
        "probabilistic",
        "init-random-frames",
        "truncated-reset",
        "folded",
        "max-frames-per-traj",
        "split-trajs",
        "ou-noise",
        "batch-norm",
        "lstm",
        "qvalue-egreedy",
        "nested-keys",
        "nested-keys-folded",
        "counting",
        "counting-max-frames-per-traj",
        "counting-max-frames-per-traj-split",
        "counting-max-frames-per-traj-set-truncated",
        "multi-key",
        "end-of-life",
        "vecnorm",
    ],
)
def test_torchrl_actor_batches_equal_torchrl_collector_batches(
    env: str, policy: str, settings: dict[str, Any]
) -> None:
    ours = fleet_batches(_config(env, policy), 2, **settings)
    theirs = torchrl_batches(env, policy, 2, **settings)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference, split=settings.get("split_trajs", False))
    assert any_done(ours), "an episode must end for the check to mean something"


@pytest.mark.parametrize(
    ("env", "policy"),
    [("cartpole", "sampling_policy"), ("pendulum", "ou_policy")],
    ids=["probabilistic", "ou-noise"],
)
def test_one_env_is_stepped_as_it_is_as_torchrl_collector_steps_it(env: str, policy: str) -> None:
    # TorchRL's Collector on the env itself, no SerialEnv of one around it: the policy
    # sees the env's unbatched steps; the fleet's batch is that batch as [1, T].
    with TorchRLCore(_config(env, policy, num_envs=1)) as core:
        assert core._pool.batch_size == ()
    ours = fleet_batches(_config(env, policy, num_envs=1), 2)
    theirs = torchrl_batches(env, policy, 2, num_envs=None)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.batch_size == (1, 60)
        assert_equal_batches(mine, reference.unsqueeze(0))
    assert any_done(ours), "an episode must end for the check to mean something"


@pytest.mark.parametrize("num_envs", [None, 2], ids=["one-env", "two-envs"])
def test_vecnorm_statistics_start_as_torchrls_whatever_the_probe_step_saw(
    num_envs: int | None,
) -> None:
    """The actor's probe step (an unseeded reset and a step) moved ``VecNorm``'s counts and
    means: the envs start anew, so the first normalised frames equal TorchRL's."""
    kwargs = {"max_steps": 20}
    config = _config(
        "vecnorm_v1_pendulum", "linear_policy", env_kwargs=kwargs, num_envs=num_envs or 1
    )
    with TorchRLCore(config) as core:  # one reset per env, as TorchRL's collector
        counts = [v for k, v in flat_state(core.state_dict()["env"]).items() if "count" in k]
        assert counts
        assert all(int(c.max()) == 1 for c in counts), counts
    ours = fleet_batches(config, 2)
    theirs = torchrl_batches(
        "vecnorm_v1_pendulum", "linear_policy", 2, num_envs=num_envs, env_kwargs=kwargs
    )
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference if num_envs else reference.unsqueeze(0))
    assert any_done(ours), "an episode must end for the check to mean something"


def test_torchrl_actor_carries_end_of_life_and_lives_as_torchrl_sets_them() -> None:
    (batch,) = fleet_batches(_config("end_of_life_cartpole", "sampling_policy"), 1)
    lost = batch["next", "end-of-life"].squeeze(-1)
    lives = batch["next", "lives"]
    assert lost.dtype == torch.bool
    assert lives.dtype == torch.int64
    assert lost.any(), "a life must be lost for the check to mean something"
    # a life is lost on the step where ``lives`` drops, and only there
    assert (lost == (lives < batch["lives"])).all()


def test_torchrl_actor_carries_string_keys_as_non_tensor_stacks() -> None:
    (batch,) = fleet_batches(_config("string_counting", "random"), 1, frames_per_batch=8)
    texts = [list(row) for row in batch["next", "string"]]  # a NonTensorStack's data
    assert len(texts) == 2
    assert all(len(row) == 4 for row in texts)
    assert all(isinstance(text, str) and text for row in texts for text in row)
    assert [list(row)[1:] for row in batch["string"]] == [row[:-1] for row in texts]


def test_torchrl_core_trajectory_ids_are_fleet_unique_and_renewed_at_episode_ends() -> None:
    with TorchRLCore(_config(policy="sampling_policy", worker_id=7)) as core:
        core.configure(CollectSettings(frames_per_batch=100))
        batch = core.collect_batch()
    assert isinstance(batch, TensorDict)
    ids, done = batch.get(TRAJ_IDS), batch["next", "done"].squeeze(-1)
    assert done.any()
    assert ((ids >> 47) == 7).all()
    assert torch.equal(ids[:, 1:] != ids[:, :-1], done[:, :-1])
    assert ids.unique().numel() == 2 + int(done[:, :-1].sum())


def test_torchrl_core_push_swaps_weights_and_buffers_between_steps() -> None:
    with TorchRLCore(_config()) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        module = core.models.module("policy")
        state = {k: v.clone() for k, v in module.state_dict().items()}
        assert "module.offset" in state  # buffers travel with the weights
        state["module.offset"] = torch.tensor([0.0, 1e6])
        assert core.models.load_weights("policy", 3, state) == 3
        batch = core.collect_batch()
        assert isinstance(batch, TensorDict)
        assert (batch["action"].argmax(-1) == 1).all()
        assert (batch["policy_version"] == 3).all()
        assert (batch["next", "policy_version"] == 3).all()
        with pytest.raises(StaleVersionError):
            core.models.load_weights("policy", 3, state)
        with pytest.raises(WeightsError, match="offset"):
            core.models.load_weights("policy", 4, state | {"module.offset": torch.zeros(3)})


def test_torchrl_core_push_reaches_a_buffer_the_forward_replaces() -> None:
    """``self.calls = self.calls + 1``: the push lands in the tensor the module holds now."""
    with TorchRLCore(_config(policy="counting_greedy_policy")) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        core.collect_batch()
        module = core.models.module("policy")
        state = {k: v.clone() for k, v in module.state_dict().items()}
        counted = int(state["module.calls"])
        assert counted >= 10  # the probe step's and the batch's calls
        state["module.calls"] = torch.tensor(1000)
        state["module.offset"] = torch.tensor([0.0, 1e6])
        core.models.load_weights("policy", 1, state)
        batch = core.collect_batch()
        assert (batch["action"].argmax(-1) == 1).all()
        assert int(module.module.calls) == 1000 + 10  # counted on from the pushed value
        held = core.state_dict()["models"]["policy"]["weights"]
        assert int(held["module.calls"]) == 1010


def test_torchrl_core_sizes_a_lazy_policy_before_it_takes_pushes() -> None:
    """TorchRL's ``MLP(out_features=2, num_cells=[8])`` (no ``in_features``) as a policy."""
    with TorchRLCore(_config(policy="lazy_policy")) as core:
        module = core.models.module("policy")
        shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        assert shapes["module.0.module.0.weight"] == (8, 4)
        state = {k: torch.zeros(shape) for k, shape in shapes.items()}
        state["module.0.module.2.bias"] = torch.tensor([0.0, 50.0])
        core.models.load_weights("policy", 1, state)
        core.configure(CollectSettings(frames_per_batch=20))
        batch = core.collect_batch()
        assert (batch["action"].argmax(-1) == 1).all()


def test_torchrl_core_collects_an_output_of_one_element_with_stride_0() -> None:
    """One env, ``log_std.exp().expand(1, 1)``: torch calls it contiguous; no byte view takes it."""
    with TorchRLCore(_config(policy="shared_scale_policy", num_envs=1)) as core:
        core.configure(CollectSettings(frames_per_batch=4))
        batch = core.collect_batch()
        assert isinstance(batch, TensorDict)
        assert batch["scale"].shape[-1] == 1
        assert bool((batch["scale"] == 1).all())
        scale = torch.ones(()).expand(1)  # what the policy outputs for one env
        assert scale.is_contiguous()
        assert scale.stride() == (0,)
        decoded = decode_packet(encode_packet(TensorDict(scale=scale)).tobytes())
        assert torch.equal(decoded["scale"], scale)


def test_torchrl_core_seed_chains_like_torchrl_and_repeats_batches() -> None:
    pool = SerialEnv(2, factories.cartpole)
    expected = pool.set_seed(5)
    pool.close()
    batches = []
    for _ in range(2):
        with TorchRLCore(_config(policy="sampling_policy")) as core:
            assert core.set_seed(5) == expected
            core.configure(CollectSettings(frames_per_batch=20))
            batches.append(core.collect_batch())
    for key in ("action", "observation", ("next", "episode_reward")):
        assert torch.equal(batches[0][key], batches[1][key]), key


def test_torchrl_core_seed_fixes_the_policy_initial_weights() -> None:
    # The seed fixes model initialisation too (a factory that does not seed itself): two
    # actors of one seed start with one policy, whatever the random state was before.
    weights = []
    for drawn in range(2):
        torch.manual_seed(drawn)
        with TorchRLCore(_config(policy="counting_greedy_policy", seed=7)) as core:
            weights.append(
                {k: v.clone() for k, v in core.models.module("policy").state_dict().items()}
            )
    assert weights[0]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_torchrl_core_state_dict_restores_weights_buffers_and_counters() -> None:
    with TorchRLCore(_config()) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        core.collect_batch()
        state = core.state_dict()
        assert state["frames"] == 20
        assert "module.offset" in state["models"]["policy"]["weights"]
    with TorchRLCore(_config()) as other:
        assert other.load_state_dict(state) == {"policy": (0, 0)}
        assert other.frames == 20


def test_torchrl_core_folds_large_observations_exactly() -> None:
    batches = []
    for fold in (False, True):
        with TorchRLCore(_config("stacked_cartpole")) as core:
            core.configure(CollectSettings(frames_per_batch=60, fold_observations=fold))
            batches.append(core.collect_batch())
    plain, folded = batches
    assert isinstance(folded, FoldedBatch)
    assert ("next", "observation") not in folded.batch.keys(True, True)
    assert set(folded.finals.keys()) == {"index", "observation", "episode_reward"}
    # Two cores draw two epochs, so their trajectory ids differ; all else is equal.
    assert (folded.unfold().exclude(TRAJ_IDS) == plain.exclude(TRAJ_IDS)).all()


def test_torchrl_core_folds_nested_observation_keys_exactly() -> None:
    batches = []
    for fold in (False, True):
        with TorchRLCore(_config("crowded_counting", "random")) as core:
            core.configure(CollectSettings(frames_per_batch=40, fold_observations=fold))
            batches.append(core.collect_batch())
    plain, folded = batches
    assert isinstance(folded, FoldedBatch)
    assert ("data", "states") in folded.finals.keys(True, True)
    assert ("next", "data", "states") not in folded.batch.keys(True, True)
    assert (folded.unfold().exclude(TRAJ_IDS) == plain.exclude(TRAJ_IDS)).all()


def test_torchrl_core_random_default_policy_acts_from_the_action_spec() -> None:
    config = ActorConfig(
        kind="torchrl",
        env_pool=EnvPoolSettings(env="CartPole-v1"),
        num_envs=3,
        seed=1,
        models=(ModelSpec(factory="random"),),
    )
    with TorchRLCore(config) as core:
        assert core.models.parameters_info("policy") == {}
        core.configure(CollectSettings(frames_per_batch=30))
        batch = core.collect_batch()
    assert isinstance(batch, TensorDict)
    assert batch.batch_size == (3, 10)
    assert (batch["action"].sum(-1) == 1).all()  # one-hot, as TorchRL's GymEnv encodes it
    assert core.describe().kind == "torchrl"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env_factory": "rlfleet_test_torchrl:raising_env"}, "no env today"),
        ({"env_factory": "rlfleet_test_torchrl:not_an_env"}, "not a torchrl.envs.EnvBase"),
        ({"models": (ModelSpec(factory="rlfleet_test_torchrl:raising_policy"),)}, "no policy"),
        ({"models": (ModelSpec(factory="rlfleet_test_torchrl:wrong_key_policy"),)}, "probe"),
        ({"models": (ModelSpec(factory="mlp"),)}, "gymnasium spaces"),
        # Kwargs meant for a factory left unnamed: the actor acted at random, ignoring them.
        (
            {"models": (ModelSpec(factory="random", kwargs={"cfg": {"lr": 1}}),)},
            r"the 'random' policy takes no arguments, got \['cfg'\]",
        ),
        ({"num_envs": 3, "env_factory": "rlfleet_test_torchrl:batched_cartpole"}, "batch size"),
        (
            {
                "env_factory": "rlfleet_test_torchrl:uint16_counting",
                "models": (ModelSpec(factory="random"),),
            },
            r"\['observation'\]: dtype torch.uint16 is not one of .*DTypeCastTransform",
        ),
        # Agents of different shapes need lazy stacks, which a dense packet cannot carry.
        (
            {
                "env_factory": "rlfleet_test_torchrl:heterogeneous_counting",
                "models": (ModelSpec(factory="random"),),
            },
            "agents of different shapes under 'lazy'",
        ),
        # TorchRL's collectors lazy-stack a varying shape; the actor looped on stack errors.
        (
            {
                "env_factory": "rlfleet_test_torchrl:dynamic_spec",
                "models": (ModelSpec(factory="random"),),
            },
            "varying shape under 'observation'",
        ),
        # The carrier stays on the env's device: a policy device other than the CPU is
        # refused up front, not left to fail somewhere in a step.
        ({"device": "meta"}, "runs its policies on the CPU for now, not 'meta'"),
    ],
    ids=[
        "env-raises",
        "not-an-env",
        "policy-raises",
        "policy-fails-probe",
        "mlp",
        "random-with-kwargs",
        "batched",
        "uint16-observation",
        "heterogeneous",
        "dynamic-spec",
        "device-not-cpu",
    ],
)
def test_torchrl_core_raises_if_the_env_or_policy_cannot_be_built(
    overrides: dict[str, Any], message: str
) -> None:
    env = overrides.pop("env_factory", "cartpole")  # the harness's env, by its factory
    with pytest.raises(ValueError, match=message):
        TorchRLCore(_config(env, **overrides))


def test_torchrl_pre_bind_check_steps_models_on_a_batch_as_the_pool_does() -> None:
    """A batch-norm policy fails on one unbatched step; the pool and the check batch it."""
    config = _config(env="pendulum", policy="batch_norm_policy")
    check_torchrl_config(config)  # before: "BatchNorm1d ... expected 2D or 3D input (got 1D)"
    check_torchrl_config(_config(env="pendulum", policy="random"))  # random actions, batched
    with TorchRLCore(config) as core:
        core.configure(CollectSettings(frames_per_batch=4))
        assert core.collect_batch().batch_size == (2, 2)
    with pytest.raises(ValueError, match="fails on the probe step"):
        check_torchrl_config(_config(env="pendulum", policy="wrong_key_policy"))


def test_torchrl_core_takes_an_env_that_is_batched_itself() -> None:
    config = _config(env="batched_cartpole", policy="greedy_policy")
    with TorchRLCore(config) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        batch = core.collect_batch()
    assert isinstance(batch, TensorDict)
    assert batch.batch_size == (2, 10)


def test_torchrl_core_raises_if_settings_do_not_fit() -> None:
    with TorchRLCore(_config()) as core:
        with pytest.raises(ValueError, match="multiple of num_envs=2"):
            core.configure(CollectSettings(frames_per_batch=21))
        with pytest.raises(ValueError, match="'step_count' key already"):
            core.configure(CollectSettings(frames_per_batch=20, max_frames_per_traj=5))
    with (
        TorchRLCore(_config("nested_counting", "random")) as core,
        pytest.raises(ValueError, match="no truncated key"),
    ):
        core.configure(CollectSettings(frames_per_batch=20, set_truncated=True))


def test_torchrl_core_max_frames_per_traj_changes_between_sessions() -> None:
    with TorchRLCore(_config("stacked_cartpole", "sampling_policy")) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        first = core.collect_batch()
        core.configure(CollectSettings(frames_per_batch=20, max_frames_per_traj=3))
        limited = core.collect_batch()
        core.configure(CollectSettings(frames_per_batch=20))
        unlimited = core.collect_batch()
    assert "step_count" not in first
    assert "step_count" not in unlimited
    assert limited["next", "step_count"].max() == 3
    assert limited["step_count"][:, 0].eq(0).all()  # in-flight episodes were reset
    ids = limited.get(TRAJ_IDS)
    assert not set(ids.unique().tolist()) & set(first.get(TRAJ_IDS).unique().tolist())


def test_torchrl_core_one_step_counter_serves_every_max_frames_per_traj() -> None:
    """Each session may ask another limit; the actor keeps one StepCounter wrapper and sets
    its max_steps (it kept a wrapper per limit: a learner's 3,000 limits grew it by 13 MB)."""
    with TorchRLCore(_config("stacked_cartpole", "sampling_policy")) as core:
        wrappers = set()
        for limit in (2, 5, 3, 0, 4):
            core.configure(CollectSettings(frames_per_batch=20, max_frames_per_traj=limit))
            batch = core.collect_batch()
            if limit:
                wrappers.add(id(core._pool))
                assert batch["next", "step_count"].max() == limit
                truncated = batch["next", "truncated"] & ~batch["next", "terminated"]
                assert batch["next", "step_count"][truncated].eq(limit).all()
            else:
                assert "step_count" not in batch
        assert len(wrappers) == 1
        assert not core._base.is_closed


@pytest.mark.long
def test_torchrl_core_async_backend_steps_a_parallel_env_in_subprocesses() -> None:
    batches = []
    for backend in ("async", "sync"):
        with TorchRLCore(_config(env_backend=backend)) as core:
            assert (
                type(core._pool).__name__ == {"async": "ParallelEnv", "sync": "SerialEnv"}[backend]
            )
            core.configure(CollectSettings(frames_per_batch=20))
            batches.append(core.collect_batch())
            if backend == "async":
                workers = list(core._pool._workers)
                assert len(workers) == 2
                assert all(p.is_alive() for p in workers)
    assert not any(p.is_alive() for p in workers)  # closed with the core
    parallel, serial = batches
    assert (parallel.exclude(TRAJ_IDS) == serial.exclude(TRAJ_IDS)).all()


@pytest.mark.parametrize("policy", ["greedy_policy", "random"])
def test_torchrl_core_raises_env_error_and_rebuilds_the_pool_when_the_env_crashes(
    policy: str,
) -> None:
    with TorchRLCore(_config(env="crashing_cartpole", policy=policy, num_envs=1)) as core:
        core.configure(CollectSettings(frames_per_batch=10))
        with pytest.raises(EnvError, match="simulator crashed") as info:
            core.collect_batch()
        assert info.value.env == "rlfleet_test_torchrl:crashing_cartpole"
        core.configure(CollectSettings(frames_per_batch=2))
        batch = core.collect_batch()  # on a rebuilt pool, whose new envs have steps left
    assert isinstance(batch, TensorDict)
    assert batch.batch_size == (1, 2)


def test_a_pool_rebuilt_after_a_crash_is_stepped_under_the_sessions_step_limit() -> None:
    # The step counter of max_frames_per_traj wraps the new pool, not the crashed one.
    with TorchRLCore(_config(env="crashing_cartpole", num_envs=1)) as core:
        core.configure(CollectSettings(frames_per_batch=10, max_frames_per_traj=2))
        with pytest.raises(EnvError, match="simulator crashed"):
            core.collect_batch()
        core.configure(CollectSettings(frames_per_batch=3, max_frames_per_traj=2))
        batch = core.collect_batch()
    assert batch["next", "step_count"].flatten().tolist() == [1, 2, 1]
    assert batch["next", "truncated"].flatten().tolist() == [False, True, False]


def test_a_pool_rebuilt_with_other_specs_is_refused_batch_after_batch() -> None:
    with TorchRLCore(_config(env="widening_cartpole", policy="greedy_policy", num_envs=1)) as core:
        core.configure(CollectSettings(frames_per_batch=10))
        with pytest.raises(EnvError, match="simulator crashed"):
            core.collect_batch()
        for _ in range(2):  # the factory keeps building the wider env: never collected
            with pytest.raises(EnvError, match=r"differ from its first build's at .*step_count"):
                core.collect_batch()


def test_torchrl_core_rebuilds_the_pool_after_a_crash_if_the_envs_close_raises() -> None:
    with TorchRLCore(_config(env="close_raising_crashing_cartpole", num_envs=1)) as core:
        core.configure(CollectSettings(frames_per_batch=10))
        with pytest.raises(EnvError, match="simulator crashed"):
            core.collect_batch()
        core.configure(CollectSettings(frames_per_batch=2))
        batch = core.collect_batch()  # on a rebuilt pool, whose new envs have steps left
    assert isinstance(batch, TensorDict)
    assert batch.batch_size == (1, 2)


def test_torchrl_core_raises_env_error_if_the_env_factory_fails_to_rebuild_the_pool() -> None:
    rlfleet_test_envs._UNBUILDABLE["crashed"] = False
    config = _config(env="unbuildable_after_crash_cartpole", num_envs=1)
    with TorchRLCore(config) as core:
        core.configure(CollectSettings(frames_per_batch=10))
        with pytest.raises(EnvError, match="simulator crashed"):
            core.collect_batch()
        for _ in range(2):  # the factory's failure, batch after batch: an env's, not a bug
            with pytest.raises(EnvError, match="licence server is unreachable") as info:
                core.collect_batch()
            assert info.value.env == "rlfleet_test_torchrl:unbuildable_after_crash_cartpole"


def test_torchrl_actor_takes_pushes_with_buffers_seeds_and_state_from_the_learner() -> None:
    policy = factories.greedy_policy(factories.cartpole())
    policy.module.offset.copy_(torch.tensor([0.0, 1e6]))  # a buffer: always push right
    pool = SerialEnv(2, factories.cartpole)
    expected_seed = pool.set_seed(7)
    pool.close()
    with (
        create_server(_config()).run_in_thread() as actor,
        GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=20) as collector,
    ):
        collector.update_policy_weights_(policy)
        assert collector.set_seed(7) == expected_seed
        batch = collector.next()  # the first batch of the new seed, after the push
        state = collector.state_dict()
        collector.load_state_dict(state)
        assert actor.server.ready
    assert (batch["next", "policy_version"] == 1).all()
    assert (batch["action"].argmax(-1) == 1).all()


def test_torchrl_actor_env_crash_reaches_the_learner_and_the_actor_keeps_serving() -> None:
    config = _config(env="crashing_cartpole", num_envs=1)
    with create_server(config).run_in_thread() as actor:
        address = f"127.0.0.1:{actor.port}"
        with (
            GrpcCollector([address], frames_per_batch=8, batch_timeout=60) as collector,
            pytest.raises(EnvError) as info,
        ):
            collector.next()
        assert info.value.env == "rlfleet_test_torchrl:crashing_cartpole"
        assert info.value.exception_message == "simulator crashed"
        assert actor.server.ready
        with GrpcCollector([address], frames_per_batch=2) as collector:
            assert collector.next().batch_size == (1, 2)  # a rebuilt pool, steps left


def test_torchrl_core_push_of_an_annealed_epsilon_reaches_the_exploration_module() -> None:
    with TorchRLCore(_config("categorical_cartpole", "egreedy_policy")) as core:
        module = core.models.module("policy")
        learner = factories.egreedy_policy(factories.categorical_cartpole())
        learner.load_state_dict(module.state_dict())
        learner[1].step(10)  # annealed to eps_end = 0 on the learner
        assert "module.1.eps" in core.models.parameters_info("policy")
        core.models.load_weights("policy", 1, learner.state_dict())
        core.configure(CollectSettings(frames_per_batch=40))
        batch = core.collect_batch()
    assert isinstance(batch, TensorDict)
    assert batch["action"].dtype == torch.int64  # an index, as the Categorical spec encodes it
    assert torch.equal(batch["action"], batch["action_value"].argmax(-1))  # no exploration left


def _env_stats(core: TorchRLCore) -> dict[str, torch.Tensor]:
    return flat_state(core.state_dict()["env"])


def test_torchrl_core_state_holds_the_env_transforms_state() -> None:
    config = _config("normalized_pendulum", "random")
    with TorchRLCore(config) as first, TorchRLCore(config) as second:
        first.configure(CollectSettings(frames_per_batch=40))
        first.collect_batch()
        stats = _env_stats(first)
        assert any("loc" in key for key in stats), list(stats)
        assert any(not torch.equal(stats[k], v) for k, v in _env_stats(second).items())
        second.load_state_dict(first.state_dict())
        restored = _env_stats(second)
        assert restored.keys() == stats.keys()
        assert all(torch.equal(restored[k], v) for k, v in stats.items())
        bad = first.state_dict()
        stats_of_worker = bad["env"]["worker0"]["transforms.1._extra_state"]
        key = next(k for k in stats_of_worker if k.startswith("loc"))
        stats_of_worker[key] = torch.full_like(stats_of_worker[key], float("nan"))
        with pytest.raises(WeightsError, match="env state does not fit this actor's env"):
            second.load_state_dict(bad)
        other = first.state_dict()
        other["env"]["worker7"] = other["env"]["worker0"]  # an env this actor does not have
        with pytest.raises(WeightsError, match=r"actor's env .*unexpected keys \['worker7/"):
            second.load_state_dict(other)
        assert all(torch.equal(_env_stats(second)[k], v) for k, v in stats.items())


def test_torchrl_core_steps_on_from_an_env_state_loaded_after_a_crash() -> None:
    # The pool the crash left is built anew before the state goes in, not after (dropping it).
    with TorchRLCore(_config("crashing_normalized_pendulum", "random")) as core:
        core.configure(CollectSettings(frames_per_batch=20))  # the 2nd batch crashes mid-way
        core.collect_batch()
        saved = core.state_dict()
        before = {k: int(v) for k, v in flat_state(saved["env"]).items() if "count" in k}
        with pytest.raises(EnvError):
            core.collect_batch()
        core.load_state_dict(saved)
        core.collect_batch()
        after = {k: int(v) for k, v in _env_stats(core).items() if "count" in k}
    assert before
    assert all(after[k] > v for k, v in before.items()), (before, after)


def test_one_env_stepped_as_it_is_holds_its_state_as_worker0_of_a_pool_of_one() -> None:
    # As a SerialEnv's state_dict() names its envs: the learner joins actors' pools so.
    config = _config("normalized_pendulum", "random", num_envs=1)
    with TorchRLCore(config) as first, TorchRLCore(config) as second:
        assert first._pool.batch_size == ()
        first.configure(CollectSettings(frames_per_batch=20))
        first.collect_batch()
        state = first.state_dict()
        assert set(state["env"]) == {"worker0"}
        stats = _env_stats(first)
        assert any("loc" in key for key in stats), list(stats)
        second.load_state_dict(state)
        restored = _env_stats(second)
    assert restored.keys() == stats.keys()
    assert all(torch.equal(restored[k], v) for k, v in stats.items())


def test_torchrl_actor_env_state_travels_through_get_state_and_load_state() -> None:
    with (
        create_server(_config("normalized_pendulum", "random")).run_in_thread() as actor,
        GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=20) as collector,
    ):
        collector.next()
        saved = collector.state_dict()
        blob = saved["workers"][0].numpy().tobytes()  # the actor's state file, as GetState sent it
        stats = flat_state(decode_state(blob)["env"])
        core = actor.server.runtime.core
        for _ in range(3):  # the running statistics move on with every batch
            collector.next()
        assert any(not torch.equal(_env_stats(core)[k], v) for k, v in stats.items())
        collector.load_state_dict(saved)
        after = _env_stats(core)
    assert all(torch.equal(after[k], v) for k, v in stats.items())


def test_torchrl_actor_loads_its_own_state_of_more_env_entries_than_its_models_hold() -> None:
    # 2 envs of 180 ObservationNorms of 3 entries: over 1,000 env state tensors, 2 weights.
    with (
        create_server(_config("many_norms_cartpole")).run_in_thread() as actor,
        GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=20) as collector,
    ):
        collector.next()
        saved = collector.state_dict()
        assert len(flat_state(decode_state(saved["workers"][0].numpy().tobytes())["env"])) > 1024
        collector.load_state_dict(saved)


def test_torchrl_actor_state_reads_one_actors_transform_state_from_the_learner() -> None:
    config = _config("normalized_pendulum", "random")
    with (
        create_server(config).run_in_thread() as actor,
        GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=20, prefetch=0, sync=True) as c,
    ):
        c.next()  # and nothing collected ahead: the state stays put
        state = c.actor_state(0)
        expected = _env_stats(actor.server.runtime.core)
        with pytest.raises(UnknownWorkerError):
            c.actor_state(5)
    stats = flat_state(state["env"])
    assert stats.keys() == expected.keys()
    assert any("loc" in key for key in stats)
    assert all(torch.equal(stats[k], v) for k, v in expected.items())
    assert state["frames"] == 20
    assert set(state) >= {"models", "frames", "batches", "traj_counter", "env"}


def test_torchrl_core_counts_init_random_frames_per_session_not_per_life() -> None:
    # As the env kind (and TorchRL, whose new collector counts its own frames): a new
    # session's first init_random_frames are random even on an actor that collected many.
    with TorchRLCore(_config(policy="sampling_policy")) as core:
        core.configure(CollectSettings(frames_per_batch=20))
        core.collect_batch()
        core.collect_batch()
        core.start_anew()  # what a server does as a new session opens
        core.configure(CollectSettings(frames_per_batch=20, init_random_frames=20))
        random_batch, policy_batch = core.collect_batch(), core.collect_batch()
    assert (random_batch["logits"] == 0).all()  # TorchRL's zeros for a random frame's outputs
    assert (policy_batch["logits"] != 0).any()


def test_torchrl_core_restore_gives_the_trajectories_in_flight_new_ids() -> None:
    # As the env kind: a state loaded between two batches (weights, env transforms) ends
    # the trajectories in flight; their next frames carry new, never given ids.
    with TorchRLCore(_config("stacked_cartpole", "sampling_policy")) as core:
        core.configure(CollectSettings(frames_per_batch=8))
        before = core.collect_batch()
        state = core.state_dict()
        core.load_state_dict(state)
        after = core.collect_batch()
        assert core.state_dict()["traj_counter"] > state["traj_counter"]
    ids = "collector", "traj_ids"
    assert not before["next", "done"][:, -1].any()
    assert not set(after[ids][:, 0].tolist()) & set(before[ids].flatten().tolist())


def test_torchrl_core_resets_the_envs_after_a_batch_the_policy_broke() -> None:
    # The envs stepped on while the batch was given up: the next batch starts from resets
    # (new trajectory ids), not from the carrier the broken batch left, with a hole in it.
    with TorchRLCore(_config("stacked_cartpole", "sampling_policy")) as core:
        core.configure(CollectSettings(frames_per_batch=8))
        before = core.collect_batch()
        act, calls = core.models.act, []

        def breaks_on_the_third_step(*args: Any) -> int:
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("the policy failed mid-batch")
            return act(*args)

        core.models.act = breaks_on_the_third_step  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="mid-batch"):
            core.collect_batch()
        core.models.act = act  # type: ignore[method-assign]
        after = core.collect_batch()
    ids = "collector", "traj_ids"
    assert not before["next", "done"][:, -1].any()
    assert not set(after[ids][:, 0].tolist()) & set(before[ids].flatten().tolist())


def test_torchrl_core_check_refuses_a_limit_on_an_env_that_counts_steps_itself() -> None:
    """``check`` (run before a take-over may end the session in force) refuses all that
    ``configure`` refuses: ``max_frames_per_traj`` over the env's own ``StepCounter`` too."""
    settings = CollectSettings(frames_per_batch=20, max_frames_per_traj=5)
    with TorchRLCore(_config()) as core:
        with pytest.raises(ValueError, match="'step_count' key already"):
            core.configure(settings)
        with pytest.raises(ValueError, match="'step_count' key already"):
            core.check(settings)


def test_a_take_over_over_the_envs_own_step_counter_leaves_the_session_in_force() -> None:
    """A take-over asking ``max_frames_per_traj`` of an env that counts steps itself is
    refused (INVALID_ARGUMENT) and must leave the running session going, as other refusals."""
    handle = create_server(_config()).run_in_thread()
    channel = grpc.insecure_channel(f"127.0.0.1:{handle.port}")
    try:
        stub = pb_grpc.ActorServiceStub(channel)
        first = RawCollect.open(stub, open_request(frames_per_batch=20, credits=1, learner_id="A"))
        first.opened()
        assert first.batch()[0].seq == 1
        taker = RawCollect.open(
            stub,
            open_request(
                frames_per_batch=20,
                credits=1,
                learner_id="B",
                take_over=True,
                max_frames_per_traj=5,
            ),
        )
        assert taker.error().code() == grpc.StatusCode.INVALID_ARGUMENT
        first.credit(1)  # A's session goes on: its next batch, not an end
        assert first.batch()[0].seq == 2
        first.cancel()
    finally:
        channel.close()
        handle.stop(grace=1.0)
