"""GrpcCollector weight pushes on real actors: addressing, models, rejections, cadence, state."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest
import safetensors.torch
import torch
from helpers import poll_until, start_actor
from learner_fleet import cartpole_policy, start_actors
from tensordict import TensorDict
from torch import nn

from actor_service._kinds.env.pool import derive_seed
from common.config import ExplorationType
from common.errors import (
    ProtocolError,
    SessionStateError,
    UnknownModelError,
    UnknownWorkerError,
    WeightsError,
)
from learner_client import GrpcCollector, WeightPushError


def addresses(fleet, *worker_ids):
    return [fleet[w].address for w in worker_ids]


def first_batch_where(collector, predicate, limit=10):
    """Batches collected before a push are still in flight; skip them."""
    for _ in range(limit):
        batch = collector.next()
        if predicate(batch):
            return batch
    raise AssertionError(f"no batch matched within {limit} batches")


def test_update_policy_weights_changes_actions_only_on_addressed_workers(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 2),
        frames_per_batch=8,
        sync=True,
        exploration_type=ExplorationType.DETERMINISTIC,
    ) as collector:
        applied = collector.update_policy_weights_(cartpole_policy(action=0))
        version = applied[0]
        assert applied == {0: version, 2: version}
        assert collector.policy_version == version
        batch = first_batch_where(collector, lambda b: bool((b["policy_version"] == version).all()))
        assert bool((batch["action"].argmax(-1) == 0).all())

        assert collector.update_policy_weights_(cartpole_policy(action=1), worker_ids=0) == {
            0: version + 1
        }
        batch = first_batch_where(
            collector, lambda b: bool((b["policy_version"][0] > version).all())
        )
        assert bool((batch["action"][0].argmax(-1) == 1).all())  # worker_id 0: the new weights
        assert bool((batch["action"][1].argmax(-1) == 0).all())  # worker_id 2: untouched
        assert bool((batch["policy_version"][1] == version).all())
        assert collector.stats()["policy_lag_max"] >= 1


def test_update_policy_weights_raises_before_pushing_if_targets_are_unknown(fleet):
    with GrpcCollector(addresses(fleet, 0, 1), frames_per_batch=4) as collector:
        before = collector.policy_version
        with pytest.raises(UnknownWorkerError, match=r"\[5\].*\[0, 1\]"):
            collector.update_policy_weights_(cartpole_policy(), worker_ids=[0, 5])
        with pytest.raises(UnknownModelError, match=r"'critic'.*\[1\]"):
            collector.update_policy_weights_(cartpole_policy(), model_id="critic")
        with pytest.raises(ValueError, match="weights_dict and model_id"):
            collector.update_policy_weights_(
                weights_dict={"policy": cartpole_policy()}, model_id="policy"
            )
        with pytest.raises(SessionStateError, match="no weights were given"):
            collector.update_policy_weights_()
        assert collector.policy_version == before


def test_update_policy_weights_raises_at_once_if_worker_ids_are_a_hundred_thousand(fleet):
    """Ids were deduplicated pairwise (65 s for these, hours for 10^6) and every unknown one
    was listed in the message (690 kB)."""
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4) as collector:
        before = collector.policy_versions
        started = time.monotonic()
        with pytest.raises(UnknownWorkerError) as info:
            collector.update_policy_weights_(cartpole_policy(), worker_ids=range(10**5))
        assert time.monotonic() - started < 10
        message = str(info.value)
        assert len(message) < 500, message[:500]
        assert "unknown worker_ids [1, 3, 4," in message
        assert "99998 in all" in message
        assert "[0, 2]" in message
        assert collector.policy_versions == before


def test_update_policy_weights_raises_if_model_id_ends_with_a_line_break(fleet):
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4) as collector:
        before = collector.policy_versions
        with pytest.raises(ValueError, match="letters, digits") as info:
            collector.update_policy_weights_(cartpole_policy(), model_id="policy\n")
        assert not isinstance(info.value, UnknownModelError)
        assert collector.policy_versions == before


def test_update_policy_weights_without_a_model_id_updates_the_model_that_acts(fleet):
    """With ``model_id="critic"`` the collector acts with the critic and follows its ``policy=``
    module: weights given without a model_id went to ``"policy"``, while the module took them
    and counted as pushed, so the critic acted with the old weights for good."""
    with GrpcCollector(
        addresses(fleet, 0),
        frames_per_batch=8,
        sync=True,
        model_id="critic",
        policy=cartpole_policy(action=1),
        exploration_type=ExplorationType.DETERMINISTIC,
    ) as collector:
        collector.next()
        before = collector.policy_versions
        applied = collector.update_policy_weights_(cartpole_policy(action=0).state_dict())
        assert applied == {0: before["critic"] + 1}
        assert collector.policy_versions == {**before, "critic": before["critic"] + 1}
        assert collector.update_policy_weights_() == applied  # unchanged: the versions held
        assert collector.increment_version() == applied[0]
        batch = first_batch_where(
            collector, lambda b: bool((b["policy_version"] == applied[0]).all())
        )
        assert bool((batch["action"].argmax(-1) == 0).all())


def test_update_policy_weights_weights_dict_updates_several_models(fleet):
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4) as collector:
        before = collector.policy_versions
        result = collector.update_policy_weights_(
            weights_dict={"policy": cartpole_policy(), "critic": cartpole_policy()}
        )
        policy_v, critic_v = before["policy"] + 1, before["critic"] + 1
        assert result == {
            "policy": {0: policy_v, 2: policy_v},
            "critic": {0: critic_v, 2: critic_v},
        }
        only_critic = collector.update_policy_weights_(
            weights=cartpole_policy().state_dict(), model_id="critic", worker_ids=[2]
        )
        assert only_critic == {2: critic_v + 1}
        assert collector.policy_versions == {"policy": policy_v, "critic": critic_v + 1}
        assert collector.policy_version == policy_v  # the acting model's


def test_a_push_that_raises_while_it_encodes_takes_no_version_and_leaves_no_weights(fleet):
    """Every model of a call encodes before any is sent, or the call took nothing: no version
    spent, no model's last weights replaced (a later argument-less push re-sends the good)."""
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4, sync=True) as collector:
        with pytest.raises(SessionStateError, match="no weights were given for model_id 'critic'"):
            collector.update_policy_weights_(
                weights_dict={"policy": cartpole_policy(), "critic": None}
            )
        before = collector.policy_versions
        good = cartpole_policy()
        assert collector.update_policy_weights_(good, model_id="critic") == {
            0: before["critic"] + 1,
            2: before["critic"] + 1,
        }
        bad = {name: "oops" for name in good.state_dict()}
        calls = [
            dict(weights_dict={"policy": cartpole_policy(), "critic": bad}),
            dict(weights=bad, model_id="critic", delta=True),
            dict(weights=good.state_dict(), model_id="critic", delta=True, only_trainable=True),
        ]
        for call in calls:
            with pytest.raises(TypeError):
                collector.update_policy_weights_(**call)
            assert collector.policy_versions == {**before, "critic": before["critic"] + 1}
        resent = collector.update_policy_weights_(model_id="critic", delta=True)
        assert resent == {0: before["critic"] + 2, 2: before["critic"] + 2}
        held = collector.actor_state(0)["models"]["critic"]["weights"]
        for name, tensor in good.state_dict().items():
            torch.testing.assert_close(held[name], tensor)


