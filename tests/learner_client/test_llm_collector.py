"""GrpcLLMCollector against a LocalFleet of LLM actors: modes, budgets, groups, versions, faults."""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
import types
import warnings

import pytest
import torch
from helpers import poll_until
from learner_fleet import ACTOR_ENV, TINY_LLM, start_actors, tiny_llm_collector, tiny_llm_fleet
from tensordict import TensorDict

import learner_client._llm_collector as llm_collector
from common.errors import EnvError
from learner_client import GrpcLLMCollector, LocalFleet, SettingsRefusedError

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

SLOTS = 4


@pytest.fixture(scope="module")
def llm_fleet():
    with tiny_llm_fleet(2, SLOTS, retries=1) as fleet:
        yield fleet


_collector = tiny_llm_collector


def _groups_whole(batch, size: int) -> bool:
    done = batch["next", "done"].reshape(-1)
    groups = batch["collector", "group_id"].reshape(-1)[done].tolist()
    return all(groups.count(g) == size for g in groups)


@pytest.mark.long
def test_sync_steps_mode_yields_slots_by_turns_with_an_exact_budget(llm_fleet) -> None:
    with _collector(
        llm_fleet, dialog_turns_per_batch=2 * SLOTS * 2, total_dialog_turns=32, sync=True
    ) as collector:
        batches = list(collector)
        stats = collector.stats()
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == (2 * SLOTS, 2)
        assert batch[0, 0]["tokens", "full"].dtype == torch.int64
        assert sorted(set(batch["collector", "worker_id"].reshape(-1).tolist())) == [0, 1]
    assert stats["turns"] == stats["yielded_turns"] == 32  # every turn of [slots, T] batches
    assert stats["tokens"] > 0
    assert stats["tokens_per_s"] > 0


def test_flatten_data_makes_a_steps_batch_one_row_per_turn(llm_fleet) -> None:
    """``flatten_data=True``: a sync ``[slots, T]`` batch of T > 1 comes as ``[slots * T]``,
    slot by slot: a slot's second turn goes on its dialog or starts a new one."""
    with _collector(
        llm_fleet, dialog_turns_per_batch=2 * SLOTS * 2, total_dialog_turns=16, sync=True,
        flatten_data=True, layout="padded",
    ) as collector:  # fmt: skip
        batch = collector.next()
    assert batch.batch_size == (2 * SLOTS * 2,)
    traj = batch["collector", "traj_ids"].reshape(2 * SLOTS, 2)
    turns = batch["collector", "dialog_turns"].reshape(2 * SLOTS, 2)
    goes_on = (traj[:, 0] == traj[:, 1]) & (turns[:, 1] == turns[:, 0] + 1)
    assert (goes_on | (turns[:, 1] == 1)).all()


def test_async_completed_trajectories_hold_whole_groups(llm_fleet) -> None:
    with _collector(
        llm_fleet,
        dialog_turns_per_batch=4,
        total_dialog_turns=24,
        yield_completed_trajectories=True,
        group_size=2,
    ) as collector:
        batches = list(collector)
        stats = collector.stats()
    assert sum(b.numel() for b in batches) == stats["turns"] >= 24
    assert stats["turns"] - batches[-1].numel() < 24  # it stopped at the first batch reaching it
    for batch in batches:
        assert batch.ndim == 1
        assert batch.get("policy_version", None) is None  # track_policy_version=False
        assert batch.get(("next", "policy_version"), None) is None
        assert bool(batch[-1]["next", "done"])  # whole dialogs only
        assert _groups_whole(batch, 2)
        assert len(set(batch["collector", "worker_id"].tolist())) == 1  # one actor per group


def test_last_steps_count_the_dropped_turns(llm_fleet) -> None:
    with _collector(
        llm_fleet,
        dialog_turns_per_batch=4,
        total_dialog_turns=16,
        yield_only_last_steps=True,
        layout="padded",
    ) as collector:
        batches = list(collector)
        stats = collector.stats()
    ran = [int(b["collector", "dialog_turns"].sum()) for b in batches]
    assert stats["turns"] == sum(ran) >= 16
    assert sum(ran[:-1]) < 16  # it stopped at the first batch reaching the budget
    assert all(b["next", "done"].all() for b in batches)


