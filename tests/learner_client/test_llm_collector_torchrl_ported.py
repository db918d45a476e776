"""TorchRL's own LLM collector tests, ported to a fleet of real LLM actors (tiny offline models).

Ported from pytorch/rl at commit ae9719f17b1517af5c2523a36c4616f003ee55cf:
``test/llm/test_llm_collectors.py`` (``TestLLMCollector._run_collector_test``,
``test_llm_collector_start``, ``test_llm_collector_completed``, ``TestUpdate.test_vllm_update``).
TorchRL's ``ChatEnv`` over ``DummyStrDataLoader`` is the ``arith`` task here (one retry, so a
dialog may last two turns); ``vLLMWrapper``/``TransformersWrapper`` are the actors' tiny Qwen2.
Where TorchRL reads private counters (``collector._frames``) the fleet's ``stats()["turns"]``
is read instead.
"""

from __future__ import annotations

import queue

import pytest
import torch
from helpers import poll_until
from learner_fleet import TINY_LLM, tiny_llm_collector, tiny_llm_fleet

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

BSZ = 4  # TorchRL's env batch: the actor's chat slots


@pytest.fixture(scope="module")
def llm_fleet():
    with tiny_llm_fleet(1, BSZ, retries=1) as fleet:
        yield fleet


_collector = tiny_llm_collector


def _history_grows(data, i: int) -> bool:
    """TorchRL's check: the next turn's prompt history holds more than this turn's."""
    return len(data["history", "prompt"][i]) < len(data["next", "history", "prompt"][i])


