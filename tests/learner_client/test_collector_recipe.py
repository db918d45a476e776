"""What a TorchRL script meets when its collector line moves to a fleet.

The fleet given to the collector lives as long as the collector (also when a helper built
the collector and returned it, as ``make_collector`` does); an argument-less
``update_policy_weights_()`` of an unchanged ``policy=`` sends nothing; ``stats()`` counts
the pushes the collector makes on its own; TorchRL's positional arguments and a fleet of
another number of envs than the script's env get messages that name the fix. Real actors
on loopback.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import process_alive
from learner_fleet import cartpole_policy

from common.errors import SessionStateError
from learner_client import ActorFleet, GrpcCollector, GrpcLLMCollector, LocalFleet

pytestmark = pytest.mark.usefixtures("loopback_only")


def _gone(pids: list[int]) -> bool:
    return not any(process_alive(pid) for pid in pids)


def make_collector(num_envs: int = 2) -> tuple[GrpcCollector, LocalFleet]:
    """TorchRL's ``make_collector`` pattern: the collector is built here and returned."""
    fleet = LocalFleet(1, "CartPole-v1", num_envs=num_envs, seed=0, grace_period=1.0)
    collector = GrpcCollector(fleet, frames_per_batch=8, total_frames=16, sync=True)
    return collector, fleet


@pytest.mark.long
def test_a_fleet_given_to_the_collector_is_started_and_stops_with_it() -> None:
    collector, fleet = make_collector()
    as_protocol: ActorFleet = fleet  # what a collector takes of a fleet
    assert as_protocol.worker_ids == [0]
    assert fleet.started  # started by the collector
    pids = fleet.pids
    assert [tuple(batch.batch_size) for batch in collector] == [(1, 2, 4), (1, 2, 4)]
    assert not _gone(pids)
    collector.shutdown()
    assert _gone(pids)
    collector.shutdown()  # twice: harmless
    fleet.close()
    with pytest.raises(SessionStateError, match=r"stopped.*give it `fleet\.addresses`"):
        fleet.addresses  # noqa: B018


def test_a_started_fleet_by_keyword_stops_at_the_with_blocks_end() -> None:
    fleet = LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0).start()
    pids = fleet.pids
    with GrpcCollector(actors=fleet, frames_per_batch=8, total_frames=8, sync=True) as c:
        assert c.worker_ids == fleet.worker_ids == [0]
        assert len(list(c)) == 1
    assert _gone(pids)
    fleet.stop()  # the user's own stop afterwards: harmless


@pytest.mark.long
def test_a_fleets_addresses_leave_the_fleet_to_its_owner() -> None:
    with LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0) as fleet:
        with GrpcCollector(fleet.addresses, frames_per_batch=8, total_frames=8) as collector:
            assert len(list(collector)) == 1
        assert fleet.is_alive(0)
        with GrpcCollector(fleet.addresses, frames_per_batch=8, total_frames=8) as collector:
            assert len(list(collector)) == 1
    assert _gone(fleet.pids)


@pytest.mark.long
def test_a_collector_that_fails_to_construct_stops_the_fleet_it_was_given() -> None:
    fleet = LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0)
    with pytest.raises(ValueError, match="frames_per_batch"):
        GrpcCollector(fleet, frames_per_batch=3, sync=True)  # not a multiple of 2 envs
    assert fleet.started
    assert _gone(fleet.pids)


@pytest.mark.long
def test_the_llm_collector_takes_a_fleet_too() -> None:
    fleet = LocalFleet(
        1,
        kind="llm",
        task="arith",
        policy_kwargs={"hidden": 32, "layers": 1, "seed": 0},
        num_envs=2,
        seed=0,
        grace_period=1.0,
    )
    with GrpcLLMCollector(
        fleet, dialog_turns_per_batch=2, generation={"max_new_tokens": 3}
    ) as collector:
        assert [a.worker_id for a in collector.remote_collectors] == [0]
        pids = fleet.pids
        assert not _gone(pids)
    assert _gone(pids)


def test_torchrls_positional_arguments_name_the_keywords() -> None:
    policy = cartpole_policy()

    def make_env() -> object:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"create_env_fn=env, policy=policy"):
        GrpcCollector(make_env, policy, frames_per_batch=8)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"the fleet or its addresses, got function"):
        GrpcCollector(make_env, frames_per_batch=8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"create_env_fn=env, policy=policy"):
        GrpcCollector(policy, frames_per_batch=8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"RayCollector's create_env_fn\?\); pass it by keyword"):
        GrpcCollector([make_env, make_env], frames_per_batch=8)  # type: ignore[list-item]


@pytest.fixture(scope="module")
def cartpole_fleet() -> object:
    with LocalFleet(2, "CartPole-v1", num_envs=2, seed=3, grace_period=1.0) as fleet:
        yield fleet


def _step(policy: torch.nn.Module) -> None:
    """An optimiser step's effect: every parameter changed in place."""
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.01)


