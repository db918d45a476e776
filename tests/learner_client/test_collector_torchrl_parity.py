"""GrpcCollector held to TorchRL's own collector tests, on real actors.

Each test ports one of TorchRL's tests (pytorch/rl ``test/test_collectors.py`` or
``test/test_distributed.py``, named in its docstring) to rlfleet actors started as
subprocesses through the ``rlfleet-actor`` command line. Where it is affordable, the test
also runs TorchRL 0.14.1's own collector (``Collector``, ``AsyncCollector``) as the
control, so the expected behaviour is TorchRL's observed behaviour, not our reading of it.
"""

from __future__ import annotations

import functools
import inspect
import json
import pathlib
import time
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium
import pytest
import torch
from helpers import assert_torchrl_names_offered_or_refused, poll_until, torchrl_public_names
from learner_fleet import ACTOR_ENV, cartpole_policy, start_actors
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn
from torchrl.collectors import (
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from torchrl.collectors.distributed import RayCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv, GymWrapper
from torchrl.record import CSVLogger
from torchrl.record.loggers.monitoring import LoggerMonitor

from common.config import ExplorationType
from common.errors import EnvError, UnknownWorkerError
from learner_client import GrpcCollector, LocalFleet

pytestmark = pytest.mark.long


# Two CartPole actors with two envs each; the default MLP policy.
CARTPOLE = [["--worker-id", str(w), "--num-envs", "2", "--seed", str(30 + w)] for w in range(2)]
# Three Pendulum actors, each built by its own policy factory call (bias 0, 0.5, 1.0).
BIASED = [
    [
        "--worker-id",
        str(w),
        "--env",
        "Pendulum-v1",
        "--num-envs",
        "1",
        "--seed",
        str(40 + w),
        "--policy",
        "rlfleet_test_policies:bias_policy",
        "--policy-kwargs",
        json.dumps({"bias": 0.5 * w}),
    ]
    for w in range(3)
]
# Actors whose env raises on every step; worker_id 1 withholds the exception's text.
CRASHING = [
    [
        "--worker-id",
        str(w),
        "--num-envs",
        "2",
        "--env-factory",
        "rlfleet_test_envs:crashing_cartpole",
        "--env-kwargs",
        '{"steps": 0}',
        "--env-error-detail",
        detail,
    ]
    for w, detail in enumerate(["full", "type"])
] + [  # worker_id 2: an env that hangs at its first step, in subprocesses with a step timeout
    [
        "--worker-id",
        "2",
        "--num-envs",
        "1",
        "--env-factory",
        "rlfleet_test_envs:hanging_cartpole",
        "--env-backend",
        "async",
        "--step-timeout",
        "0.5",
    ]
]


@pytest.fixture(scope="module")
def cartpole() -> Iterator[list[str]]:
    actors = start_actors(CARTPOLE)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


@pytest.fixture(scope="module")
def biased() -> Iterator[list[str]]:
    actors = start_actors(BIASED, env=ACTOR_ENV)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


@pytest.fixture(scope="module")
def crashing() -> Iterator[list[Any]]:
    actors = start_actors(CRASHING, env=ACTOR_ENV)
    yield actors
    for actor in actors:
        actor.close()


def versions(batch: TensorDict) -> set[int]:
    return set(batch["next", "policy_version"].unique().tolist())


def actions(batch: TensorDict) -> torch.Tensor:
    return batch["action"].argmax(-1)


def comparable(batch: TensorDict) -> TensorDict:
    """What a seed fixes: everything but the trajectory ids and the versions."""
    return batch.select(
        "observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done")
    )


def _torchrl_cartpole_policy() -> TensorDictModule:
    return TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])


# --------------------------------------------------------- policy versions


