"""Construction-time checks of GrpcCollector's arguments and of the fleet they describe."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from learner_fleet import batch_settings, connection_settings, rollout_settings
from tensordict import TensorDict
from tensordict.nn import InteractionType
from torchrl.collectors import Collector

from common.config import (
    MAX_FRAMES_PER_BATCH,
    PROTOCOL_VERSION,
    CollectSettings,
    CompileSettings,
    ExplorationType,
    protocol_mismatch,
    same_device,
)
from common.errors import UnknownModelError
from common.llm import LLMSettings
from learner_client import GrpcCollector
from learner_client._ray_dropin import RAY_WARNED
from learner_client._script_env import check_env_signature
from learner_client._settings import (
    FleetMember,
    check_addresses,
    check_fleet,
    frames_written,
    normalize_cat_results,
    normalize_exploration_type,
)
from learner_client._torchrl_compat import ActorPlacement, check_no_effect

DEFAULTS = dict(
    frames_per_batch=16,
    total_frames=-1,
    sync=False,
    max_frames_per_traj=-1,
    init_random_frames=-1,
    reset_at_each_iter=False,
    reset_when_done=True,
    split_trajs=False,
    exploration_type=ExplorationType.RANDOM,
    set_truncated=False,
    update_after_each_batch=False,
    max_weight_update_interval=-1,
    cat_results=None,
    prefetch=None,
    connect_timeout=10.0,
    call_timeout=30.0,
    batch_timeout=60.0,
    allow_partial_batches=False,
    channel_credentials=None,
    token=None,
    model_id="policy",
)


def members(*num_envs: int) -> list[FleetMember]:
    return [FleetMember(f"h:{9000 + i}", i, n) for i, n in enumerate(num_envs)]


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        ({"frames_per_batch": 0}, ValueError, "frames_per_batch.*0"),
        ({"frames_per_batch": 2.5}, TypeError, "frames_per_batch.*2.5"),
        ({"frames_per_batch": True}, TypeError, "frames_per_batch"),
        ({"total_frames": 0}, ValueError, "total_frames.*0"),
        ({"prefetch": -1}, ValueError, "prefetch.*-1"),
        ({"prefetch": 0}, ValueError, "prefetch=0 needs sync=True"),
        ({"sync": True, "prefetch": 2, "update_after_each_batch": True}, ValueError, "prefetch=2"),
        ({"batch_timeout": -1.0}, ValueError, "batch_timeout.*-1"),
        ({"cat_results": 1}, ValueError, "cat_results.*1"),
        ({"max_weight_update_interval": -2}, ValueError, "max_weight_update_interval.*-2"),
        ({"reset_when_done": False}, ValueError, "reset_when_done"),
        ({"exploration_type": InteractionType.MEDIAN}, ValueError, "MEDIAN"),
        ({"exploration_type": 3}, TypeError, "exploration_type"),
        ({"model_id": ""}, ValueError, "model_id"),
        ({"sync": "yes"}, TypeError, "sync"),
        # Values that used to pass construction and fail later, deep inside:
        ({"batch_timeout": float("nan")}, ValueError, "batch_timeout"),
        ({"batch_timeout": 2**1100}, ValueError, "batch_timeout"),  # OverflowError in the check
        ({"call_timeout": 1e10}, ValueError, "call_timeout"),  # every call: DEADLINE_EXCEEDED
        ({"max_frames_per_traj": 2**63}, ValueError, "max_frames_per_traj"),  # killed the link
        ({"init_random_frames": 2**64}, ValueError, "init_random_frames"),
        ({"total_frames": 2**64}, ValueError, "total_frames"),
        ({"token": "a\r\nX-Evil: 1"}, ValueError, "printable ASCII"),  # grpc's ExecuteBatchError
        ({"token": "x" * 20_000}, ValueError, "at most 4096"),  # seen as ActorBusyError
        ({"token": "x" * 4097}, ValueError, "at most 4096"),
        ({"token": ""}, ValueError, "token must be a non-empty string"),  # "Bearer " alone
        ({"token": "s\u00e9cret"}, ValueError, "printable ASCII"),  # no such header byte
        ({"learner_id": "l" * 257}, ValueError, "learner_id must be a string of 1 to 256"),
        ({"weight_push": "x"}, TypeError, "weight_push"),  # an AttributeError, a thread left
        ({"device": "meta"}, ValueError, "meta device"),  # batches of no data, silently
        ({"storing_device": "meta"}, ValueError, "meta device"),
        ({"storing_device": ["cpu", "meta"]}, ValueError, r"storing_device\[1\]=.*meta device"),
        ({"device": []}, ValueError, "per-worker list must name one device"),
        ({"policy_device": ["cpu", "cuda:1"]}, ValueError, "per-worker list must name one"),
        ({"env_device": ("cpu", 3.5)}, TypeError, r"env_device\[1\] must be a torch.device"),
        ({"dns_refresh_interval": 0}, ValueError, "dns_refresh_interval"),  # plain addresses too
        ({"dns_refresh_interval": float("nan")}, ValueError, "dns_refresh_interval"),
        ({"dns_refresh_interval": 1e12}, ValueError, "dns_refresh_interval"),  # killed its thread
        ({"dns_refresh_interval": "5"}, TypeError, "dns_refresh_interval"),
        # TorchRL's flags are bools: a truthy string or int is not read as one.
        ({"update_at_each_batch": 1}, TypeError, "update_at_each_batch must be a bool"),
        ({"update_after_each_batch": "no"}, TypeError, "update_after_each_batch must be a bool"),
        # Complete-trajectory batches are refused whatever the value, a falsy one too.
        ({"trajs_per_batch": 0}, ValueError, "trajs_per_batch=0"),
        ({"traj_format": ""}, ValueError, "traj_format=''"),
        ({"env_device": ["cpu", "cpu", "cuda"]}, ValueError, "per-worker list must name one"),
    ],
)
def test_collector_raises_if_a_value_is_out_of_range(override, error, message):
    # The settings are checked before any actor is contacted (nothing listens on port 1).
    with pytest.raises(error, match=message):
        GrpcCollector(["127.0.0.1:1"], **(DEFAULTS | override))


def test_settings_validate_and_normalise_themselves():
    batch = batch_settings(frames_per_batch=16, total_frames=None, update_after_each_batch=True)
    rollout = rollout_settings(exploration_type=InteractionType.DETERMINISTIC)
    conn = connection_settings(token="t")
    assert batch.endless
    assert batch.auto_update_interval == 0
    assert rollout.exploration_type is ExplorationType.DETERMINISTIC
    assert conn.metadata() == (
        ("rlfleet-learner-id-bin", conn.learner_id.encode()),
        ("authorization", "Bearer t"),
    )
    settings = rollout.for_actor(8, 3)
    assert settings.total_frames == -1
    assert settings.frames_per_batch == 8


def test_counts_take_numpy_and_tensor_integers_and_whole_floats_as_torchrl_does():
    """TorchRL does arithmetic on its counts and reads frame counts with ``int()``: a
    script's ``np.int64`` batch size or ``total_frames=1e6`` works there and must here."""
    batch = batch_settings(
        frames_per_batch=np.int64(64),
        total_frames=1e6,
        prefetch=torch.tensor(2),
        sync=True,
    )
    values = (batch.frames_per_batch, batch.total_frames, batch.prefetch)
    assert values == (64, 1_000_000, 2)
    interval = batch_settings(frames_per_batch=8, max_weight_update_interval=np.int32(3))
    assert interval.max_weight_update_interval == 3
    assert all(type(v) is int for v in (*values, interval.max_weight_update_interval))
    assert batch_settings(frames_per_batch=8, total_frames=math.inf).endless  # TorchRL's endless
    rollout = rollout_settings(init_random_frames=np.uint16(256), max_frames_per_traj=500.0)
    assert (rollout.init_random_frames, rollout.max_frames_per_traj) == (256, 500)
    several = (np.array([100, 200]), torch.tensor([100, 200]))  # an array's truth was raised
    for bad in (1.5, np.float64(2.5), "64", np.True_, math.nan, *several):
        with pytest.raises(TypeError, match="total_frames must be an int"):
            batch_settings(frames_per_batch=8, total_frames=bad)
    with pytest.raises(TypeError, match="frames_per_batch must be a positive int"):
        batch_settings(frames_per_batch=64.0)  # TorchRL's shapes fail on a float too