def test_sync_whole_dialogs_raise_if_the_default_turns_do_not_split_naming_the_fix(
    llm_fleet,
) -> None:
    """TorchRL's default of one turn per batch with ``yield_completed_trajectories`` cannot be
    split over two sync actors: the error names the turns that split, not only the default."""
    with pytest.raises(ValueError, match=r"use dialog_turns_per_batch=2 \(multiples of 2"):
        _collector(llm_fleet, yield_completed_trajectories=True, sync=True)
    with _collector(llm_fleet, yield_completed_trajectories=True, sync=True,
                    dialog_turns_per_batch=2, total_dialog_turns=2) as collector:  # fmt: skip
        assert next(iter(collector)).numel() >= 2


def test_a_push_between_sync_batches_makes_the_next_batch_the_new_version(llm_fleet) -> None:
    from common.llm import build_policy

    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY_LLM, "seed": 5})
    with _collector(
        llm_fleet,
        dialog_turns_per_batch=2 * SLOTS,
        total_dialog_turns=-1,
        sync=True,
        track_policy_version=True,
    ) as collector:
        iterator = iter(collector)
        next(iterator)
        applied = collector.update_policy_weights_(model)
        version = collector.policy_version
        assert set(applied.values()) == {version}
        # TorchRL's vLLM updaters push, then increment: the model travels once.
        sent = collector.stats()["push_bytes"]
        assert collector.increment_version() == version
        assert collector.stats()["push_bytes"] == sent
        batch = next(iterator)
        assert (batch["policy_version"] == version).all()
        assert collector.get_policy_version() == version
        with torch.no_grad():
            next(model.parameters()).mul_(0.5)  # an optimiser step: the increment pushes it
        assert collector.increment_version() == version + 1
        assert collector.stats()["push_bytes"] > sent
        # TorchRL's names for the budget, as its Trainer reads them: endless is inf
        assert collector.total_dialog_turns == collector.total_frames == float("inf")
        assert collector.frames_per_batch == collector.requested_frames_per_batch == 2 * SLOTS


def test_the_same_seed_gives_the_same_first_batch(llm_fleet) -> None:
    firsts = []
    for _ in range(2):
        with _collector(
            llm_fleet,
            dialog_turns_per_batch=2 * SLOTS,
            total_dialog_turns=8,
            sync=True,
            layout="padded",
            generation={"max_new_tokens": 3, "temperature": 1.0},
        ) as collector:
            collector.set_seed(7)
            firsts.append(next(iter(collector)))
    assert torch.equal(firsts[0]["tokens"], firsts[1]["tokens"])
    assert torch.equal(firsts[0]["log_probs"], firsts[1]["log_probs"])


def test_grpo_loss_and_mc_advantage_from_two_async_actors(llm_fleet) -> None:
    from torchrl.data import LazyStackStorage, ReplayBuffer
    from torchrl.modules.llm import TransformersWrapper
    from torchrl.objectives.llm import GRPOLoss, MCAdvantage

    from common.llm import build_policy

    group = 2
    advantage = MCAdvantage(grpo_size=group, prompt_key=("collector", "group_id"))
    rb = ReplayBuffer(storage=LazyStackStorage(1000), transform=advantage, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _collector(
            llm_fleet,
            dialog_turns_per_batch=4,
            total_dialog_turns=24,
            yield_completed_trajectories=True,
            group_size=group,
            generation={"max_new_tokens": 3, "temperature": 1.0},
            replay_buffer=rb,
        ) as collector:
            model, tok = build_policy("rlfleet:tiny-qwen2", **TINY_LLM)
            collector.update_policy_weights_(model)  # the learner's weights generate
            yielded = list(collector)
            turns = collector.stats()["yielded_turns"]
        assert all(item is None for item in yielded)
        assert len(rb) == turns  # every group completed: nothing held back
        sample = rb.sample()
        actor = TransformersWrapper(
            model,
            tokenizer=tok,
            input_mode="tokens",
            generate=False,
            pad_output=False,
            return_log_probs=True,
        )
        out = GRPOLoss(actor, masking_strategy="sft")(sample)
    assert float(out.clip_fraction) == 0.0
    assert abs(float(out.kl_approx)) < 1e-5
    (out.loss_objective + out.loss_entropy).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_sync_iter_true_collects_each_batch_when_asked_for(llm_fleet) -> None:
    """RayLLMCollector's ``sync_iter=True`` is ``sync=True``: every batch after a push is
    the pushed version's (it was silently the async mode, one batch behind)."""
    from common.llm import build_policy

    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY_LLM, "seed": 6})
    with _collector(
        llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync_iter=True, track_policy_version=True
    ) as collector:
        iterator = iter(collector)
        next(iterator)
        for _ in range(2):
            with torch.no_grad():
                next(model.parameters()).mul_(0.9)
            collector.update_policy_weights_(model)
            batch = next(iterator)
            assert (batch["policy_version"] == collector.policy_version).all()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"policy": object()}, "generation="),
        ({"verbose": True}, "verbose=True"),
        ({"num_gpus": 1}, "num_gpus=1"),
        ({"async_envs": True}, "async_envs=True"),
        ({"remote_config": {"num_cpus": 1}}, "started apart"),
    ],
)
def test_torchrl_arguments_without_effect_warn_naming_what_to_do(llm_fleet, kw, match) -> None:
    with pytest.warns(UserWarning, match=match):
        collector = _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, **kw)
    collector.shutdown()