def test_sync_batch_after_an_update_runs_entirely_the_new_weights(cartpole: list[str]) -> None:
    """Ports test_distributed.py::test_distributed_collector_updatepolicy[sync=True] and
    test_collectors.py::TestPolicyVersion::test_single_collector_bumps_on_update.

    TorchRL's sync collectors collect a batch only when it is requested, so the batch
    after ``update_policy_weights_`` is entirely the new version, and a batch without an
    update keeps the version.
    """
    # Control: TorchRL's own Collector with track_policy_version.
    control = Collector(
        lambda: GymEnv("CartPole-v1"),
        _torchrl_cartpole_policy(),
        frames_per_batch=8,
        total_frames=32,
        track_policy_version=True,
    )
    try:
        it = iter(control)
        v0 = int(next(it)["next", "policy_version"][0])
        control.update_policy_weights_()
        assert (next(it)["next", "policy_version"] == v0 + 1).all()
        assert (next(it)["next", "policy_version"] == v0 + 1).all()
    finally:
        control.shutdown()

    with GrpcCollector(
        cartpole,
        frames_per_batch=16,
        sync=True,
        exploration_type=ExplorationType.DETERMINISTIC,
    ) as collector:
        first = collector.update_policy_weights_(cartpole_policy(action=0))[0]
        batch = collector.next()
        assert versions(batch) == {first}
        assert (actions(batch) == 0).all()
        assert versions(collector.next()) == {first}  # no update, no bump
        second = collector.update_policy_weights_(cartpole_policy(action=1))[0]
        batch = collector.next()  # the very next batch: no old frame in it
        assert versions(batch) == {second}
        assert (actions(batch) == 1).all()
        assert versions(collector.next()) == {second}


def test_sync_prefetch_collects_ahead_and_is_off_policy_by_that_many_batches(
    cartpole: list[str],
) -> None:
    """The opt-in counterpart of the test above: ``prefetch=1`` lets every actor collect
    one batch ahead, so the batch after an update is still the old version."""
    with GrpcCollector(
        cartpole,
        frames_per_batch=16,
        sync=True,
        prefetch=1,
        exploration_type=ExplorationType.DETERMINISTIC,
    ) as collector:
        first = collector.update_policy_weights_(cartpole_policy(action=0))[0]
        assert versions(collector.next()) == {first}
        # Every actor's batch collected ahead is in the learner's hands before the update.
        poll_until(lambda: collector.stats()["queued_batches"] == len(cartpole), timeout=30)
        second = collector.update_policy_weights_(cartpole_policy(action=1))[0]
        assert versions(collector.next()) == {first}  # collected ahead, before the update
        assert versions(collector.next()) == {second}


def test_async_keeps_one_batch_ahead_per_worker(cartpole: list[str]) -> None:
    """Ports test_collectors.py::TestPolicyVersion::test_multi_collector_bumps_on_update
    [multi_async]: after an update, a worker's batch already in flight may straddle the
    versions, and its next batch is entirely the new version; no bump without an update.

    One worker may hold a batch more: a batch claimed as it arrived (docs/collector.md,
    "When a batch counts as taken") while another worker's was handed out waits beside the
    credit it freed (learner_client._mailbox). That worker's third batch is the new version."""
    with GrpcCollector(
        cartpole, frames_per_batch=8, exploration_type=ExplorationType.DETERMINISTIC
    ) as collector:
        first = collector.update_policy_weights_(cartpole_policy(action=0))[0]
        for _ in range(4):
            assert versions(collector.next()) == {first}
        time.sleep(0.5)  # every worker now holds its one batch ahead
        second = collector.update_policy_weights_(cartpole_policy(action=1))[0]
        after: dict[int, list[set[int]]] = {0: [], 1: []}
        while min(len(v) for v in after.values()) < 3:
            batch = collector.next()
            after[int(batch["collector", "worker_id"].flatten()[0])].append(versions(batch))
        for worker_id, seen in after.items():
            assert all(v <= {first, second} for v in seen), (worker_id, seen)
            assert seen[2:] == [{second}] * (len(seen) - 2), (worker_id, seen)
            new_from = next(i for i, v in enumerate(seen) if v == {second})
            assert all(v == {second} for v in seen[new_from:]), (worker_id, seen)
        # Only the worker whose batch was claimed can be two batches behind.
        assert sum(seen[1] != {second} for seen in after.values()) <= 1, after


# ------------------------------------------------------------------- seeding


def test_set_seed_mid_run_makes_the_next_batch_the_first_of_that_seed(
    cartpole: list[str],
) -> None:
    """Ports test_collectors.py::TestCollectorGeneric::test_concurrent_collector_seed
    (AsyncCollector: one worker, collecting ahead): ``set_seed`` discards what was
    collected ahead, so the batch after ``set_seed(s)`` is the first batch of seed ``s``.

    TorchRL's control reseeds right after a batch, as its test does: in 0.14.1, once its
    worker has finished the batch ahead, ``set_seed`` raises "self.queue_out is full".
    rlfleet is also held to the harder case, a batch already collected ahead.
    """
    control = AsyncCollector(
        functools.partial(GymEnv, "CartPole-v1"),
        _torchrl_cartpole_policy(),
        frames_per_batch=20,
        total_frames=200,
    )
    try:
        control.set_seed(100)
        it = iter(control)
        b1 = next(it)
        control.set_seed(100)
        b2, b3 = next(it), next(it)
        assert torch.equal(b1["observation"], b2["observation"])
        assert not torch.equal(b1["observation"], b3["observation"])
    finally:
        control.shutdown()

    with GrpcCollector(cartpole[:1], frames_per_batch=20) as collector:
        collector.set_seed(100)
        b1 = collector.next()
        time.sleep(0.5)  # the actor has collected its next batch ahead with the old seed
        collector.set_seed(100)
        b2, b3 = collector.next(), collector.next()
    assert (comparable(b1) == comparable(b2)).all()
    assert not torch.equal(b1["observation"], b3["observation"])