def test_update_policy_weights_reports_rejections_without_hiding_successes(fleet):
    with GrpcCollector(addresses(fleet, 0, 1, 2), frames_per_batch=12, sync=True) as collector:
        with pytest.raises(WeightPushError, match="worker_id 1") as info:
            collector.update_policy_weights_(cartpole_policy())
        error = info.value
        assert set(error.failed) == {1}
        assert isinstance(error.failed[1], WeightsError)
        version = collector.policy_version
        assert error.succeeded == {0: version, 2: version}
        narrow = collector.update_policy_weights_(cartpole_policy(hidden=[16]), worker_ids=1)
        assert narrow == {1: version + 1}
        # None re-sends the last weights given for the model (now the narrow ones).
        assert collector.update_policy_weights_(worker_ids=[1]) == {1: version + 2}
        assert collector.next()["collector", "worker_id"][:, 0, 0].tolist() == [0, 1, 2]


def test_weights_some_targets_took_stay_the_last_given_and_are_not_followed(fleet, caplog):
    """Weights refused by one target but taken by others are the last weights given (an
    argument-less push re-sends them), and a push that failed anywhere is not followed:
    TorchRL's ``increment_version()`` pushes again instead of taking the actors as current.
    A refused push is not what the refusing actor should hold: its share still counts."""
    with GrpcCollector(
        addresses(fleet, 0, 1, 2), frames_per_batch=12, sync=True, batch_timeout=5
    ) as collector:
        with pytest.raises(WeightPushError, match="worker_id 1"):
            collector.update_policy_weights_(cartpole_policy())  # worker 1 is narrower
        version = collector.policy_version
        with pytest.raises(WeightPushError, match="worker_id 1") as info:
            collector.increment_version()
        assert info.value.succeeded == {0: version + 1, 2: version + 1}
        assert collector.update_policy_weights_(worker_ids=[0, 2]) == {
            0: version + 2,
            2: version + 2,
        }
        batch = first_batch_where(collector, lambda b: (b["policy_version"] > version).any())
        assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 1, 2]
    # Nor is it re-sent to the actor that refused it (which refuses it again).
    assert not [r for r in caplog.records if "re-admission" in r.getMessage()]