def test_shutdown_ends_a_put_waiting_for_room_and_nothing_is_put_after(llm_fleet) -> None:
    """A consumer stopped draining a bounded queue ("block"): shutdown returns at once, the
    thread ends, and draining the queue afterwards lets nothing more in."""
    sink: queue.Queue = queue.Queue(maxsize=2)
    collector = _collector(llm_fleet, dialog_turns_per_batch=SLOTS, queue=sink)
    collector.start()
    poll_until(sink.full, timeout=60, interval=0.05)
    time.sleep(0.3)  # the background thread now waits for room
    started = time.monotonic()
    collector.shutdown()
    assert time.monotonic() - started < 5
    assert not collector.is_running()
    sink.get_nowait()
    sink.get_nowait()
    time.sleep(0.5)
    assert sink.qsize() == 0


def test_the_modes_read_as_resolved_and_an_increment_before_any_push_does_nothing(
    llm_fleet,
) -> None:
    def postproc(batch):
        return batch

    with _collector(
        llm_fleet, dialog_turns_per_batch=4, yield_only_last_steps=True, postproc=postproc
    ) as collector:
        assert collector.yield_only_last_steps
        assert collector.yield_completed_trajectories  # forced by the former, as TorchRL's
        assert not collector.flatten_data
        assert not collector.reset_at_each_iter
        assert collector.postproc is postproc
        held = collector.policy_version  # what the module's fleet was pushed before
        assert collector.increment_version() == held  # no weights given here: nothing sent
        assert collector.stats()["push_bytes"] == 0


def test_a_full_queue_blocks_instead_of_dropping(llm_fleet) -> None:
    sink: queue.Queue = queue.Queue(maxsize=1000)
    with _collector(
        llm_fleet, dialog_turns_per_batch=2 * SLOTS, total_dialog_turns=16, sync=True, queue=sink
    ) as collector:
        assert list(collector) == [None, None]
        assert collector.stats()["queue_dropped"] == 0
    assert sink.qsize() == 16  # flattened: one item per turn


def test_drop_oldest_queue_counts_drops(llm_fleet) -> None:
    sink: queue.Queue = queue.Queue(maxsize=3)
    with _collector(
        llm_fleet,
        dialog_turns_per_batch=2 * SLOTS,
        total_dialog_turns=8,
        sync=True,
        queue=sink,
        queue_overflow="drop_oldest",
    ) as collector:
        list(collector)
        assert collector.stats()["queue_dropped"] == 5
    assert sink.qsize() == 3


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"generation": {"do_sample": True}}, "unknown generation keys"),
        ({"layout": "ragged"}, "layout"),
        ({"dialog_turns_per_batch": None}, "required"),
        ({"max_frames_per_traj": 5}, "max_frames_per_traj=5 .*max_turns"),
        ({"split_trajs": True, "init_random_frames": 8}, "init_random_frames=8, split_trajs"),
        ({"set_truncated": True}, "set_truncated"),
        ({"dialog_turns_per_batch": 0}, "dialog_turns_per_batch must be a positive int"),
        ({"total_dialog_turns": 2**64}, "total_dialog_turns must be at most 2..63 - 1"),
        ({"sync": False, "sync_iter": True}, "sync=False and sync_iter=True disagree"),
    ],
)
def test_bad_knobs_raise_value_error_before_connecting(kw, match) -> None:
    """Each bad knob is refused before any actor is dialled, naming the knob."""
    kw.setdefault("dialog_turns_per_batch", 4)
    if kw["dialog_turns_per_batch"] is None:
        del kw["dialog_turns_per_batch"]
    with pytest.raises(ValueError, match=match):
        GrpcLLMCollector(["127.0.0.1:1"], **kw)