def test_timeouts_take_numpy_numbers_from_a_config():
    batch = batch_settings(frames_per_batch=8, batch_timeout=np.int64(30))
    assert (type(batch.batch_timeout), batch.batch_timeout) == (float, 30.0)
    conn = connection_settings(call_timeout=np.float32(5.0))
    assert (type(conn.call_timeout), conn.call_timeout) == (float, 5.0)
    for bad in (torch.tensor(5.0), np.True_, "30"):
        with pytest.raises(TypeError, match="batch_timeout must be a number of seconds"):
            GrpcCollector(["127.0.0.1:1"], **(DEFAULTS | {"batch_timeout": bad}))


def test_prefetch_defaults_to_torchrl_sync_on_demand_and_async_one_ahead():
    sync = batch_settings(frames_per_batch=16, sync=True)
    assert (sync.prefetch, sync.on_demand, sync.window) == (0, True, 1)
    ahead = batch_settings(frames_per_batch=16, sync=True, prefetch=3)
    assert (ahead.prefetch, ahead.on_demand, ahead.window) == (3, False, 3)
    first_ready = batch_settings(frames_per_batch=16, sync=None)
    assert (first_ready.sync, first_ready.prefetch, first_ready.on_demand) == (False, 1, False)
    assert batch_settings(frames_per_batch=16, split_trajs=None).split_trajs is False