def test_an_explicit_version_the_actors_hold_already_is_refused_before_sending(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        version = collector.update_policy_weights_(cartpole_policy())[0]
        sent = collector.stats()["push_bytes"]
        with pytest.raises(ValueError, match="versions only go up"):
            collector.update_policy_weights_(cartpole_policy(), version=version)
        assert collector.stats()["push_bytes"] == sent
        assert collector.update_policy_weights_(cartpole_policy(), version=version + 1) == {
            0: version + 1
        }


@pytest.mark.parametrize(
    "empty",
    [TensorDict(), TensorDict({"module": TensorDict()}, batch_size=[]), {"module": {}}],
    ids=["TensorDict()", "nested TensorDict", "nested dict"],
)
def test_update_policy_weights_raises_if_the_weights_hold_no_tensor(fleet, empty):
    """Weights without a tensor change nothing: they were sent, the actors applied the empty
    subset and a new version was installed over the same weights. Now refused before
    anything is sent, in every form, and no version moves (on the learner or the actors)."""
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=8, sync=True) as collector:
        collector.update_policy_weights_(cartpole_policy())
        before = collector.policy_versions
        sent = collector.stats()["push_bytes"]
        for call, whose in [
            (dict(policy_or_weights=empty), "model_id 'policy'"),
            (dict(weights=empty, delta=True), "model_id 'policy'"),
            (dict(weights_dict={"policy": empty}), "model_id 'policy'"),
            (dict(policy_or_weights={0: empty}), "worker_id 0"),
        ]:
            with pytest.raises(ValueError, match=f"given for {whose} hold no tensor"):
                collector.update_policy_weights_(**call)
        assert collector.policy_versions == before
        assert collector.stats()["push_bytes"] == sent
        batch = collector.next()
        assert batch["policy_version"].unique().tolist() == [before["policy"]]


@pytest.mark.parametrize("shared", [False, True], ids=["weights", "policy="])
def test_update_policy_weights_raises_naming_the_fix_if_a_weight_has_no_values(fleet, shared):
    """Weights of a lazy module not yet run (TorchRL's ``MLP`` builds ``LazyLinear``s), sparse
    or meta tensors: torch's own errors came out of the learner's change tracking ("Attempted
    to use an uninitialized parameter in numel", "Cannot access data pointer"), and with
    ``policy=`` out of the copy into the module ("Cannot copy out of meta tensor"), which
    had copied the keys before the meta one: the module, half updated, was pushed next."""
    lazy = nn.Sequential(nn.LazyLinear(2), nn.LazyBatchNorm1d())
    policy = cartpole_policy()
    before = {name: t.clone() for name, t in policy.state_dict().items()}
    half_meta = {name: torch.zeros_like(t) for name, t in before.items()}
    last = list(before)[-1]
    half_meta[last] = torch.zeros(before[last].shape, device="meta")
    calls = [
        lazy,
        TensorDict.from_module(lazy),
        lazy.state_dict(),
        {name: nn.UninitializedParameter() for name in before},
        {name: t.to_sparse() for name, t in before.items()},
        half_meta,
    ]
    with GrpcCollector(
        addresses(fleet, 0), policy=policy if shared else None, frames_per_batch=4, sync=True
    ) as collector:
        collector.update_policy_weights_(policy)
        versions = collector.policy_versions
        for weights in calls:
            with pytest.raises(
                TypeError, match=r"uninitialised parameter: run|only dense|meta device and has no"
            ):
                collector.update_policy_weights_(weights)
        assert collector.policy_versions == versions
        for name, tensor in policy.state_dict().items():
            assert torch.equal(tensor, before[name]), name
        batch = collector.next()
    assert batch["policy_version"].unique().tolist() == [versions["policy"]]