def test_set_seed_in_sync_mode_reaches_every_worker_next_batch(cartpole: list[str]) -> None:
    """Ports test_collectors.py::TestCollectorGeneric::test_concurrent_collector_seed to
    MultiSyncCollector's chained seeding: with batches collected ahead (``prefetch``),
    the round after ``set_seed(s)`` is the first round of seed ``s`` on every worker."""
    with GrpcCollector(cartpole, frames_per_batch=32, sync=True, prefetch=2) as collector:
        collector.set_seed(7)
        r1 = collector.next()
        time.sleep(0.5)
        collector.set_seed(7)
        r2 = collector.next()
    assert (comparable(r1) == comparable(r2)).all()


# ----------------------------------------------------- per-worker weights


def test_update_policy_weights_by_worker_mapping_with_distinct_policy_factories(
    biased: list[str],
) -> None:
    """Ports test_collectors.py::TestMakePolicyFactory::
    test_per_worker_weight_sync_with_distinct_factories and
    test_per_worker_weight_sync_multiple_workers_update: three workers built by their own
    policy factory act 0, 0.5 and 1.0; ``update_policy_weights_({0: w0})`` changes worker
    0 only, and a full mapping gives every worker its own weights."""

    def weights(bias: float) -> TensorDict:
        return TensorDict(
            {"module": {"weight": torch.zeros(1, 3), "bias": torch.full((1,), bias)}}, []
        )

    with GrpcCollector(biased, frames_per_batch=30, sync=True) as collector:
        data = collector.next()
        for worker in range(3):
            assert torch.allclose(data["action"][worker], torch.tensor(0.5 * worker)), worker

        result = collector.update_policy_weights_({0: weights(1.5)})
        assert list(result) == [0]
        data = collector.next()
        assert torch.allclose(data["action"][0], torch.tensor(1.5))
        assert torch.allclose(data["action"][1], torch.tensor(0.5))
        assert torch.allclose(data["action"][2], torch.tensor(1.0))

        result = collector.update_policy_weights_(
            {0: weights(-1.0), 1: weights(-0.5), 2: weights(0.25)}
        )
        assert sorted(result) == [0, 1, 2]
        assert all(isinstance(v, int) for v in result.values())
        data = collector.next()
        for worker, expected in enumerate([-1.0, -0.5, 0.25]):
            assert torch.allclose(data["action"][worker], torch.tensor(expected)), worker

        # The same validation as worker_ids=: unknown workers, conflicting arguments.
        with pytest.raises(UnknownWorkerError, match=r"\[5\]"):
            collector.update_policy_weights_({5: weights(0.0)})
        with pytest.raises(ValueError, match="worker_ids"):
            collector.update_policy_weights_({0: weights(0.0)}, worker_ids=[0])
        with pytest.raises(ValueError, match="empty"):
            collector.update_policy_weights_({})
        with pytest.raises(TypeError):
            collector.update_policy_weights_({0: "not weights"})


# ------------------------------------------------------------ replay buffers


def test_sync_replay_buffer_is_extended_with_each_worker_batch(cartpole: list[str]) -> None:
    """Ports test_collectors.py::TestCollectorRB::test_collector_rb_multisync and
    test_parallel_env_with_multi_collector_and_replay_buffer[MultiSyncCollector]: each
    worker's ``[envs, time]`` batch is written to the buffer (not the stacked
    ``[workers, envs, time]``), so a 2-D storage fills by frames and every worker's piece
    of a trajectory stays contiguous."""
    rb = ReplayBuffer(storage=LazyTensorStorage(256, ndim=2), batch_size=5)
    with GrpcCollector(
        cartpole,
        frames_per_batch=32,
        total_frames=128,
        sync=True,
        replay_buffer=rb,
        max_frames_per_traj=500,
    ) as collector:
        frames = 0
        for c in collector:
            frames += 32
            assert c is None
            assert len(rb) == frames
    assert rb[:].batch_size == (2, 64)  # [envs, time]: 4 rounds x 2 workers x 8 steps
    steps = rb["step_count"].squeeze(-1).split(8, dim=-1)
    ids = rb["collector", "traj_ids"].split(8, dim=-1)
    for step_chunk, id_chunk in zip(steps, ids, strict=True):  # one worker's batch each
        new_traj = step_chunk[:, 1:] == 0
        assert ((step_chunk.diff(dim=-1) == 1) | new_traj).all()
        assert ((id_chunk.diff(dim=-1) == 0) | new_traj).all()