def test_exploration_and_cat_results_accept_torchrl_spellings():
    assert normalize_exploration_type("mode") is ExplorationType.MODE
    assert normalize_exploration_type(InteractionType.RANDOM) is ExplorationType.RANDOM
    assert normalize_cat_results("stack") == "stack"
    assert normalize_cat_results(0) == 0


def test_batch_settings_len_is_ceil_and_raises_if_endless():
    with pytest.warns(UserWarning, match="5 additional frames"):  # TorchRL's warning
        assert batch_settings(frames_per_batch=10, total_frames=25).num_batches() == 3
    with pytest.raises(TypeError, match="endless"):
        batch_settings(frames_per_batch=10).num_batches()
    with pytest.raises(RuntimeError, match="endless"):  # what TorchRL's collectors raise
        batch_settings(frames_per_batch=10).num_batches()


def test_batch_settings_len_is_the_exact_ceil_of_a_budget_past_float_precision() -> None:
    # TorchRL's __len__ is -(total // -fpb); a float ceil is one batch off past 2**53 frames.
    assert batch_settings(frames_per_batch=1, total_frames=2**53 + 1).num_batches() == 2**53 + 1
    with pytest.warns(UserWarning, match="additional frames"):
        settings = batch_settings(frames_per_batch=3, total_frames=2**63 - 1)
    assert settings.num_batches() == -((2**63 - 1) // -3)
    assert settings.batches_for(0) == 0
    assert settings.batches_for(4) == 2


def test_check_addresses_raises_if_empty_malformed_or_repeated():
    assert check_addresses(["a:1", "b:2"]) == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="at least one"):
        check_addresses([])
    with pytest.raises(ValueError, match="'nope'"):
        check_addresses(["nope"])
    with pytest.raises(ValueError, match="twice"):
        check_addresses(["a:1", "a:1"])
    with pytest.raises(TypeError):
        check_addresses("a:1")
    assert check_addresses(["a:65535", "[::1]:1"]) == ["a:65535", "[::1]:1"]
    for port in ("0", "65536"):  # gRPC would dial 65536 as port 0
        with pytest.raises(ValueError, match=r"the port must be in 1\.\.65535"):
            check_addresses([f"a:{port}"])