def _sink(name: str) -> object:
    from torchrl.data import LazyStackStorage, ReplayBuffer

    return queue.Queue() if name == "queue" else ReplayBuffer(storage=LazyStackStorage(8))


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"yield_only_last_steps": True, "flatten_data": False}, "flatten_data"),
        ({"yield_only_last_steps": True, "flatten_data": True}, "flatten_data"),
        ({"yield_only_last_steps": True, "yield_completed_trajectories": False}, "yield_compl"),
        ({"yield_only_last_steps": True, "reset_at_each_iter": True}, "reset_at_each_iter"),
        ({"queue": "queue", "replay_buffer": "rb"}, "queue"),
    ],
)
def test_exclusive_knobs_raise_torchrls_error_before_connecting(kw, names) -> None:
    """Knobs TorchRL's LLMCollector refuses together are refused here too, before any actor
    is dialled, with TorchRL's exception type (``flatten_data=False`` given counts too)."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.testing.mocking_classes import CountingEnv

    def given() -> dict:
        return {k: _sink(v) if isinstance(v, str) else v for k, v in kw.items()}

    with pytest.raises((TypeError, RuntimeError), match=names) as theirs:
        LLMCollector(CountingEnv(batch_size=[1]), dialog_turns_per_batch=1, **given())
    with pytest.raises(type(theirs.value), match=names) as ours:
        GrpcLLMCollector(["127.0.0.1:1"], dialog_turns_per_batch=4, **given())
    assert type(ours.value) is type(theirs.value)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"postproc": 5}, "postproc must be callable or None, got 5"),
        ({"token_versions": "no"}, "token_versions must be a bool, got 'no'"),
        ({"yield_completed_trajectories": "no"}, "yield_completed_trajectories must be a bool"),
        ({"yield_only_last_steps": 1}, "yield_only_last_steps must be a bool or None, got 1"),
        ({"flatten_data": "no"}, "flatten_data must be a bool or None, got 'no'"),
    ],
)
def test_a_knob_of_the_wrong_type_raises_type_error_before_connecting(kw, match) -> None:
    """A postproc that cannot be called and a flag that is not a bool (``"no"`` is truthy)
    are refused naming the knob, not met at the first batch (a link's traceback, a mode
    switched on)."""
    with pytest.raises(TypeError, match=match):
        GrpcLLMCollector(["127.0.0.1:1"], dialog_turns_per_batch=4, **kw)


def test_a_ctrl_c_while_a_batch_is_laid_out_keeps_it_for_the_next_take(
    llm_fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing while a batch is laid out in TorchRL's layout raises there; the
    next ``next()`` gives that batch, counted once, and the budget's turns all arrive."""
    laid_out: list[torch.Tensor] = []
    to_torchrl = llm_collector.to_torchrl

    def interrupted_once(batch):
        laid_out.append(batch["collector", "traj_ids"].clone())
        if len(laid_out) == 1:
            signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, handled at the next bytecode
        return to_torchrl(batch)

    monkeypatch.setattr(llm_collector, "to_torchrl", interrupted_once)
    with _collector(llm_fleet, dialog_turns_per_batch=SLOTS, total_dialog_turns=2 * SLOTS) as c:
        with pytest.raises(KeyboardInterrupt):
            c.next()
        batches = list(c)
        stats = c.stats()
    assert [b.numel() for b in batches] == [SLOTS, SLOTS]
    assert torch.equal(batches[0]["collector", "traj_ids"].reshape(-1), laid_out[0].reshape(-1))
    assert stats["yielded_turns"] == stats["turns"] == 2 * SLOTS


@pytest.mark.parametrize(
    ("name", "knob"),
    [("frames_per_batch", "dialog_turns_per_batch"), ("total_frames", "total_dialog_turns")],
)
def test_an_env_collectors_frame_counts_are_refused_naming_the_turn_knob(name, knob) -> None:
    with pytest.raises(TypeError, match=f"pass {knob}=8, not {name}"):
        GrpcLLMCollector(["127.0.0.1:1"], dialog_turns_per_batch=4, **{name: 8})