@pytest.mark.long
def test_an_argument_less_push_of_an_unchanged_policy_sends_nothing(cartpole_fleet) -> None:
    policy = cartpole_policy()
    with GrpcCollector(
        cartpole_fleet.addresses, policy=policy, frames_per_batch=8, sync=True
    ) as collector:
        collector.next()  # the first push, automatic
        version = collector.policy_version
        sent = collector.stats()["push_bytes"]
        assert collector.update_policy_weights_() == {0: version, 1: version}
        assert collector.update_policy_weights_() == {0: version, 1: version}
        assert collector.stats()["push_bytes"] == sent
        assert collector.policy_version == version
        _step(policy)
        assert collector.update_policy_weights_() == {0: version + 1, 1: version + 1}
        assert collector.update_policy_weights_() == {0: version + 1, 1: version + 1}
        autos = collector.stats()["auto_pushes"]
        collector.next()  # pushed by the script already: no automatic push before it
        assert collector.stats()["auto_pushes"] == autos
        assert collector.policy_version == version + 1
        _step(policy)
        collector.update_policy_weights_(policy)  # the module itself: the same
        collector.next()
        assert collector.stats()["auto_pushes"] == autos
        assert collector.policy_version == version + 2
        parameter = next(policy.parameters())
        parameter.data = parameter.data + 1  # new memory: no counter moves, its pointer does
        assert collector.update_policy_weights_() == {0: version + 3, 1: version + 3}
        parameter.data.fill_(0.5)  # in place through .data: not seen, the module form sends
        assert collector.update_policy_weights_() == {0: version + 3, 1: version + 3}
        assert collector.update_policy_weights_(policy) == {0: version + 4, 1: version + 4}


def test_torchrls_policy_age_filter_reads_the_collectors_version(cartpole_fleet) -> None:
    """``PolicyAgeFilter(lambda: collector.policy_version, ...)``: TorchRL's int, not a dict."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs.transforms import PolicyAgeFilter

    policy = cartpole_policy()
    collector = GrpcCollector(
        cartpole_fleet.addresses, policy=policy, frames_per_batch=8, sync=True
    )
    filtered = PolicyAgeFilter(lambda: collector.policy_version, max_policy_lag=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), transform=filtered)
    with collector:
        rb.extend(collector.next().reshape(-1))  # acted with the version in force: kept
        assert len(rb) == 8
        old = collector.next().reshape(-1)
        _step(policy)
        collector.update_policy_weights_()
        assert isinstance(collector.policy_version, int)
        assert collector.policy_version == collector.policy_versions["policy"]
        new = collector.next().reshape(-1)
        rb.extend(torch.cat([old, new]))  # the old version's frames are filtered out
        assert len(rb) == 16
        assert bool((rb[8:16]["policy_version"] == collector.policy_version).all())


def test_auto_pushes_count_the_pushes_of_a_followed_policy(cartpole_fleet) -> None:
    policy = cartpole_policy()
    with GrpcCollector(
        cartpole_fleet.addresses, policy=policy, frames_per_batch=8, total_frames=32, sync=True
    ) as collector:
        for batch in collector:
            assert batch["policy_version"].unique().numel() == 1
            _step(policy)  # an optimiser step: pushed before the next batch
            collector.update_policy_weights_()  # pushes it; the collector does not again
            collector.update_policy_weights_()  # nothing changed: nothing sent
        stats = collector.stats()
    # the first push only was the collector's own; the script made the four others
    assert stats["auto_pushes"] == 1
    assert stats["policy_version"] == collector.policy_version
    with GrpcCollector(
        cartpole_fleet.addresses, policy=policy, frames_per_batch=8, total_frames=32, sync=True
    ) as collector:
        for _ in collector:
            _step(policy)  # never update_policy_weights_: the collector pushes each change
        assert collector.stats()["auto_pushes"] == 4  # before batches 1, 2, 3 and 4


@pytest.mark.long
def test_a_fleet_of_as_many_envs_as_the_scripts_env_is_not_warned() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1")
    with (
        LocalFleet(1, kind="torchrl", num_envs=1, seed=0, grace_period=1.0) as fleet,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        with GrpcCollector(
            fleet, create_env_fn=env, frames_per_batch=8, total_frames=16, sync=True
        ) as collector:
            assert [tuple(b.batch_size) for b in collector] == [(8,), (8,)]  # TorchRL's


@pytest.mark.long
def test_a_fleet_of_more_envs_than_the_scripts_env_is_warned_once() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1")
    fleet = LocalFleet(2, kind="torchrl", num_envs=1, seed=0, grace_period=1.0)
    with (
        pytest.warns(UserWarning, match="TorchRL's collector would give") as warned,
        GrpcCollector(
            fleet, create_env_fn=env, frames_per_batch=8, total_frames=24, sync=True
        ) as collector,
    ):
        shapes = [tuple(b.batch_size) for b in collector]
    assert shapes == [(2, 1, 4)] * 3
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "[2, 1, 4]" in message
    assert "would give [4]" in message
    assert "LocalFleet(1, num_envs=1" in message