def test_async_replay_buffer_is_extended_with_each_batch(cartpole: list[str]) -> None:
    """Ports test_collectors.py::TestCollectorRB::test_collector_rb_multiasync."""
    rb = ReplayBuffer(storage=LazyTensorStorage(256, ndim=2), batch_size=5)
    with GrpcCollector(cartpole, frames_per_batch=16, total_frames=128, replay_buffer=rb) as c:
        for batches, batch in enumerate(c, start=1):
            assert batch is None
            assert len(rb) == 16 * batches
    assert len(rb) == 128


@pytest.mark.parametrize(
    ("keys", "set_truncated", "warns"),
    [
        ({"end_key": ("next", "done")}, False, True),
        ({"traj_key": ("collector", "traj_ids")}, False, False),
        ({}, False, False),  # finds ("collector", "traj_ids") itself
        ({"end_key": ("next", "done")}, True, False),
    ],
)
def test_slice_sampler_finding_trajectories_by_their_end_warns_as_torchrl(
    cartpole: list[str], keys: dict[str, Any], set_truncated: bool, warns: bool
) -> None:
    """TorchRL's MultiSyncCollector/MultiAsyncCollector warn that a SliceSampler's slices may
    run from one worker's trajectory into another's (each worker's batch is stored on its
    own, with no done between); so does a fleet, unless the sampler reads the trajectory
    ids, which are unique across the fleet, or ``set_truncated`` marks the batches' ends."""
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(256), sampler=SliceSampler(slice_len=8, **keys), batch_size=16
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        collector = GrpcCollector(
            cartpole, frames_per_batch=32, replay_buffer=rb, set_truncated=set_truncated
        )
    collector.shutdown()
    slicing = [w for w in caught if "SliceSampler" in str(w.message)]
    assert len(slicing) == warns, [str(w.message) for w in caught]
    if warns:
        assert slicing[0].category is UserWarning
        assert "traj_key=('collector', 'traj_ids')" in str(slicing[0].message)
        assert slicing[0].filename == __file__


# ------------------------------------------------------- init_random_frames


def test_init_random_frames_with_start_counts_this_collectors_frames(
    cartpole: list[str],
) -> None:
    """Ports test_collectors.py::TestInitRandomFramesWithStart::
    test_init_random_frames_with_start on a fleet that already served a collector: the
    new collector's first ``init_random_frames`` frames are random (the MLP's logits are
    zero there), the rest run the policy."""
    with GrpcCollector(cartpole, frames_per_batch=32, total_frames=64, sync=True) as used:
        for _ in used:
            pass
    rb = ReplayBuffer(storage=LazyTensorStorage(512), batch_size=5)
    collector = GrpcCollector(
        cartpole,
        frames_per_batch=16,
        total_frames=-1,
        init_random_frames=64,
        replay_buffer=rb,
    )
    try:
        collector.start()
        deadline = time.monotonic() + 60
        while rb.write_count < 256 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        collector.async_shutdown(timeout=10)
    data = rb[:]
    assert data.numel() >= 256
    random = data["logits"].eq(0).all(-1).reshape(-1)
    # 64 random frames, split over the two actors in whole batches of 16 frames.
    assert int(random.sum()) == 64
    assert {"observation", "action", "next"} <= set(data.keys())