def test_weights_every_target_refuses_are_not_the_last_weights_given(fleet):
    """Not-finite weights refused by every actor: an argument-less push re-sends the last
    good weights, not the refused ones (each refused push spends its version number)."""
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4, sync=True) as collector:
        good = cartpole_policy()
        version = collector.update_policy_weights_(good)[0]
        bad = cartpole_policy()
        with torch.no_grad():
            next(bad.parameters()).fill_(float("nan"))
        for _ in range(3):
            with pytest.raises(WeightPushError, match="finite") as info:
                collector.update_policy_weights_(bad)
            assert info.value.succeeded == {}
        resent = collector.update_policy_weights_()
        assert resent == {0: version + 4, 2: version + 4}
        batch = first_batch_where(collector, lambda b: (b["policy_version"] > version).all())
        assert collector.stats()["policy_lag"] == 0
        with torch.no_grad():
            expected = good(batch["observation"][0, 0])[0]
            torch.testing.assert_close(batch["logits"][0, 0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.long  # two actor starts: 6-7 s on 2 loaded cores
def test_an_actor_back_with_a_model_that_refuses_its_push_acts_with_its_own(caplog):
    """A worker's actor replaced by one whose model refuses the push it should hold: the
    push is dropped on re-admission (logged once), not kept as what the worker must act
    with, so its sync share counts with its own weights."""
    first = start_actor(["--worker-id", "0", "--num-envs", "1", "--seed", "0"])
    port, second = first.port, None
    try:
        with GrpcCollector(
            [first.address], frames_per_batch=4, sync=True, batch_timeout=5
        ) as collector:
            version = collector.update_policy_weights_(cartpole_policy())[0]
            assert collector.next()["policy_version"].unique().tolist() == [version]
            first.close()
            narrow = ["--policy-kwargs", '{"hidden": [16]}', "--port", str(port)]
            second = start_actor(["--worker-id", "0", "--num-envs", "1", "--seed", "1", *narrow])
            assert collector.next()["policy_version"].unique().tolist() == [0]
            assert collector.next()["policy_version"].unique().tolist() == [0]
        rejected = [r for r in caplog.records if "on re-admission" in r.getMessage()]
        assert len(rejected) == 1
    finally:
        first.close()
        if second is not None:
            second.close()


def test_torchrls_deprecated_policy_weights_keyword_pushes_with_a_warning(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        version = collector.policy_version
        with pytest.warns(DeprecationWarning, match="policy_weights is deprecated"):
            assert collector.update_policy_weights_(policy_weights=cartpole_policy()) == {
                0: version + 1
            }
        with pytest.raises(ValueError, match="pass the weights once"):
            collector.update_policy_weights_(cartpole_policy(), policy_weights=cartpole_policy())


def test_update_after_each_batch_pushes_before_every_sync_round(fleet):
    policy = cartpole_policy(action=0)
    with GrpcCollector(
        addresses(fleet, 0, 2),
        frames_per_batch=8,
        sync=True,
        update_after_each_batch=True,
        exploration_type=ExplorationType.DETERMINISTIC,
    ) as collector:
        version = collector.update_policy_weights_(policy)[0]
        versions = [collector.next()["policy_version"].unique().tolist() for _ in range(4)]
        assert versions == [[version], [version + 1], [version + 2], [version + 3]]
        assert collector.stats()["auto_pushes"] == 3
        with torch.no_grad():  # train in place: the next automatic push must carry it
            [m for m in policy.modules() if isinstance(m, torch.nn.Linear)][-1].bias[:] = (
                torch.tensor([0.0, 5.0])
            )
        assert bool((collector.next()["action"].argmax(-1) == 1).all())


def test_an_automatic_push_every_actor_refuses_raises_instead_of_being_only_logged(fleet):
    policy = cartpole_policy()
    with GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, sync=True, update_after_each_batch=True
    ) as collector:
        collector.update_policy_weights_(policy)
        collector.next()
        with torch.no_grad():  # training diverged in place: the next automatic push is refused
            next(policy.parameters()).fill_(float("nan"))
        with pytest.raises(WeightPushError, match="finite"):
            collector.next()


def test_max_weight_update_interval_pushes_after_more_than_interval_batches(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, sync=True, max_weight_update_interval=1
    ) as collector:
        version = collector.update_policy_weights_(cartpole_policy())[0]
        versions = [int(collector.next()["policy_version"].max()) - version for _ in range(5)]
    assert versions == [0, 0, 1, 1, 2]


def test_update_after_each_batch_async_updates_the_worker_that_delivered(fleet):
    with GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, update_after_each_batch=True
    ) as collector:
        version = collector.update_policy_weights_(cartpole_policy())[0]
        seen = [int(collector.next()["policy_version"].max()) for _ in range(6)]
        assert seen == sorted(seen)
        assert seen[-1] > version
        assert collector.policy_version == version + 5  # before batches 2..6


def test_update_after_each_batch_async_leaves_the_workers_that_did_not_deliver_alone(fleet):
    """Async (TorchRL's RayCollector): only the worker whose batch was yielded is updated."""
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=4, update_after_each_batch=True
    ) as collector:
        version = collector.update_policy_weights_(cartpole_policy())[0]
        delivered = int(collector.next()["collector", "worker_id"].flatten()[0])
        collector.next()  # pushed to ``delivered`` alone before it
        stats = collector.stats("both")
        held = {w: stats[f"worker_{w}/policy_version"] for w in (0, 2)}
    assert held == {w: version + (w == delivered) for w in (0, 2)}
    assert stats["auto_pushes"] == 1