def test_a_policy_version_tracker_is_warned_of_not_being_read(llm_fleet) -> None:
    """TorchRL's ``track_policy_version=PolicyVersion(...)``: versions come from the pushes."""
    from torchrl.envs.llm.transforms import PolicyVersion

    with pytest.warns(UserWarning, match="PolicyVersion is taken as True"):
        collector = _collector(
            llm_fleet, dialog_turns_per_batch=SLOTS, track_policy_version=PolicyVersion()
        )
    with collector:
        assert "policy_version" in collector.next()


def test_a_tracker_that_is_no_bool_is_taken_as_true_as_warned_whatever_its_truth(
    llm_fleet,
) -> None:
    """``track_policy_version=0`` (neither a bool nor a tracker): the warning says True, and
    batches keep ``policy_version``, not the reverse."""
    with pytest.warns(UserWarning, match="track_policy_version=int is taken as True"):
        collector = _collector(llm_fleet, dialog_turns_per_batch=SLOTS, track_policy_version=0)
    with collector:
        assert "policy_version" in collector.next()


def test_settings_beyond_the_actor_cap_are_refused_at_construction(llm_fleet) -> None:
    with pytest.raises(ValueError, match="above an actor's cap"):
        _collector(
            llm_fleet, dialog_turns_per_batch=2 * SLOTS, generation={"max_new_tokens": 10**6}
        )
    # The fleet's checks name the LLM collector's own knob.
    with pytest.raises(ValueError, match="splits dialog_turns_per_batch=3 evenly over 2"):
        _collector(llm_fleet, dialog_turns_per_batch=3, sync=True)
    with pytest.raises(ValueError, match="share 2 of dialog_turns_per_batch=4 is not a multiple"):
        _collector(llm_fleet, dialog_turns_per_batch=4, sync=True)


@pytest.mark.parametrize("sync", [False, True])
def test_settings_an_actor_refuses_raise_at_the_first_batch_with_its_reason(
    llm_fleet, sync: bool
) -> None:
    vocab = 260  # the tiny model's: a stop token only the actor can check
    started = time.monotonic()
    refused = pytest.raises(SettingsRefusedError, match=r"outside the vocabulary of 260")
    with (
        _collector(
            llm_fleet,
            dialog_turns_per_batch=2 * SLOTS,
            generation={"max_new_tokens": 3, "stop_token_ids": [vocab]},
            sync=sync,
        ) as collector,
        refused as error,
    ):
        collector.next()
    assert "INVALID_ARGUMENT" in str(error.value)
    assert time.monotonic() - started < 30  # not batch_timeout's 60 s of retries


def test_a_learner_vocabulary_smaller_than_the_actors_tokenizer_is_refused(llm_fleet) -> None:
    """``vocab_size``, the learner model's embedding rows: at the actors' own (the tiny
    model's 260 tokens) batches come, every id below it; one row fewer and the actors refuse
    the session, saying why, before a token id could index past the learner's embedding."""
    with _collector(
        llm_fleet, dialog_turns_per_batch=2 * SLOTS, vocab_size=260, layout="padded"
    ) as collector:
        batch = collector.next()
    assert batch.numel() == 2 * SLOTS
    assert int(batch["tokens"].min()) >= 0
    assert int(batch["tokens"].max()) < 260
    refused = pytest.raises(
        SettingsRefusedError, match=r"model draws from 260 token ids, more than the learner's "
    )
    with (
        _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, vocab_size=259) as collector,
        refused as error,
    ):
        collector.next()
    assert "vocab_size=259" in str(error.value)
    for bad in (0, -1, True, 2.5, "260"):
        with pytest.raises(ValueError, match="vocab_size must be an int >= 1 or None"):
            _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, vocab_size=bad)


@pytest.mark.long
def test_a_task_that_raises_reaches_the_learner_as_an_env_error() -> None:
    """A user's reward function that raises is the LLM actor's env failing: the learner
    raises EnvError with its text after bounded attempts, not MissingWorkersError after
    ``batch_timeout`` (the actor took it for an internal error and retried)."""
    args = ["--kind", "llm", "--task", "rlfleet_test_tasks:buggy", "--task-kwargs"]
    args += ['{"mode": "raise"}', "--policy", "rlfleet:tiny-qwen2", "--num-envs", str(SLOTS)]
    args += ["--policy-kwargs", json.dumps(TINY_LLM), "--worker-id", "0"]
    (actor,) = start_actors([args], env=ACTOR_ENV)
    started = time.monotonic()
    try:
        with (
            pytest.raises(EnvError, match="user reward function bug") as info,
            GrpcLLMCollector(
                [actor.address], dialog_turns_per_batch=SLOTS, sync=True, batch_timeout=60.0
            ) as collector,
        ):
            collector.next()
    finally:
        actor.close()
    assert info.value.env == "rlfleet_test_tasks:buggy"
    assert time.monotonic() - started < 45