@pytest.mark.parametrize(("frames", "random_frames"), [(32, 32), (256, 0)])
def test_init_random_frames_counts_what_the_replay_buffer_already_holds(
    cartpole: list[str], frames: int, random_frames: int
) -> None:
    """TorchRL judges random frames against the buffer's writes: a run resumed with a filled
    buffer takes only the random frames it lacks. The writes are rows of 8 steps (each
    actor's ``[envs, time]`` part): 32 frames are 4 writes and leave 32 of the 64 random
    frames (one batch per actor); 256 frames, 32 writes, leave none (counted as 32 frames,
    32 random frames were taken again)."""
    rb = ReplayBuffer(storage=LazyTensorStorage(512), batch_size=5)
    with GrpcCollector(
        cartpole, frames_per_batch=16, total_frames=frames, replay_buffer=rb
    ) as first:  # the run before: its frames are in the buffer
        for _ in first:
            pass
    written = rb.write_count
    assert written == frames // 8
    collector = GrpcCollector(
        cartpole, frames_per_batch=16, total_frames=128, init_random_frames=64, replay_buffer=rb
    )
    with collector:
        for _ in collector:
            pass
    data = rb[written:]
    assert data.numel() == 128
    assert int(data["logits"].eq(0).all(-1).sum()) == random_frames


@pytest.mark.parametrize("buffered", [False, True])
def test_init_random_frames_count_what_a_resumed_run_loads_after_building_the_collector(
    cartpole: list[str], buffered: bool
) -> None:
    """A script resumes as TorchRL's examples do: it builds the collector, then loads the
    checkpoint (``load_state_dict``, and the replay buffer's own state). TorchRL judges
    random frames when it collects, against the frames ``load_state_dict`` restored (with
    a buffer, against the buffer's writes): a run resumed past ``init_random_frames``
    takes no random actions again."""
    saved = ReplayBuffer(storage=LazyTensorStorage(512)) if buffered else None
    with GrpcCollector(cartpole, frames_per_batch=16, total_frames=256, replay_buffer=saved) as c:
        for _ in c:
            pass
        state = c.state_dict()
    rb = ReplayBuffer(storage=LazyTensorStorage(512)) if buffered else None
    collector = GrpcCollector(
        cartpole, frames_per_batch=16, total_frames=384, init_random_frames=64, replay_buffer=rb
    )
    with collector:
        collector.load_state_dict(state)  # 256 frames: 128 left to collect
        if rb is not None and saved is not None:
            rb.load_state_dict(saved.state_dict())
        batches = [batch for batch in collector if batch is not None]
    data = rb[saved.write_count :] if rb is not None and saved is not None else torch.cat(batches)
    assert data.numel() == 128
    assert int(data["logits"].eq(0).all(-1).sum()) == 0


@pytest.mark.parametrize(("sync", "prefetch"), [(False, None), (True, 0), (True, 2)])
def test_init_random_frames_stay_this_collectors_when_an_actor_joins(
    sync: bool, prefetch: int | None
) -> None:
    """The random frames are the collector's, not each session's: an actor that joins while
    they are taken does not add a share of its own (async: the running shares cover them; it
    took a fresh one, 512 of 384), and a grown sync fleet splits what is left (each old
    actor's remainder was rounded up to whole batches on top of the joiner's share: 416), not
    counting the prefetched shares of the old split it drops (224)."""
    random_frames, frames = 384, 96 if sync else 32
    seen = dict.fromkeys((0, 1, 2), 0)
    with (
        LocalFleet(2, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0) as fleet,
        LocalFleet(1, "CartPole-v1", num_envs=2, seed=10, worker_ids=[2]) as joiner,
        GrpcCollector(
            fleet.addresses,
            frames_per_batch=frames,
            sync=sync,
            init_random_frames=random_frames,
            prefetch=prefetch,
        ) as collector,
    ):
        random = 0
        for i, batch in enumerate(collector):
            by_frame = batch.reshape(-1)
            random += int(by_frame["logits"].eq(0).all(-1).sum())
            for w in by_frame["collector", "worker_id"].reshape(-1).unique().tolist():
                seen[w] += 1
            if i == 0:
                collector.add_collectors(joiner.addresses)
            if min(seen.values()) >= 8:
                break
    assert random == random_frames


# ---------------------------------------------------------------------- stats


def _flat_scalars(stats: dict[str, Any]) -> None:
    for key, value in stats.items():
        assert isinstance(key, str)
        assert isinstance(value, bool | int | float), (key, value)
    json.dumps(stats)