def test_check_fleet_raises_if_worker_ids_repeat_naming_the_addresses():
    dup = [FleetMember("h:1", 5, 2), FleetMember("h:2", 5, 2)]
    with pytest.raises(ValueError, match=r"worker_id 5 at \['h:1', 'h:2'\]"):
        check_fleet(batch_settings(frames_per_batch=8), dup, "policy")


def test_check_fleet_tells_one_actor_at_two_addresses_from_two_actors_sharing_an_id():
    """One epoch is one process (a name listing its IPv4 and IPv6 address); two are two actors."""
    one = [FleetMember("h:1", 5, 2, epoch=7), FleetMember("[::1]:1", 5, 2, epoch=7)]
    with pytest.raises(ValueError, match=r"one actor reached at each address: list it once"):
        check_fleet(batch_settings(frames_per_batch=8), one, "policy")
    two = [FleetMember("h:1", 5, 2, epoch=7), FleetMember("h:2", 5, 2, epoch=8)]
    with pytest.raises(ValueError, match=r"start each with its own --worker-id"):
        check_fleet(batch_settings(frames_per_batch=8), two, "policy")


def test_check_fleet_names_the_nearest_frames_per_batch_the_fleet_can_split():
    """TorchRL rounds such a frames_per_batch up; we refuse it, naming the values that work."""
    two = [FleetMember("h:1", 1, 4), FleetMember("h:2", 2, 6)]  # lcm 12, 24 a sync round
    with pytest.raises(ValueError, match=r"use frames_per_batch=24 or 48 \(multiples of 24 "):
        check_fleet(batch_settings(frames_per_batch=30, sync=True), two, "policy")
    with pytest.raises(ValueError, match=r"use frames_per_batch=12 \(multiples of 12 "):
        check_fleet(batch_settings(frames_per_batch=10), two, "policy")  # async: none below
    one = [FleetMember("h:1", 1, 5)]  # none above what an actor collects in one batch
    with pytest.raises(ValueError, match=r"use frames_per_batch=4194300 \(multiples of 5 "):
        check_fleet(
            batch_settings(frames_per_batch=MAX_FRAMES_PER_BATCH - 1),
            one,
            "policy",
        )
    with pytest.raises(ValueError, match=r"cat_results=0 also needs actors of one num_envs"):
        check_fleet(
            batch_settings(frames_per_batch=30, sync=True, cat_results=0),
            two,
            "policy",
        )


def test_check_fleet_needs_alike_spaces_only_where_the_layout_concatenates():
    def fleet(*spaces: str, kind: str = "env") -> list[FleetMember]:
        return [
            FleetMember(f"h:{i}", i, 2, kind=kind, max_new_tokens_cap=64, env=f"env-{i}", spaces=s)
            for i, s in enumerate(spaces)
        ]

    for layout in [{"cat_results": 0}, {"split_trajs": True}]:
        settings = batch_settings(frames_per_batch=8, sync=True, **layout)
        check_fleet(settings, fleet("a", "a"), "policy")  # two names of one env's spaces
        with pytest.raises(ValueError, match=r"spaces alike.*h:1 \(worker_id 1\) serves 'env-1'"):
            check_fleet(settings, fleet("a", "b"), "policy")
        check_fleet(
            batch_settings(frames_per_batch=8, **layout),
            fleet("a", "b"),
            "policy",
        )  # async
    check_fleet(batch_settings(frames_per_batch=8, sync=True), fleet("a", "b"), "policy")  # a stack
    tasks = batch_settings(frames_per_batch=8, sync=True, cat_results=0, llm=LLMSettings())
    check_fleet(tasks, fleet("", "", kind="llm"), "policy")  # two tasks: one LLM layout