def test_an_env_collector_refuses_llm_actors_and_vice_versa(llm_fleet) -> None:
    from learner_client import GrpcCollector

    with pytest.raises(ValueError, match="GrpcCollector needs env actors"):
        GrpcCollector(llm_fleet.addresses, frames_per_batch=2 * SLOTS)
    with (
        LocalFleet(1, num_envs=2, seed=0, grace_period=1.0) as env_fleet,
        pytest.raises(ValueError, match="GrpcLLMCollector needs llm actors"),
    ):
        _collector(env_fleet, dialog_turns_per_batch=2)


@pytest.mark.long
def test_kill_9_loses_whole_groups_and_the_restarted_actor_gets_current_weights() -> None:
    from common.llm import build_policy

    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY_LLM, "seed": 9})
    with (
        LocalFleet(
            2,
            kind="llm",
            task="arith",
            policy="rlfleet:tiny-qwen2",
            policy_kwargs=TINY_LLM,
            num_envs=SLOTS,
            seed=0,
            grace_period=1.0,
        ) as fleet,
        _collector(
            fleet,
            dialog_turns_per_batch=4,
            total_dialog_turns=-1,
            yield_completed_trajectories=True,
            group_size=2,
            batch_timeout=30.0,
            track_policy_version=True,
        ) as collector,
    ):
        version = max(collector.update_policy_weights_(model).values())
        iterator = iter(collector)
        served: set[int] = set()
        while served != {0, 1}:  # both hold dialogs in progress when one is killed
            batch = next(iterator)
            assert _groups_whole(batch, 2)
            served |= set(batch["collector", "worker_id"].tolist())
        fleet.kill(1)
        for _ in range(4):  # async keeps flowing from the survivor
            assert _groups_whole(next(iterator), 2)
        fleet.restart(1)
        seen = set()
        while 1 not in seen:
            batch = next(iterator)
            assert _groups_whole(batch, 2)
            workers = set(batch["collector", "worker_id"].tolist())
            if 1 in workers:
                assert (batch["policy_version"] == version).all()
            seen |= workers
        stats = collector.stats()
    assert stats["restarts"] == 1
    assert stats["dropped_dialogs"] == SLOTS  # its in-progress dialogs: whole groups


def test_background_collection_state_and_remote_collectors(llm_fleet) -> None:
    from torchrl.data import LazyStackStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyStackStorage(10_000))
    with _collector(
        llm_fleet, dialog_turns_per_batch=4, yield_completed_trajectories=True, replay_buffer=rb
    ) as collector:
        assert [r.worker_id for r in collector.remote_collectors] == [0, 1]
        state = collector.state_dict()
        assert sorted(state["workers"]) == [0, 1]
        collector.load_state_dict(state)  # weights, versions, counters: all or nothing
        collector.start()
        poll_until(lambda: len(rb) >= 8, timeout=60, message="background collection fills rb")
        with collector.pause():
            size = len(rb)
            assert collector.is_running()
        collector.async_shutdown()
    assert size >= 8


def test_a_checkpoint_keeps_the_turns_and_tokens_handed_out(llm_fleet) -> None:
    """``yielded_turns`` and ``tokens`` are the learner's own counts: a restore gives them
    back (into the same collector after more batches, and into a new one), never more
    than the turns run; a count out of range is refused before anything is applied."""
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as collector:
        collector.next()
        saved = collector.state_dict()
        at_save = {k: collector.stats()[k] for k in ("turns", "yielded_turns", "tokens")}
        assert at_save["yielded_turns"] == at_save["turns"] == 2 * SLOTS
        assert at_save["tokens"] > 0
        collector.next()
        with pytest.raises(ValueError, match="tokens"):
            collector.load_state_dict({**saved, "tokens": 2**64})
        assert collector.stats()["yielded_turns"] == 4 * SLOTS  # nothing applied
        collector.load_state_dict(saved)
        assert {k: collector.stats()[k] for k in at_save} == at_save
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as fresh:
        fresh.load_state_dict(saved)
        assert {k: fresh.stats()[k] for k in at_save} == at_save
        assert fresh.stats()["tokens_per_s"] == 0.0  # no batch since the restore