def test_stats_is_a_flat_mapping_of_scalars_a_logger_monitor_can_log(
    cartpole: list[str], tmp_path: pathlib.Path
) -> None:
    """Ports TorchRL's ``stats()`` contract (BaseCollector.stats, MultiCollector.stats,
    RayCollector.stats: ``workers=`` and ``timeout=``) and logs it with TorchRL's own
    LoggerMonitor, which needs a flat mapping of scalars."""
    assert "workers" in inspect.signature(MultiSyncCollector.stats).parameters
    assert "timeout" in inspect.signature(RayCollector.stats).parameters
    control = Collector(
        lambda: GymEnv("CartPole-v1"),
        _torchrl_cartpole_policy(),
        frames_per_batch=8,
        total_frames=16,
    )
    try:
        next(iter(control))
        _flat_scalars(control.stats())
    finally:
        control.shutdown()

    with GrpcCollector(cartpole, frames_per_batch=16, total_frames=64, sync=True) as collector:
        collector.update_policy_weights_(cartpole_policy())
        collector.next()
        stats = collector.stats()
        _flat_scalars(stats)
        assert stats["frames"] == 16
        assert stats["batches"] == 1
        assert stats["total_frames"] == 64
        assert stats["completed"] is False
        assert stats["requested_frames_per_batch"] == 16
        assert (stats["workers"], stats["workers_alive"]) == (2, 2)
        assert isinstance(stats["policy_version"], int)
        per_worker = collector.stats(workers="per_worker", timeout=1.0)
        _flat_scalars(per_worker)
        assert per_worker["worker_0/frames"] + per_worker["worker_1/frames"] == 16
        assert "frames" not in per_worker
        both = collector.stats(workers="both", timeout=None)
        assert both["frames"] == 16
        assert both["worker_1/frames"] == 8
        with pytest.raises(ValueError, match="workers"):
            collector.stats(workers="everyone")

        monitor = LoggerMonitor(
            CSVLogger(exp_name="parity", log_dir=str(tmp_path)), background=False, on_error="raise"
        )
        monitor.watch(collector, name="collector", step="frames")
        logged = monitor.step()
        assert logged["collector"]["collector/frames"] == 16


# --------------------------------------------------------- TorchRL defaults


def _named_init(cls: type) -> inspect.Signature:
    """The first ``__init__`` up the MRO with named parameters (MultiAsync forwards *args)."""
    for klass in cls.__mro__:
        sig = inspect.signature(klass.__init__)
        if any(p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
               for n, p in sig.parameters.items() if n != "self"):  # fmt: skip
            return sig
    raise AssertionError(f"no named __init__ parameters on {cls}")


def test_every_torchrl_default_of_a_shared_knob_is_accepted(cartpole: list[str]) -> None:
    """TorchRL's Collector, MultiSyncCollector, MultiAsyncCollector and RayCollector
    declare defaults for the knobs GrpcCollector shares with them; each must be accepted,
    with TorchRL's meaning (read from the installed torchrl's signatures)."""
    ours = inspect.signature(GrpcCollector.__init__).parameters
    defaults: dict[str, list[Any]] = {}
    for cls in (Collector, MultiSyncCollector, MultiAsyncCollector, RayCollector):
        for name, param in _named_init(cls).parameters.items():
            if name not in ours or name == "self" or param.default is param.empty:
                continue
            known = defaults.setdefault(name, [])
            if param.default not in known:
                known.append(param.default)
    assert {"total_frames", "split_trajs", "init_random_frames", "sync"} <= set(defaults)
    for name, values in sorted(defaults.items()):
        for value in values:
            with GrpcCollector(cartpole, frames_per_batch=16, **{name: value}) as collector:
                assert collector.worker_ids == [0, 1], (name, value)
    # TorchRL's meanings: None and -1 mean "no limit", "no random frames", "do not split".
    with GrpcCollector(
        cartpole,
        frames_per_batch=16,
        total_frames=32,
        max_frames_per_traj=None,
        init_random_frames=None,
        split_trajs=None,
        cat_results=None,
        exploration_type=InteractionType.RANDOM,
        sync=None,
    ) as collector:
        batch = collector.next()
        assert batch.batch_size == (2, 8)  # async (sync=None): one worker's [envs, time]
        assert ("collector", "mask") not in batch.keys(include_nested=True)  # not split
        assert batch["logits"].ne(0).any()  # no random frames
        assert len(collector) == 2