def test_check_fleet_raises_if_sync_frames_do_not_split_naming_the_values_that_do():
    """A batch that does not split over the actors names the nearest that split and fit each
    actor's envs; whole LLM dialogs fit any share, so only the split counts for them."""
    with pytest.raises(ValueError, match=r"use frames_per_batch=6 or 12 \(multiples of 6"):
        check_fleet(batch_settings(frames_per_batch=10, sync=True), members(2, 2, 2), "policy")
    llm = [
        FleetMember(f"h:{i}", i, 4, kind="llm", max_new_tokens_cap=64, env="arith")
        for i in range(2)
    ]
    dialogs = LLMSettings(yield_completed_trajectories=True)
    with pytest.raises(ValueError, match=r"use dialog_turns_per_batch=2 \(multiples of 2 suit"):
        check_fleet(batch_settings(frames_per_batch=1, sync=True, llm=dialogs), llm, "policy")


def test_check_fleet_raises_if_an_actors_share_is_above_what_it_collects_in_a_batch():
    with pytest.raises(ValueError, match=r"each actor a share of 2305843009213693952 a batch"):
        check_fleet(
            batch_settings(frames_per_batch=2**62, sync=True),
            members(1, 1),
            "policy",
        )


def test_integer_ceil_splits_init_random_frames_exactly() -> None:
    settings = rollout_settings(init_random_frames=2**63 - 1)  # a float ceil gave 2**63
    assert settings.for_actor(8, 1).init_random_frames == 2**63 - 1
    assert rollout_settings(init_random_frames=2**53 + 1).for_actor(8, 1).init_random_frames == (
        2**53 + 1
    )


def test_check_fleet_raises_if_sync_frames_do_not_split_evenly():
    with pytest.raises(ValueError, match=r"frames_per_batch=10.*not divisible by 3"):
        check_fleet(
            batch_settings(frames_per_batch=10, sync=True),
            members(1, 1, 1),
            "policy",
        )
    with pytest.raises(ValueError, match=r"share 6.*h:9001 \(worker_id 1, num_envs 4\)"):
        check_fleet(
            batch_settings(frames_per_batch=12, sync=True),
            members(2, 4),
            "policy",
        )
    check_fleet(batch_settings(frames_per_batch=16, sync=True), members(2, 4), "policy")


def test_check_fleet_raises_if_async_frames_are_not_a_multiple_of_num_envs():
    with pytest.raises(ValueError, match=r"frames_per_batch=6.*num_envs 4"):
        check_fleet(batch_settings(frames_per_batch=6), members(2, 4), "policy")
    check_fleet(batch_settings(frames_per_batch=8), members(2, 4), "policy")


def test_check_fleet_raises_if_cat_needs_equal_time_steps():
    with pytest.raises(ValueError, match="cat_results=0"):
        check_fleet(
            batch_settings(frames_per_batch=16, sync=True, cat_results=0),
            members(2, 4),
            "policy",
        )


def test_check_fleet_raises_if_the_acting_model_is_missing():
    fleet = [FleetMember("h:1", 0, 2, ("critic",))]
    with pytest.raises(UnknownModelError, match=r"'policy'.*h:1"):
        check_fleet(batch_settings(frames_per_batch=8), fleet, "policy")


def test_connection_settings_give_each_learner_its_own_identity() -> None:
    from common.config import MAX_LEARNER_ID, MAX_WIRE_LEARNER_ID

    first, second = connection_settings(), connection_settings()
    assert first.learner_id != second.learner_id
    assert not first.take_over
    assert connection_settings(learner_id="trainer-7").learner_id == "trainer-7"
    with pytest.raises(ValueError, match="learner_id"):
        connection_settings(learner_id="x" * (MAX_LEARNER_ID + 1))
    longest = connection_settings(learner_id="x" * MAX_LEARNER_ID).learner_id
    assert len(f"{longest}/rank{2**31 - 1}") <= MAX_WIRE_LEARNER_ID  # what a rank opens with
    with pytest.raises(TypeError, match="take_over"):
        connection_settings(take_over="yes")


