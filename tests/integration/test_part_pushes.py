"""``update_policy_weights_(..., version=, part=)``: two collectors as two ranks, real actors.

Each collector plays one rank (pushes only, no session), each actor is a real in-process
server on loopback; weights are read back through GetState. The rank processes and a
SIGKILL between parts are in ``test_sharded_push.py``.
"""

from __future__ import annotations

import time

import gymnasium
import pytest
import torch
from push_policies import actor_weights, in_process_actor

from common.errors import StaleVersionError
from common.policies import make_policy
from common.weights import PushOutcome
from learner_client import GrpcCollector, PartResult, WeightPushError

pytestmark = pytest.mark.usefixtures("loopback_only")
DEADLINE = 1.0


@pytest.fixture
def actors():
    with (
        in_process_actor(part_deadline_s=DEADLINE) as first,
        in_process_actor(part_deadline_s=DEADLINE, worker_id=1) as second,
    ):
        yield [f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"]


@pytest.fixture
def ranks(actors):
    with (
        GrpcCollector(actors, frames_per_batch=4) as rank0,
        GrpcCollector(actors, frames_per_batch=4) as rank1,
    ):
        yield rank0, rank1


def _state(seed: int) -> dict[str, torch.Tensor]:
    env = gymnasium.make("CartPole-v1")
    torch.manual_seed(seed)
    return make_policy("mlp", env.observation_space, env.action_space).state_dict()


def _shards(state: dict) -> list[dict]:
    keys = sorted(state)
    return [{k: state[k] for k in keys[r::2]} for r in (0, 1)]


def _assert_actors_hold(collector: GrpcCollector, state: dict, version: int) -> None:
    for worker_id in collector.worker_ids:
        got, weights = actor_weights(collector, worker_id)
        assert got == version
        assert weights.keys() == state.keys()
        for key, value in state.items():
            assert torch.equal(weights[key], value.to(weights[key].dtype)), (worker_id, key)


def test_two_ranks_parts_apply_whole_and_each_rank_learns_what_its_part_did(ranks) -> None:
    rank0, rank1 = ranks
    state = _state(1)
    first, second = _shards(state)
    before = actor_weights(rank0, 0)[1]  # both actors start from the same seeded weights
    staged = rank0.update_policy_weights_(first, version=4, part=(0, 2))
    assert staged == {w: PartResult(PushOutcome.STAGED, 4, 0, 1) for w in (0, 1)}
    _assert_actors_hold(rank0, before, 0)  # nothing of version 4 until its last part
    completed = rank1.update_policy_weights_(second, version=4, part=(1, 2))
    assert completed == {w: PartResult(PushOutcome.COMPLETED, 4, 4, 2) for w in (0, 1)}
    _assert_actors_hold(rank0, state, 4)


def test_ranks_that_own_half_the_fleet_each_send_their_part_to_every_member(actors) -> None:
    state = _state(3)
    first, second = _shards(state)
    with (
        GrpcCollector(actors, frames_per_batch=4, rank=0, world_size=2) as rank0,
        GrpcCollector(actors, frames_per_batch=4, rank=1, world_size=2) as rank1,
    ):
        assert (rank0.worker_ids, rank1.worker_ids) == ([0], [1])
        assert rank0.update_policy_weights_(first, version=6, part=(0, 2)).keys() == {0, 1}
        completed = rank1.update_policy_weights_(second, version=6, part=(1, 2))
        assert completed == {w: PartResult(PushOutcome.COMPLETED, 6, 6, 2) for w in (0, 1)}
        for collector in (rank0, rank1):  # each rank reads its own actor back
            _assert_actors_hold(collector, state, 6)


def test_a_version_whose_parts_never_complete_leaves_collection_on_the_version_in_force(
    actors,
) -> None:
    """A staged part is not the version in force: the batches acted with the one before count.

    The rank used to take a staged part for its version applied, and so dropped every
    batch of the version still in force (``MissingWorkersError`` after ``batch_timeout``).
    """
    first, _ = _shards(_state(4))
    with GrpcCollector(actors, frames_per_batch=8, sync=True, batch_timeout=5.0) as collector:
        batches = iter(collector)
        next(batches)
        staged = collector.update_policy_weights_(first, version=5, part=(0, 2))
        assert {r.outcome for r in staged.values()} == {PushOutcome.STAGED}
        for _ in range(2):  # during the staging, then after the version expired
            batch = next(batches)
            assert set(batch["policy_version"].unique().tolist()) == {0}
            time.sleep(DEADLINE + 0.3)
        stats = collector.stats("both")
        assert stats["discarded"] == 0
        assert [stats[f"worker_{w}/policy_version"] for w in (0, 1)] == [0, 0]
        assert collector.policy_versions == {"policy": 5}  # the learner's own counter
        assert collector.policy_version == 5  # the acting model's, TorchRL's int


def test_bf16_delta_parts_track_each_rank_and_fall_back_after_an_expired_version(ranks) -> None:
    rank0, rank1 = ranks
    state = _state(2)
    form = {"dtype": torch.bfloat16, "delta": True}
    for version in (1, 2):  # full parts first, then deltas on what each actor holds
        with torch.no_grad():  # a key of each rank's shard changes
            state["module.0.module.1.weight"][0, 0] += 0.5
            state["module.0.module.5.bias"][0] += 0.5
        first, second = _shards(state)
        rank0.update_policy_weights_(first, version=version, part=(0, 2), **form)
        rank1.update_policy_weights_(second, version=version, part=(1, 2), **form)
        _assert_actors_hold(rank0, {k: v.to(torch.bfloat16) for k, v in state.items()}, version)
    assert rank0.stats()["delta_pushes"] == 2  # version 2 travelled as a delta part
    # Version 3: rank 1 never sends its part, so it expires on both actors.
    rank0.update_policy_weights_(_shards(state)[0], version=3, part=(0, 2), **form)
    time.sleep(DEADLINE + 0.3)
    # Version 4: rank 0's delta builds on 3, which no actor holds: it falls back to its
    # whole part; rank 1's builds on 2, which they hold: a delta part beside a whole one.
    with torch.no_grad():
        state["module.0.module.1.bias"][1] -= 0.25
        state["module.0.module.3.weight"][1, 1] -= 0.25
    first, second = _shards(state)
    rank0.update_policy_weights_(first, version=4, part=(0, 2), **form)
    done = rank1.update_policy_weights_(second, version=4, part=(1, 2), **form)
    assert {r.outcome for r in done.values()} == {PushOutcome.COMPLETED}
    assert rank0.stats()["delta_fallbacks"] == 2
    assert rank1.stats()["delta_fallbacks"] == 0
    assert rank1.stats()["delta_pushes"] == 4
    _assert_actors_hold(rank0, {k: v.to(torch.bfloat16) for k, v in state.items()}, 4)


def test_a_refused_part_raises_with_the_workers_that_took_it(ranks, actors) -> None:
    rank0, rank1 = ranks
    first, second = _shards(_state(3))
    rank0.update_policy_weights_(first | second, version=6, part=(0, 1))
    with pytest.raises(WeightPushError) as error:
        rank1.update_policy_weights_(second, version=5, part=(1, 2))
    assert error.value.succeeded == {}
    assert all(isinstance(e, StaleVersionError) for e in error.value.failed.values())
    assert sorted(error.value.failed) == [0, 1]
    # Only worker 1 gets a part of version 7: it stages there alone.
    result = rank0.update_policy_weights_(first, version=7, part=(0, 2), worker_ids=[1])
    assert list(result) == [1]
    assert result[1].outcome is PushOutcome.STAGED