def test_a_policy_pushed_to_some_workers_still_reaches_the_others_before_the_next_batch(fleet):
    policy = cartpole_policy()
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=8, sync=True, policy=policy) as c:
        c.next()
        with torch.no_grad():  # trained in place, then pushed to worker 0 alone
            next(policy.parameters()).add_(1.0)
        version = c.update_policy_weights_(worker_ids=[0])[0]
        batch = c.next()  # worker 2 must get the trained module first
        assert batch["policy_version"][1].unique().tolist() == [version + 1]


def test_state_dict_round_trips_counters_and_actor_weights(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=16, sync=True
    ) as collector:
        collector.update_policy_weights_(cartpole_policy(action=0))
        assert len(list(collector)) == 2
        buffer = io.BytesIO()
        torch.save(collector.state_dict(), buffer)
        saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        assert sorted(saved["workers"]) == [0, 2]
        weights = {w: _policy_weights(t) for w, t in saved["workers"].items()}
        assert all(weights.values())

        collector.update_policy_weights_(cartpole_policy(action=1))
        pushed = collector.policy_version
        changed = _policy_weights(collector.state_dict()["workers"][0])
        assert not all(torch.equal(changed[k], weights[0][k]) for k in changed)
        collector.load_state_dict(saved)
        restored = collector.state_dict()
        assert (restored["frames"], restored["batches"]) == (16, 2)
        for wid, tensors in weights.items():
            now = _policy_weights(restored["workers"][wid])
            assert now.keys() == tensors.keys()
            assert all(torch.equal(now[k], tensors[k]) for k in tensors)
        assert collector.policy_version >= pushed  # the learner never goes back
        version = collector.update_policy_weights_(cartpole_policy())[0]
        assert version == collector.policy_version