@pytest.mark.parametrize("sink", ["rb", "queue", "none"])
@pytest.mark.parametrize("total_steps", [1, 10, 20])
def test_collector_steps_mode_fills_its_sink_or_yields_whole_slot_batches(
    llm_fleet, sink, total_steps, monkeypatch
) -> None:
    """TorchRL's ``_run_collector_test``: with a buffer (or queue) every yield is None and it
    holds at least ``total_dialog_turns`` turns (a bounded queue drops its oldest, as
    TorchRL's: this thread is its only consumer, so "block" would wait for ever); without,
    the batches hold ``max(ceil(total / bsz) * bsz, bsz)`` turns, each one's history growing
    to the next."""
    from torchrl.data import LazyStackStorage, ReplayBuffer

    monkeypatch.setenv("RL_WARNINGS", "0")  # batches overshoot: TorchRL warns, so here
    rb = ReplayBuffer(storage=LazyStackStorage(max_size=total_steps * 2)) if sink == "rb" else None
    q: queue.Queue | None = queue.Queue(maxsize=total_steps * 2) if sink == "queue" else None
    stack = []
    with _collector(
        llm_fleet, dialog_turns_per_batch=BSZ, total_dialog_turns=total_steps,
        replay_buffer=rb, queue=q, queue_overflow="drop_oldest",  # TorchRL's (ours blocks)
    ) as collector:  # fmt: skip
        assert collector.dialog_turns_per_batch == BSZ
        for data in collector:
            if sink == "none":
                stack.append(data)
            else:
                assert data is None
        turns = collector.stats()["turns"]
    assert turns >= total_steps
    if rb is not None:
        assert len(rb) >= total_steps
        sample = rb.sample(4)
        assert sample.shape == (4,)
        assert not sample._has_exclusive_keys
        assert len(sample["text", "prompt"]) == 4
        assert all(_history_grows(sample, i) for i in range(4))
    elif q is not None:
        assert q.qsize() >= total_steps
    else:
        data = torch.cat(stack)
        assert not data._has_exclusive_keys
        data = data.view(-1)
        assert data.numel() == max(-(total_steps // -BSZ) * BSZ, BSZ)
        assert all(_history_grows(data, i) for i in range(data.numel()))


def test_collector_start_fills_the_buffer_in_the_background(llm_fleet) -> None:
    """TorchRL's ``test_llm_collector_start``: ``start()`` fills the buffer until the budget,
    samples read meanwhile are 1-D with growing histories; ``async_shutdown`` stops it."""
    from torchrl.data import LazyStackStorage, ReplayBuffer

    total_steps = 20
    rb = ReplayBuffer(storage=LazyStackStorage(max_size=total_steps * 2))
    collector = _collector(
        llm_fleet, dialog_turns_per_batch=BSZ, total_dialog_turns=total_steps, replay_buffer=rb
    )
    try:
        collector.start()
        poll_until(lambda: rb.write_count >= total_steps, timeout=60.0)
        sample = rb.sample(10)
        assert sample.ndim == 1
        assert not sample._has_exclusive_keys
        assert all(_history_grows(sample, i) for i in range(10))
        poll_until(lambda: not collector.is_running(), timeout=60.0)
        assert collector.stats()["turns"] >= total_steps
    finally:
        collector.async_shutdown(timeout=10)


def test_collector_start_raises_without_a_buffer_or_a_queue_naming_both(llm_fleet) -> None:
    """TorchRL's ``start()`` needs somewhere to write (RuntimeError); ours names both places,
    and the collector is not marked started."""
    with _collector(llm_fleet, dialog_turns_per_batch=BSZ) as collector:
        with pytest.raises(RuntimeError, match="replay_buffer or a queue"):
            collector.start()
        assert not collector.started


@pytest.mark.parametrize("rb", [False, True], ids=["rb_false", "rb_true"])
@pytest.mark.parametrize("last", [False, True], ids=["all_steps", "last_steps"])
@pytest.mark.parametrize("per_batch", [BSZ, None], ids=["turns_4", "turns_default"])
def test_collector_completed_yields_whole_dialogs_or_their_last_steps(
    llm_fleet, rb, last, per_batch
) -> None:
    """TorchRL's ``test_llm_collector_completed``: the modes read as given; without a buffer
    each batch is 1-D, exactly ``dialog_turns_per_batch`` last steps or at least as many
    turns of whole dialogs, some longer than one turn; with one, samples read between
    yields hold whole dialogs' turns. TorchRL 0.14.1 resolves an omitted
    ``dialog_turns_per_batch`` to 1 (its test's ``== bsz`` predates that)."""
    from torchrl.data import LazyStackStorage, ReplayBuffer

    total_steps = 20
    buffer = ReplayBuffer(storage=LazyStackStorage(max_size=total_steps * 4)) if rb else None
    kwargs = {"dialog_turns_per_batch": per_batch} if per_batch is not None else {}
    longer = False
    with _collector(
        llm_fleet, replay_buffer=buffer, total_dialog_turns=total_steps,
        yield_completed_trajectories=True, yield_only_last_steps=last, **kwargs,
    ) as collector:  # fmt: skip
        assert collector.dialog_turns_per_batch == (per_batch or 1)
        assert collector.yield_completed_trajectories
        assert collector.yield_only_last_steps is last
        for data in collector:
            if buffer is not None:
                assert data is None
                sample = buffer.sample(5)
                assert sample.shape == (5,)
                assert not sample._has_exclusive_keys
                continue
            assert data.ndim == 1
            assert bool(data[-1]["next", "done"])
            if last:
                assert data.numel() == collector.dialog_turns_per_batch
                assert data["next", "done"].all()
            else:
                assert data.numel() >= collector.dialog_turns_per_batch
                ongoing = ~data["next", "done"].reshape(-1)
                assert all(_history_grows(data, i) for i in ongoing.nonzero().view(-1).tolist())
                longer |= bool(ongoing.any())
        assert collector.stats()["turns"] >= total_steps
    if buffer is None and not last:
        assert longer  # some dialog took its retry: more than one turn


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_collector_weight_updates_move_the_version_of_the_batches(llm_fleet, sync) -> None:
    """TorchRL's ``TestUpdate.test_vllm_update``: a state dict pushed to ``worker_ids=[0]``,
    a batch, a second push; each push moves the version by one and the batches after a
    sync collector's push carry it (an async one's may be one batch older)."""
    from common.llm import build_policy

    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY_LLM, "seed": 3})
    with _collector(
        llm_fleet, dialog_turns_per_batch=BSZ, total_dialog_turns=-1, sync=sync,
        track_policy_version=True,
    ) as collector:  # fmt: skip
        before = collector.policy_version
        assert collector.update_policy_weights_(model.state_dict(), worker_ids=[0]) == {
            0: before + 1
        }
        batch = next(iter(collector))
        versions = set(batch["policy_version"].reshape(-1).tolist())
        assert versions == {before + 1} if sync else versions <= {before, before + 1}
        applied = collector.update_policy_weights_(model.state_dict(), worker_ids=[0])
        assert applied == {0: before + 2} == {0: collector.get_policy_version()}
        batch = collector.next()
        if sync:
            assert set(batch["policy_version"].reshape(-1).tolist()) == {before + 2}
