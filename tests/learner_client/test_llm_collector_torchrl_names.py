"""GrpcLLMCollector against TorchRL's LLMCollector by name: every public name of TorchRL's LLM
collectors is offered, reading as TorchRL's for the same arguments, or refused saying why."""

from __future__ import annotations

import queue

import pytest
import torch
from helpers import assert_torchrl_names_offered_or_refused, torchrl_public_names
from learner_fleet import tiny_llm_collector, tiny_llm_fleet

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

SLOTS = 4


@pytest.fixture(scope="module")
def llm_fleet():
    with tiny_llm_fleet(1, SLOTS) as fleet:
        yield fleet


_collector = tiny_llm_collector


def test_every_public_name_of_torchrls_llm_collectors_is_offered_or_refused_saying_why(
    llm_fleet,
) -> None:
    """Each public name of TorchRL's LLMCollector and RayLLMCollector (read from the installed
    torchrl) is on a GrpcLLMCollector, or reading it raises ``AttributeError`` naming TorchRL
    and the way a fleet does it; another name still gets Python's."""
    from torchrl.collectors.llm import LLMCollector, RayLLMCollector

    with _collector(llm_fleet, dialog_turns_per_batch=SLOTS, queue=queue.Queue()) as collector:
        names = torchrl_public_names((LLMCollector, RayLLMCollector))
        assert_torchrl_names_offered_or_refused(collector, names)
        with pytest.raises(AttributeError, match="build_policy"):
            collector.get_policy_model()  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match="stats"):
            collector.map_fn  # type: ignore[attr-defined]  # noqa: B018
        with pytest.raises(AttributeError, match="yield_completed_trajectories=True"):
            collector.trajs_per_batch  # type: ignore[attr-defined]  # noqa: B018
        with pytest.raises(AttributeError, match=r"object has no attribute 'resett'$"):
            collector.resett  # type: ignore[attr-defined]  # noqa: B018
        with pytest.raises(AttributeError, match="go to the queue given"):
            collector.getattr_rb("write_count")


def _torchrl_llm_collector(**kw):
    """TorchRL's LLMCollector over a one-slot counting env and a constant policy (offline)."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.testing.mocking_classes import CountingEnv

    def policy(td):
        return td.set("action", torch.ones(*td.shape, 1, dtype=torch.int))

    return LLMCollector(CountingEnv(batch_size=[1]), policy=policy, **kw)


@pytest.mark.parametrize(
    "kw",
    [
        {"dialog_turns_per_batch": SLOTS, "total_dialog_turns": -1},
        {"dialog_turns_per_batch": SLOTS, "total_dialog_turns": 3 * SLOTS},
        {"yield_completed_trajectories": True, "total_dialog_turns": 8},
    ],
)
def test_the_offered_torchrl_names_read_as_torchrls_llm_collector_for_the_same_arguments(
    llm_fleet, kw
) -> None:
    """``dialog_turns_per_batch``, ``total_dialog_turns`` (read-only), ``started``,
    ``getattr_rb`` and ``iterator()`` give what TorchRL's LLMCollector gives for the same
    arguments; ``started`` turns True with the first batch asked for and stays so."""
    from torchrl.data import LazyStackStorage, ReplayBuffer

    names = ("dialog_turns_per_batch", "total_dialog_turns", "started")
    theirs = _torchrl_llm_collector(replay_buffer=ReplayBuffer(storage=LazyStackStorage(64)), **kw)
    try:
        expected = [getattr(theirs, name) for name in names] + [theirs.getattr_rb("write_count")]
        with pytest.raises(AttributeError):
            theirs.total_dialog_turns = 1
    finally:
        theirs.shutdown()
    rb = ReplayBuffer(storage=LazyStackStorage(1_000))
    with _collector(llm_fleet, replay_buffer=rb, **kw) as collector:
        got = [getattr(collector, name) for name in names] + [collector.getattr_rb("write_count")]
        assert got == expected
        for name in names:
            with pytest.raises(AttributeError):
                setattr(collector, name, 1)
        assert next(collector.iterator()) is None  # stored in the buffer, as TorchRL's
        assert collector.started
        assert collector.getattr_rb("write_count") == len(rb) > 0
        assert collector.init_random_frames == 0  # RayLLMCollector's, read by TorchRL's Trainer
    assert collector.started
    never = _collector(llm_fleet, dialog_turns_per_batch=SLOTS)
    never.shutdown()
    assert not never.started


def test_every_public_instance_name_of_a_built_torchrl_llm_collector_is_offered_or_refused(
    llm_fleet,
) -> None:
    """The public attributes a built TorchRL LLMCollector holds (``vars()``: ``env``,
    ``policy``, ``split_trajs``...) read on a GrpcLLMCollector built with the same arguments
    as TorchRL's give the same value, or raise ``AttributeError`` naming TorchRL's and how a
    fleet does it; ``closed`` turns True at shutdown, as TorchRL's."""
    from torchrl.data import LazyStackStorage, ReplayBuffer

    kw = {"dialog_turns_per_batch": SLOTS, "total_dialog_turns": 2 * SLOTS}
    theirs = _torchrl_llm_collector(replay_buffer=ReplayBuffer(storage=LazyStackStorage(8)), **kw)
    try:
        names = sorted(name for name in vars(theirs) if not name.startswith("_"))
        expected = {name: getattr(theirs, name) for name in names}
    finally:
        theirs.shutdown()
    assert len(names) >= 40
    assert theirs.closed
    collector = _collector(llm_fleet, replay_buffer=ReplayBuffer(storage=LazyStackStorage(8)), **kw)
    with collector:
        offered = assert_torchrl_names_offered_or_refused(collector, names)
        for name in set(offered) - {"replay_buffer"}:  # the learner's own buffer, each its own
            assert getattr(collector, name) == expected[name], name
        assert not collector.closed
    assert collector.closed
    assert {"closed", "reset_when_done", "storing_device", "track_traj_ids"} <= set(offered)