def test_every_public_name_of_torchrls_collectors_is_offered_or_refused_saying_why(
    cartpole: list[str],
) -> None:
    """Each public name of TorchRL's Collector, MultiSyncCollector, MultiAsyncCollector and
    RayCollector (read from the installed torchrl) is on a fleet's collector, or reading it
    raises ``AttributeError`` naming TorchRL and the way a fleet does it, not Python's bare
    "no attribute"; another name still gets Python's."""
    with GrpcCollector(cartpole, frames_per_batch=16) as collector:
        classes = (Collector, MultiSyncCollector, MultiAsyncCollector, RayCollector)
        assert_torchrl_names_offered_or_refused(collector, torchrl_public_names(classes))
        with pytest.raises(AttributeError, match="reset_at_each_iter=True"):
            collector.reset()  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match=r"object has no attribute 'resett'$"):
            collector.resett  # type: ignore[attr-defined]  # noqa: B018
        assert not hasattr(collector, "map_fn")
        with pytest.raises(AttributeError, match="create_env_fn="):
            collector.env  # noqa: B018  # a property's own message, not the fallback's
        devices = collector.device, collector.storing_device, collector.policy_device
        assert (*devices, collector.env_device) == (None, None, None, None)
    cpu = torch.device("cpu")
    with GrpcCollector(
        cartpole, frames_per_batch=16, storing_device="cpu", policy_device="cpu"
    ) as collector:
        assert (collector.device, collector.storing_device, collector.policy_device) == (cpu,) * 3


def _cartpole_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def test_every_public_instance_name_of_built_torchrl_collectors_is_offered_or_refused(
    cartpole: list[str],
) -> None:
    """The public attributes TorchRL's Collector, MultiSyncCollector and MultiAsyncCollector
    hold once built (``vars()``: ``split_trajs``, ``num_workers``, ``create_env_fn``,
    ``closed``...) read on a fleet's collector built with the same arguments give the same
    value, or raise ``AttributeError`` naming TorchRL's and how a fleet does it, not Python's
    bare one; ``closed`` turns True at shutdown, as TorchRL's. (RayCollector needs Ray.)"""
    policy = _torchrl_cartpole_policy()
    common = {"policy": policy, "frames_per_batch": 16, "total_frames": -1}
    per_worker = {"create_env_fn": [_cartpole_env] * 2, "cat_results": "stack"}
    forms = [
        (Collector, {"create_env_fn": _cartpole_env}, {}),
        (MultiSyncCollector, per_worker, {"sync": True}),
        (MultiAsyncCollector, per_worker, {"sync": False}),
    ]
    for cls, arguments, ours in forms:
        theirs = cls(**common, **arguments)
        try:
            expected = {n: v for n, v in vars(theirs).items() if not n.startswith("_")}
        finally:
            theirs.shutdown()
        assert theirs.closed
        collector = GrpcCollector(cartpole, **common, **arguments, **ours)
        with collector:
            offered = assert_torchrl_names_offered_or_refused(collector, expected)
            for name in set(offered) - {"env_device", "policy_device", "storing_device"}:
                assert getattr(collector, name) == expected[name], (cls.__name__, name)
                if not isinstance(getattr(type(collector), name, None), property):
                    continue  # the postproc and replay_buffer given, as TorchRL's
                with pytest.raises(AttributeError):
                    setattr(collector, name, expected[name])
            assert not collector.closed
        assert collector.closed
        names = {"closed", "split_trajs", "reset_at_each_iter", "exploration_type"}
        assert names <= set(offered), cls.__name__
    assert {"create_env_fn", "num_workers"} <= set(offered)  # the multi-process ones


def test_collector_max_frames_per_traj_reads_torchrls_value_for_the_value_given(
    cartpole: list[str],
) -> None:
    """TorchRL's collectors read ``int(max_frames_per_traj)`` (None: 0); a -1 or -5 given used
    to read 0 here. A count <= 0 still means none: the actors truncate nothing."""
    for given in (None, -5, -1, 0, 7):
        theirs = Collector(
            create_env_fn=_cartpole_env,
            frames_per_batch=16,
            total_frames=16,
            max_frames_per_traj=given,
        )
        expected = theirs.max_frames_per_traj
        theirs.shutdown()
        with GrpcCollector(cartpole, frames_per_batch=16, max_frames_per_traj=given) as collector:
            assert collector.max_frames_per_traj == expected, given
            batch = collector.next()
        assert (("next", "step_count") in batch.keys(include_nested=True)) is (given == 7)
    assert GrpcCollector.__init__.__kwdefaults__["max_frames_per_traj"] is None  # Collector's


# ---------------------------------------------------------- an env that errors