def test_frames_written_counts_frames_not_the_rows_a_replay_buffer_counts() -> None:
    """``write_count`` counts a storage's rows: ``[envs, time]`` parts give rows of ``time``
    frames (``ndim=2``: rows of ``envs``); a storage whose rows it cannot read counts writes."""
    data = pytest.importorskip("torchrl.data")
    part = TensorDict({"obs": torch.zeros(2, 16, 3)}, [2, 16])
    rows = data.ReplayBuffer(storage=data.LazyTensorStorage(64))
    rows.extend(part)
    grid = data.ReplayBuffer(storage=data.LazyTensorStorage(64, ndim=2))
    grid.extend(part)
    listed = data.ReplayBuffer(storage=data.ListStorage(64))
    listed.extend([1, 2, 3])
    empty = data.ReplayBuffer(storage=data.LazyTensorStorage(64))
    assert (rows.write_count, grid.write_count) == (2, 16)
    assert frames_written(rows) == frames_written(grid) == 32
    assert frames_written(listed) == 3
    assert frames_written(empty) == 0
    assert frames_written(object()) == 0


def test_rollout_settings_at_the_collectors_defaults_ask_actors_to_fold_observations():
    """``GrpcCollector`` asks folded batches by default (docs/wire.md, docs/actor.md): the
    default moved off ``RolloutSettings`` must not fall to ``CollectSettings``' False."""
    assert rollout_settings().for_actor(8, 1).fold_observations is True


def test_a_collector_at_its_defaults_opens_sessions_that_fold_observations():
    from actor_service import ActorConfig, create_server

    config = ActorConfig(host="127.0.0.1", port=0, num_envs=2, seed=0)
    handle = create_server(config).run_in_thread()
    try:
        with GrpcCollector(
            [f"127.0.0.1:{handle.port}"], frames_per_batch=4, total_frames=4
        ) as collector:
            for _ in collector:
                pass
        assert handle.server.runtime.core._settings.fold_observations is True
    finally:
        handle.stop(grace=1.0)


def test_collect_settings_defaults_mean_what_torchrl_collectors_defaults_mean() -> None:
    """A session built with the defaults collects as a TorchRL ``Collector`` does."""
    torchrl = inspect.signature(Collector.__init__).parameters
    ours = CollectSettings(frames_per_batch=1)
    assert ours.total_frames == torchrl["total_frames"].default  # -1: endless, not none
    assert torchrl["max_frames_per_traj"].default is None
    assert ours.max_frames_per_traj <= 0  # none
    assert ours.init_random_frames == (torchrl["init_random_frames"].default or 0)
    assert ours.split_trajs is bool(torchrl["split_trajs"].default)
    for name in ("reset_at_each_iter", "reset_when_done", "set_truncated"):
        assert getattr(ours, name) is torchrl[name].default, name
    assert ours.exploration_type.name == torchrl["exploration_type"].default.name


def test_compile_and_cudagraph_policy_are_read_as_torchrl_reads_them() -> None:
    """TorchRL: compiled/CUDA-graphed unless the value is False or None, a dict is the options."""
    for off in (None, False):
        placement = ActorPlacement.from_torchrl(compile_policy=off, cudagraph_policy=off)
        assert (placement.compile_policy, placement.cudagraph_policy) == (None, False)
    on_values: tuple[object, ...] = (True, {})
    for on in on_values:
        placement = ActorPlacement.from_torchrl(compile_policy=on, cudagraph_policy=on)
        assert (placement.compile_policy, placement.cudagraph_policy) == (CompileSettings(), True)
    placement = ActorPlacement.from_torchrl(
        compile_policy={"mode": None, "fullgraph": True}, cudagraph_policy={"warmup": 3}
    )
    assert placement.compile_policy == CompileSettings(mode="", fullgraph=True)
    assert placement.cudagraph_policy is True