def test_load_state_dict_checks_everything_before_it_applies_anything(fleet):
    """A bad entry used to leave the counters restored and a bad version in the book."""
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=8, sync=True) as collector:
        collector.next()
        saved = collector.state_dict()
        before = (collector.policy_version, collector.stats()["frames"])
        bad = [
            ({"workers": {0: b"\x00" * 100}, "policy_version": {"policy": 1000}}, WeightsError),
            ({"policy_version": {5: 1}}, ValueError),  # then every stats() raised TypeError
            ({"policy_version": {"policy": 10**30}}, ValueError),  # then every push failed
            ({"policy_version": None}, ValueError),
            ({"frames": -(10**30)}, ValueError),
            ({"workers": {"abc": saved["workers"][0]}}, ValueError),
            ({"workers": {0: torch.empty(4, dtype=torch.uint8, device="meta")}}, TypeError),
            ({"workers": {0: saved["workers"][0][:-100]}}, WeightsError),  # cut short
            ({"policy_version": {"policy": 1, "value": 7}}, ValueError),  # another fleet's
        ]
        for override, error in bad:
            with pytest.raises(error):
                collector.load_state_dict({**saved, "frames": 123_456, **override})
            assert (collector.policy_version, collector.stats()["frames"]) == before, override
        with pytest.raises(WeightsError) as cut:
            collector.load_state_dict({**saved, "workers": {0: saved["workers"][0][:-100]}})
        assert "INVALID_ARGUMENT" not in str(cut.value)  # refused here, no actor was asked
        partial = {k: v for k, v in saved.items() if k != "workers"}
        with pytest.raises(ValueError, match=r"lacks keys \['workers'\]"):
            collector.load_state_dict(partial)
        collector.load_state_dict(saved)  # the honest state still loads
        assert collector.next().numel() == 8


def test_load_state_dict_raises_type_error_naming_a_state_that_is_not_a_mapping(fleet):
    """A list of per-actor states (TorchRL's RayCollector's) used to raise "dictionary update
    sequence element #0 has length 19832; 2 is required", and None "not iterable"."""
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=8, sync=True) as collector:
        collector.next()
        saved = collector.state_dict()
        before = (collector.policy_version, collector.stats()["frames"])
        for workers in ([saved["workers"][0]], None, "0"):
            with pytest.raises(TypeError, match=r"state_dict\['workers'\] must map worker_ids"):
                collector.load_state_dict({**saved, "frames": 123_456, "workers": workers})
        for state in ([saved], None):
            with pytest.raises(TypeError, match=r"takes the dict state_dict\(\) returned"):
                collector.load_state_dict(state)
        assert (collector.policy_version, collector.stats()["frames"]) == before
        collector.load_state_dict(saved)


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_a_checkpoint_one_actor_refuses_leaves_every_actor_as_it_was():
    """Worker 1 refuses its blob (another kind of actor's); worker 0, which loaded its own,
    is given back the state it held: it used to stay rolled back, with an error raised."""
    actors = start_actors(
        [
            ["--worker-id", "0", "--num-envs", "2"],
            ["--worker-id", "1", "--num-envs", "2"],
            ["--worker-id", "1", "--num-envs", "2", "--kind", "torchrl"],
        ]
    )
    try:
        with GrpcCollector([actors[2].address], frames_per_batch=4) as other:
            other.next()
            alien = other.state_dict()["workers"][1]
        with GrpcCollector(
            [a.address for a in actors[:2]], frames_per_batch=8, sync=True
        ) as collector:
            saved = _checkpoint_then_move_on(collector)
            before = collector.state_dict()
            with pytest.raises(ProtocolError, match="another kind of actor"):
                collector.load_state_dict({**saved, "workers": {0: saved["workers"][0], 1: alien}})
            after = collector.state_dict()
            assert after["policy_version"] == before["policy_version"] == {"policy": 2}
            assert (after["frames"], after["batches"]) == (before["frames"], before["batches"])
            assert {int(b["policy_version"].min()) for b in collector.next().unbind(0)} == {2}
            for wid in (0, 1):  # the weights pushed last, on both
                held, pushed = _policy_weights(after["workers"][wid]), before["workers"][wid]
                assert all(torch.equal(v, _policy_weights(pushed)[k]) for k, v in held.items())
    finally:
        for actor in actors:
            actor.close()