def test_is_initialized_from_construction_until_shutdown(llm_fleet) -> None:
    collector = _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS)
    try:
        assert collector.is_initialized()
    finally:
        collector.shutdown(close_env=False, raise_on_error=False)  # TorchRL's flags
    assert not collector.is_initialized()


def test_every_llm_collector_argument_of_torchrl_is_accepted(llm_fleet) -> None:
    """LLMCollector's and RayLLMCollector's arguments (read from the installed torchrl) are
    GrpcLLMCollector's, each default accepted without a warning; set_postproc applies once,
    as TorchRL's."""
    import inspect

    from torchrl.collectors.llm import LLMCollector, RayLLMCollector

    ours = inspect.signature(GrpcLLMCollector.__init__).parameters
    defaults: dict[str, object] = {}
    for cls in (LLMCollector, RayLLMCollector):
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name in ("self", "env"):  # the fleet's addresses stand for the env
                continue
            assert name in ours, f"{cls.__name__}({name}=...) is not a GrpcLLMCollector argument"
            if param.default is not param.empty and name != "dialog_turns_per_batch":
                defaults[name] = param.default
    assert {"remote_config", "sync_iter", "weight_updater", "num_gpus"} <= set(defaults)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collector = _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, **defaults)
    with collector:
        collector.set_postproc(lambda batch: batch.set("seen", torch.ones(batch.shape)))
        assert collector.next()["seen"].all()
        with pytest.raises(TypeError, match="postproc"):
            collector.set_postproc(3)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="Postproc already set"):  # as TorchRL's
            collector.set_postproc(lambda batch: batch)
        assert collector.next()["seen"].all()  # the first one stays
    with pytest.warns(UserWarning, match="weight_updater"):
        _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, weight_updater=object()).shutdown()


def test_the_token_rate_after_a_restore_counts_this_runs_tokens_from_its_first_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(llm_collector.time, "monotonic", lambda: now[0])
    shaper = llm_collector._Shaper("rlfleet", False, True, None)
    batch = TensorDict({"response_len": torch.tensor([4, 6])}, batch_size=[2])
    shaper(shaper.lay_out(batch))
    now[0] = 100.0
    shaper.restart_rate()  # a restore: the checkpoint's tokens are not this run's
    shaper(shaper.lay_out(batch))  # the rate starts at this batch
    now[0] = 101.0
    assert shaper.tokens_per_s() == pytest.approx(10.0)


def test_the_token_rate_read_while_a_restore_lands_is_a_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stats()`` from a monitoring thread while ``load_state_dict`` restores the counts on
    another: the rate it reads is that of one side of the restore, never an error."""
    shaper = llm_collector._Shaper("padded", False, True, None)
    shaper(shaper.lay_out(TensorDict({"response_len": torch.tensor([4, 6])}, batch_size=[2])))
    reading, restored = threading.Event(), threading.Event()
    clock = time.monotonic

    def monotonic() -> float:  # the reader waits here, past its look at the counts
        if threading.current_thread().name == "stats-reader":
            reading.set()
            assert restored.wait(10)
        return clock()

    monkeypatch.setattr(llm_collector, "time", types.SimpleNamespace(monotonic=monotonic))
    rates: list[float] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            rates.append(shaper.tokens_per_s())
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read, name="stats-reader")
    reader.start()
    assert reading.wait(10)
    shaper.restart_rate()  # the restore lands while the reader computes its rate
    restored.set()
    reader.join(10)
    assert not reader.is_alive()
    assert errors == []
    assert len(rates) == 1
    assert rates[0] >= 0.0  # the rate of the counts before the restore
    assert shaper.tokens_per_s() == 0.0  # no batch since the restore


@pytest.mark.parametrize("overflow", ["block", "drop_oldest"])
def test_a_closed_queue_sink_puts_nothing(overflow: str) -> None:
    """Once the collector shuts down (the sink closed), a batch still being put stops: in
    either overflow mode nothing more reaches the user's queue."""
    from learner_client._llm_collector import _QueueSink

    target: queue.Queue = queue.Queue(maxsize=2)
    sink = _QueueSink(target, overflow)
    sink.extend(TensorDict({"x": torch.arange(2)}, batch_size=[2]))
    sink.close()
    target.get_nowait()
    sink.extend(TensorDict({"x": torch.arange(3)}, batch_size=[3]))
    assert target.qsize() == 1
    assert sink.dropped == 0