def test_inert_arguments_warn_when_marked_and_the_ray_form_names_more() -> None:
    """A marked argument warns off its default only; the drop-in Ray form warns for more."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_no_effect({"extend_buffer": True, "trust_policy": True, "use_env_creator": True})
        check_no_effect({"trust_policy": None, "no_cuda_sync": None}, RAY_WARNED)
    with pytest.warns(UserWarning, match="extend_buffer=False has no effect"):
        check_no_effect({"extend_buffer": False})
    for name in sorted(RAY_WARNED):
        with pytest.warns(UserWarning, match=f"{name}=True has no effect over gRPC"):
            check_no_effect({name: True}, RAY_WARNED)


def test_a_batch_unlike_create_env_fns_env_in_key_shape_or_dtype_is_refused() -> None:
    expected = {"observation": ((4,), torch.float32), ("next", "reward"): ((1,), torch.float32)}
    fits = TensorDict(
        {"observation": torch.zeros(2, 3, 4), "next": {"reward": torch.zeros(2, 3, 1)}}, [2, 3]
    )
    check_env_signature(expected, fits, "actors [0]")
    for key, value, message in [
        ("observation", torch.zeros(2, 3, 4, dtype=torch.float64), "as \\[4\\] torch.float32"),
        ("observation", torch.zeros(2, 3, 5), "the batches of actors \\[0\\] as \\[5\\]"),
        (("next", "reward"), torch.zeros(2, 3, 1, dtype=torch.int64), "torch.int64"),
    ]:
        batch = fits.clone()
        batch.set(key, value)
        with pytest.raises(ValueError, match=message):
            check_env_signature(expected, batch, "actors [0]")
    with pytest.raises(ValueError, match="which the batches of actors \\[0\\] lack"):
        check_env_signature(expected, fits.exclude("observation"), "actors [0]")


def test_collect_settings_refuse_env_knobs_with_llm_and_values_of_the_wrong_type() -> None:
    llm = LLMSettings()
    for unset in (0, -1):  # TorchRL's "none": an LLM session may carry it
        assert CollectSettings(frames_per_batch=1, llm=llm, max_frames_per_traj=unset).llm
    knobs: list[dict[str, Any]] = [
        {"max_frames_per_traj": 5},
        {"split_trajs": True},
        {"set_truncated": True},
    ]
    for knob in knobs:
        with pytest.raises(ValueError, match=f"none of env collection's {next(iter(knob))}="):
            CollectSettings(frames_per_batch=1, llm=llm, **knob)
    with pytest.raises(TypeError, match="exploration_type must be an ExplorationType"):
        CollectSettings(frames_per_batch=1, exploration_type="random")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compile_policy must be a CompileSettings"):
        CollectSettings(frames_per_batch=1, compile_policy={"backend": "eager"})  # type: ignore[arg-type]


def test_same_device_matches_an_unindexed_cuda_to_any_cuda_and_nothing_else() -> None:
    assert same_device("cpu", "cpu")
    assert same_device("cuda", "cuda:3")
    assert same_device("cuda:0", "cuda")  # torch's current device, index 0 here
    assert not same_device("cuda:1", "cuda:0")
    assert not same_device("cuda", "cpu")
    assert not same_device("cpu", "cuda:0")


def test_protocol_mismatch_refuses_a_peer_too_old_or_needing_a_newer_build() -> None:
    assert protocol_mismatch("actor a:1", PROTOCOL_VERSION, PROTOCOL_VERSION) == ""
    assert "no protocol revision" in protocol_mismatch("actor a:1", 0, 0)
    newer = protocol_mismatch("actor a:1", PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 1)
    assert f"works with {PROTOCOL_VERSION + 1} and newer" in newer