@pytest.mark.long  # 4-6 s: an actor of its own, stopped
def test_a_ctrl_c_during_a_checkpoints_load_is_raised_once_it_is_loaded_whole():
    """The load went on without the interrupted caller: the actor took the checkpoint, the
    learner's counters and versions did not, and the actor's batches never came again."""
    actors = start_actors([["--worker-id", "0", "--num-envs", "2"]])
    pid, main = actors[0].process.pid, threading.main_thread().ident
    try:
        with GrpcCollector(
            [actors[0].address], frames_per_batch=8, sync=True, call_timeout=20, batch_timeout=10
        ) as collector:
            saved = _checkpoint_then_move_on(collector)
            os.kill(pid, signal.SIGSTOP)  # the load waits on it; a Ctrl-C comes meanwhile
            threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
            threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
            with pytest.raises(KeyboardInterrupt):
                collector.load_state_dict(saved)
            assert collector.stats()["frames"] == 8
            batch = collector.next()
            assert batch["policy_version"].unique().tolist() == [1]
    finally:
        os.kill(pid, signal.SIGCONT)
        for actor in actors:
            actor.close()


def _checkpoint_then_move_on(collector: GrpcCollector) -> dict:
    """Collect under weights that always act 0, keep that checkpoint, then collect a batch
    under weights that always act 1 (versions 1 and 2): the checkpoint is the one returned."""
    collector.update_policy_weights_(cartpole_policy(action=0))
    collector.next()
    saved = collector.state_dict()
    collector.update_policy_weights_(cartpole_policy(action=1))
    collector.next()
    return saved


def _policy_weights(blob: torch.Tensor) -> dict[str, torch.Tensor]:
    state = safetensors.torch.load(blob.numpy().tobytes())
    return {k: v for k, v in state.items() if k.startswith("models/policy/")}


def _collect(fleet, seed):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=16, total_frames=32, sync=True
    ) as collector:
        next_seed = collector.set_seed(seed)
        return next_seed, torch.stack(list(collector))


def test_set_seed_gives_identical_sync_batches(fleet):
    seed_a, first = _collect(fleet, 123)
    seed_b, second = _collect(fleet, 123)
    assert seed_a == seed_b
    assert seed_a != 123
    for key in ["observation", "action", ("next", "reward"), ("next", "observation")]:
        assert torch.equal(first[key], second[key]), key
    _, other = _collect(fleet, 124)
    assert not torch.equal(first["observation"], other["observation"])


def test_set_seed_chains_each_actors_returned_seed_into_the_next_in_worker_id_order(fleet):
    """Two actors of two envs: four links of the seed chain, as TorchRL's set_seed gives
    them, so no two envs share a seed; a static seed is every actor's and is returned."""
    with GrpcCollector(addresses(fleet, 2, 0), frames_per_batch=8, sync=True) as collector:
        expected = 123
        for _ in range(4):
            expected = derive_seed(expected)
        assert collector.set_seed(123) == expected
        first = collector.next()
        assert first["collector", "worker_id"][:, 0, 0].tolist() == [0, 2]
        obs = first["observation"][:, :, 0]  # each env's first observation
        assert len({tuple(o.tolist()) for o in obs.flatten(0, 1)}) == 4
        assert collector.set_seed(123, static_seed=True) == 123


def test_the_last_int64_version_is_pushed_and_the_next_push_is_refused_on_the_learner():
    """A push at 2**63 - 1 (the last version an actor takes) works; the next one has no
    version: ValueError before anything is sent, the counter and the actor's weights stay.
    Its own actor: the shared fleet's would keep the spent counter."""
    (actor,) = start_actors([["--worker-id", "0", "--num-envs", "2"]])
    try:
        with GrpcCollector([actor.address], frames_per_batch=4) as collector:
            last = 2**63 - 1
            pushed = collector.update_policy_weights_(cartpole_policy(action=0), version=last)
            assert pushed == {0: last}
            with pytest.raises(ValueError, match="no later version exists"):
                collector.update_policy_weights_(cartpole_policy(action=1))
            assert collector.policy_version == last
            assert collector.actor_state(0)["models"]["policy"]["version"] == last
            batch = collector.next()
            assert batch["policy_version"].min().item() == last
    finally:
        actor.close()