class _PutOnlyQueue:
    """A user's queue with ``put(item, timeout=)`` alone: enough to block, not to drop."""

    def __init__(self) -> None:
        self.items: list[TensorDict] = []

    def put(self, item: TensorDict, timeout: float | None = None) -> None:
        self.items.append(item)


def test_a_drop_oldest_queue_lacking_put_nowait_is_refused_at_construction() -> None:
    """Dropping the oldest item takes ``put_nowait``/``get_nowait``: a queue without them is a
    TypeError naming them at construction, not an AttributeError once a batch was taken
    and counted (that batch lost)."""
    missing = "PutOnlyQueue lacks put_nowait, get_nowait"
    with pytest.raises(TypeError, match=missing):
        GrpcLLMCollector(
            ["127.0.0.1:9"],
            dialog_turns_per_batch=2,
            queue=_PutOnlyQueue(),
            queue_overflow="drop_oldest",
        )
    with pytest.raises(TypeError, match=r"queue must have put\(\) for queue_overflow='block'"):
        GrpcLLMCollector(["127.0.0.1:9"], dialog_turns_per_batch=2, queue=object())


_COUNTS = ("turns", "yielded_turns", "tokens")


def test_state_dict_taken_while_a_batch_is_handed_out_agrees_with_itself(llm_fleet) -> None:
    """A checkpoint from another thread may fall between the take of a batch and its hand-out
    (its layout): its ``frames`` and ``yielded_turns`` still count the same batches."""
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as collector:
        collector.next()
        inner = collector._inner
        lay_out = inner._placement.layout
        seen: list[dict] = []

        def observed(batch):  # the instant a checkpointing thread may meet
            seen.append(collector.state_dict())
            return lay_out(batch)

        inner._placement.layout = observed
        collector.next()
        assert len(seen) == 1
        assert seen[0]["frames"] == seen[0]["yielded_turns"] == 4 * SLOTS
        assert seen[0]["batches"] == 2


def test_stats_read_while_a_restore_lands_are_of_one_checkpoint(llm_fleet) -> None:
    """``stats()`` from a monitoring thread while ``load_state_dict`` restores: the turns,
    yielded turns and tokens it reads are those of one side of the restore, never a mix."""
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as collector:
        collector.next()
        saved = collector.state_dict()
        at_save = {k: collector.stats()[k] for k in _COUNTS}
        collector.next()
        before = {k: collector.stats()[k] for k in _COUNTS}
        inner = collector._inner
        update_budget = inner._rounds.update_budget
        seen: list[dict] = []

        def observed() -> None:  # inside the restore: the instant a reading thread may meet
            seen.append({k: collector.stats()[k] for k in _COUNTS})
            update_budget()

        inner._rounds.update_budget = observed
        collector.load_state_dict(saved)
        assert seen
        assert all(s in (at_save, before) for s in seen), (seen, at_save, before)
        assert {k: collector.stats()[k] for k in _COUNTS} == at_save


def _worker_counts(stats: dict) -> tuple[int, int]:
    frames = sum(v for k, v in stats.items() if k.startswith("worker_") and k.endswith("/frames"))
    batches = sum(v for k, v in stats.items() if k.endswith("/batches"))
    return frames, batches


def test_load_state_dict_restores_the_per_worker_counts_with_the_totals(llm_fleet) -> None:
    """A restore gives back each worker's frames and batches with the totals, as TorchRL's
    multi-worker collectors restore each worker's frames: into the same collector after
    more batches and into a new one, ``worker_frames`` never passes ``frames``."""
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as collector:
        collector.next()
        saved = collector.state_dict()
        at_save = collector.stats("both")
        collector.next()
        collector.load_state_dict(saved)
        restored = collector.stats("both")
        assert restored["worker_frames"] == restored["frames"] == at_save["frames"]
        assert _worker_counts(restored) == _worker_counts(at_save) == (2 * SLOTS, 2)
    with _collector(llm_fleet, dialog_turns_per_batch=2 * SLOTS, sync=True) as fresh:
        fresh.load_state_dict(saved)
        fresh.next()
        stats = fresh.stats("both")
        assert stats["worker_frames"] == stats["frames"] == 4 * SLOTS
        assert _worker_counts(stats) == (4 * SLOTS, 4)
        with pytest.raises(ValueError, match="worker_frames"):
            fresh.load_state_dict({**saved, "worker_frames": {0: -1}})