def test_env_that_errors_raises_a_typed_error_after_bounded_attempts(crashing: list[Any]) -> None:
    """Ports test_collectors.py::TestCollectorGeneric::test_env_that_errors
    (Collector, MultiAsyncCollector, MultiSyncCollector raise the env's RuntimeError). The
    learner raises an EnvError (a RuntimeError) naming the worker, the env and the env's
    exception, after a bounded number of attempts with backoff, long before
    ``batch_timeout``; it never restarts the actor's session in a tight loop."""
    control = Collector(
        lambda: GymWrapper(_import_crashing()),
        policy=None,
        frames_per_batch=30,
        total_frames=60,
    )
    try:
        with pytest.raises(RuntimeError, match="simulator crashed"):
            next(iter(control))
    finally:
        control.shutdown()

    for sync in (True, False):
        start = time.monotonic()
        with (
            GrpcCollector(
                [crashing[0].address], frames_per_batch=8, sync=sync, batch_timeout=60
            ) as collector,
            pytest.raises(EnvError) as info,
        ):
            collector.next()
        elapsed = time.monotonic() - start
        error = info.value
        assert isinstance(error, RuntimeError)
        assert error.worker_id == 0
        assert error.env == "rlfleet_test_envs:crashing_cartpole"
        assert (error.exception_type, error.exception_message) == (
            "RuntimeError",
            "simulator crashed",
        )
        assert "worker_id 0" in str(error)
        assert "simulator crashed" in str(error)
        assert 2 <= error.attempts <= 5
        assert elapsed < 30, elapsed
    opened = crashing[0].stderr().count("session.opened")
    assert opened <= 10, f"{opened} sessions opened: a restart loop"


def test_a_hung_env_reaches_the_learner_as_its_timeout_long_before_batch_timeout(
    crashing: list[Any],
) -> None:
    """A hung env counts with the crashes: raised after a few sessions, not retried for 60 s."""
    start = time.monotonic()
    with (
        GrpcCollector([crashing[2].address], frames_per_batch=8, batch_timeout=60) as collector,
        pytest.raises(EnvError) as info,
    ):
        collector.next()
    error = info.value
    assert (error.worker_id, error.exception_type) == (2, "TimeoutError")
    assert "an env step took longer than step_timeout=0.5 s" in str(error.exception_message)
    assert 2 <= error.attempts <= 5
    assert time.monotonic() - start < 40  # before: MissingWorkersError after batch_timeout


def test_env_error_text_is_withheld_when_the_actor_says_so(crashing: list[Any]) -> None:
    """The operator's ``--env-error-detail type``: the learner hears the type, not the text."""
    collector = GrpcCollector([crashing[1].address], frames_per_batch=8)
    try:
        with pytest.raises(EnvError) as info:
            collector.next()
    finally:
        collector.shutdown()
    error = info.value
    assert (error.worker_id, error.exception_type) == (1, "RuntimeError")
    assert error.exception_message is None
    assert "simulator crashed" not in str(error)
    assert "withheld" in str(error)


@pytest.mark.long  # three actor processes
def test_an_env_raising_what_is_awkward_to_report_reaches_the_learner_as_env_error() -> None:
    # A lone surrogate in the text (the end message could not be built), an exception outside
    # Exception (the session never ended) or a SystemExit (the actor's process died): the
    # learner waited out batch_timeout and raised MissingWorkersError, or lost the actor.
    kinds = ["surrogates", "base_exception", "system_exit"]
    factory = ["--num-envs", "1", "--env-factory", "rlfleet_test_envs:oddly_crashing_cartpole"]
    odd = [
        ["--worker-id", str(w), *factory, "--env-kwargs", json.dumps({"kind": k})]
        for w, k in enumerate(kinds)
    ]
    actors = start_actors(odd, env=ACTOR_ENV)
    raised: dict[str, EnvError] = {}
    try:
        for actor, kind in zip(actors, kinds, strict=True):
            for _ in range(2):  # the actor lives on: a second collector is told the same
                start = time.monotonic()
                with (
                    GrpcCollector([actor.address], frames_per_batch=4, batch_timeout=60) as c,
                    pytest.raises(EnvError) as info,
                ):
                    c.next()
                assert time.monotonic() - start < 30, kind
                assert actor.process.poll() is None, actor.stderr()[-2000:]
                raised[kind] = info.value
        assert raised["surrogates"].exception_message.endswith("\\udcff")  # escaped
        assert raised["base_exception"].exception_type == "_UserBaseError"
        assert raised["system_exit"].exception_type == "SystemExit"
    finally:
        for actor in actors:
            actor.close()


def _import_crashing() -> gymnasium.Env:
    import rlfleet_test_envs  # the actors' own env factories (on the path learner_fleet sets)

    return rlfleet_test_envs.crashing_cartpole(steps=10)