def test_a_sync_batch_after_a_checkpoint_restore_acts_with_the_restored_weights(fleet):
    """A restore takes the actors back: on-demand sync rounds count their shares at the
    restored version (the pushes made since are not what they should hold any more)."""
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, sync=True, batch_timeout=10
    ) as collector:
        collector.update_policy_weights_(cartpole_policy(action=0))
        saved_at = collector.next()["policy_version"].max().item()
        saved = collector.state_dict()
        collector.update_policy_weights_(cartpole_policy(action=1))
        assert collector.next()["policy_version"].min().item() > saved_at
        collector.load_state_dict(saved)
        batch = collector.next()
        assert sorted(set(batch["policy_version"].flatten().tolist())) == [saved_at]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_an_actor_that_joins_is_given_the_latest_push_before_its_frames_count(sync):
    """A joiner (add_collectors, or a dns: name listing it) starts with its own weights:
    the latest push is sent to it first, so no batch holds its version-0 frames."""
    first, joiner = start_actors([["--worker-id", str(w), "--num-envs", "2"] for w in (5, 6)])
    try:
        with GrpcCollector(
            [first.address], frames_per_batch=8, sync=sync, batch_timeout=30
        ) as collector:
            policy = cartpole_policy()
            version = collector.update_policy_weights_(policy)[5]
            collector.add_collectors([joiner.address])
            frames_of = {5: 0, 6: 0}
            while frames_of[6] < 16:
                batch = collector.next()
                for worker in (5, 6):
                    mine = batch[batch["collector", "worker_id"] == worker]
                    assert (mine["policy_version"] == version).all(), (worker, sync)
                    frames_of[worker] += mine.numel()
            assert collector.actor_state(6)["models"]["policy"]["version"] == version
            with torch.no_grad():
                joined = batch[batch["collector", "worker_id"] == 6]
                expected = policy(joined["observation"][:1])[0]
            torch.testing.assert_close(joined["logits"][:1], expected, rtol=1e-4, atol=1e-4)
    finally:
        first.close()
        joiner.close()


def test_a_push_while_the_background_thread_pushes_automatically_is_never_overtaken(
    fleet, monkeypatch
):
    """start() with update_after_each_batch: the background thread's automatic push read the
    last weights given (action 0) when the user pushed new ones (action 1) from their own
    thread. The automatic push took its version after the user's, so the actor acted with the
    old weights under the newest version, though the user's push had returned."""
    stored: list = []
    buffer = type("Buffer", (), {"extend": lambda self, part: stored.append(part)})()
    collector = GrpcCollector(
        addresses(fleet, 0),
        frames_per_batch=4,
        sync=True,
        update_after_each_batch=True,
        exploration_type=ExplorationType.DETERMINISTIC,
        replay_buffer=buffer,
    )
    read, release = threading.Event(), threading.Event()
    source_for = collector._book.source_for

    def held_after_reading(model_id, worker_id):
        source = source_for(model_id, worker_id)
        if threading.current_thread().name == "rlfleet-collector" and not read.is_set():
            read.set()  # the automatic push holds the old weights, its version not yet taken
            release.wait(30)
        return source

    try:
        collector.update_policy_weights_(cartpole_policy(action=0))
        monkeypatch.setattr(collector._book, "source_for", held_after_reading)
        collector.start()
        assert read.wait(30)
        returned: list = []
        pushing = threading.Thread(
            target=lambda: returned.append(collector.update_policy_weights_(cartpole_policy(1)))
        )
        pushing.start()
        pushing.join(2.0)  # it returns at once, or waits its turn behind the automatic push
        release.set()
        pushing.join(30)
        version = returned[0][0]
        poll_until(
            lambda: any(int(p["policy_version"].min()) > version for p in stored[:]),
            timeout=30,
            message="batches after the push",
        )
        after = [p for p in stored[:] if int(p["policy_version"].min()) >= version]
        assert all(bool((p["action"].argmax(-1) == 1).all()) for p in after), [
            (int(p["policy_version"].min()), p["action"].argmax(-1).tolist()) for p in after
        ]
    finally:
        release.set()
        collector.shutdown()
