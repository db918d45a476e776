"""A real actor server whose LLM core sends hostile batches: the learner refuses them whole.

A hostile batch is refused as it arrives, with its actor's stream (as every batch out of its
session's bounds): nothing of it counts, and the other actors' batches go on being yielded.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from actor_service import ActorConfig, create_server
from actor_service._core._identity import ActorIdentity
from actor_service._kinds.llm.models import MODEL_ID
from common.traj_ids import WORKER_SHIFT
from learner_client import GrpcLLMCollector, MissingWorkersError


def _batch(broken: dict, worker_id: int = 0) -> TensorDict:
    n = 2
    ids = torch.arange(n) + (worker_id << WORKER_SHIFT)
    flag = torch.zeros((n, 1), dtype=torch.bool)
    td = TensorDict(
        {
            "tokens": torch.ones((n, 6), dtype=torch.long),
            "prompt_len": torch.tensor([4, 4]),
            "response_len": torch.tensor([2, 2]),
            "log_probs": torch.zeros((n, 2)),
            "policy_version": torch.zeros(n, dtype=torch.long),
            "done": flag.clone(),
            "terminated": flag.clone(),
            "truncated": flag.clone(),
            "history": {
                "length": torch.full((n,), 2),
                "next_length": torch.full((n,), 2),
                "role": NonTensorStack.from_list([["user", "assistant"]] * n),
                "content": NonTensorStack.from_list([["q", "a"]] * n),
            },
            "text": {
                "prompt": NonTensorStack.from_list(["p"] * n),
                "response": NonTensorStack.from_list(["r"] * n),
            },
            "query": NonTensorStack.from_list(["q"] * n),
            "collector": {
                "traj_ids": ids,
                "group_id": ids.clone(),
                "dialog_turns": torch.ones(n, dtype=torch.long),
                "stopped": torch.ones(n, dtype=torch.bool),
            },
            "next": {
                "reward": torch.zeros(n, 1),
                "done": ~flag,
                "terminated": ~flag,
                "truncated": flag.clone(),
                "success": flag.clone(),
            },
        },
        batch_size=[n],
    )
    for key, value in broken.items():
        td.set(key, value)
    return td


class _HostileCore:
    """An LLM collection core that sends one batch with the given broken entries."""

    kind = "llm"

    def __init__(self, config: ActorConfig, broken: dict) -> None:
        self.config, self.broken = config, broken
        self.worker_id, self.epoch, self.num_slots = config.worker_id, 77, 2
        self.frames = self.batches = 0
        self.models = _Models()

    def describe(self) -> ActorIdentity:
        return ActorIdentity(
            worker_id=self.worker_id, epoch=self.epoch, env_id="hostile",
            observation_space=None, action_space=None, models={MODEL_ID: (0, {})},
            num_slots=2, backend="llm", device="cpu", software_version="0",
            kind="llm", policy="rlfleet:tiny-qwen2",
        )  # fmt: skip

    def check(self, settings) -> None:
        pass  # it takes any settings

    def place(self, settings) -> None:
        pass  # no device or compile asked of it

    def configure(self, settings) -> None:
        self.settings = settings

    def start_anew(self) -> None:
        pass  # its one batch has no trajectories to cut

    def collect_batch(self, abandon=None) -> TensorDict:
        self.batches += 1
        return _batch(self.broken, self.worker_id)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        return seed

    def force_close(self) -> int:
        return 0

    def close(self) -> None:
        pass


class _Models:
    model_ids = (MODEL_ID,)

    def policy_version(self, model_id: str) -> int:
        return 0


@pytest.mark.parametrize(
    "broken",
    [
        {"response_len": torch.tensor([2, 9])},
        {"prompt_len": torch.tensor([-1, 4])},
        {("history", "length"): torch.tensor([2, 7])},
        {"log_probs": torch.zeros((2, 1))},
        # int64 lengths whose sum wraps: the check passed, a TypeError escaped later
        {"prompt_len": torch.tensor([2**63 - 1, 4]), "response_len": torch.tensor([1, 2])},
        {("collector", "dialog_turns"): torch.tensor([-(2**63), 1])},  # step_count wrapped
        {"tokens": torch.full((2, 6), -5)},
    ],
    ids=[
        "beyond_width",
        "negative",
        "history_count",
        "log_probs_width",
        "lengths_wrap",
        "dialog_turns",
        "token_ids",
    ],
)
def test_a_hostile_llm_batch_ends_its_stream_and_nothing_is_yielded(broken) -> None:
    _refused(broken, "LLM batch", batch_timeout=1.5)


@pytest.mark.parametrize(
    "ids",
    [
        {("collector", "traj_ids"): torch.tensor([-1, 0])},
        {("collector", "group_id"): torch.tensor([0, 6 << 47])},  # worker_id 6's GRPO group
    ],
    ids=["negative", "another_workers"],
)
def test_ids_not_of_the_actor_are_refused_with_its_stream_and_nothing_is_yielded(ids) -> None:
    _refused(ids, r"of worker_id (-1|6); it is", 1.5)


def test_a_token_id_at_the_learners_vocab_size_is_refused() -> None:
    """``vocab_size``: an id at it (the batch's ids are all 1) would index past the learner's
    embedding; the same batch is yielded when every id is below it."""
    beyond = r"batch seq 1: LLM batch has token ids beyond the learner's vocab_size=1 \(up to 1\)"
    _refused({}, beyond, 1.5, 1)
    _refused({"tokens": torch.full((2, 6), 2**63 - 1)}, "vocab_size=7", 1.5, 7)
    _yielded(vocab_size=np.int64(2))  # any integer a script computes


@pytest.mark.parametrize("partial", [True, False], ids=["partial", "strict"])
def test_a_hostile_llm_batch_in_a_sync_batch_leaves_the_honest_actors_shares(partial) -> None:
    """A sync batch of an honest and a hostile actor: the hostile one's share is refused on
    its stream, before the batch is taken; the honest one's is yielded (a partial batch goes
    on without the hostile actor), or a strict batch names the hostile actor alone."""
    config = ActorConfig(host="127.0.0.1", port=0, kind="llm", num_envs=2, grace_period=1.0)
    honest = create_server(config, core_factory=lambda c: _HostileCore(c, {}))
    hostile_config = dataclasses.replace(config, worker_id=1)
    hostile = create_server(hostile_config, core_factory=lambda c: _HostileCore(c, _BEYOND))
    with honest.run_in_thread() as first, hostile.run_in_thread() as second, GrpcLLMCollector(
        [f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"], dialog_turns_per_batch=4,
        total_dialog_turns=8, sync=True, yield_completed_trajectories=True, batch_timeout=1.5,
        allow_partial_batches=partial,
    ) as collector:  # fmt: skip
        if partial:
            batch = collector.next()
            assert batch.get(("collector", "worker_id")).unique().tolist() == [0]
        else:
            with pytest.raises(MissingWorkersError, match="LLM batch lengths exceed") as info:
                collector.next()
            assert info.value.worker_ids == [1]
        stats = collector.stats()
    assert stats["batches"] == (1 if partial else 0)
    assert stats["yielded_turns"] == (2 if partial else 0)


_BEYOND = {"response_len": torch.tensor([2, 9])}


def _refused(broken: dict, match: str, batch_timeout: float, vocab_size=None) -> None:
    """A batch with ``broken`` entries ends its stream; ``next()`` names the refusal (``match``)
    when no batch came within ``batch_timeout``; nothing is counted or yielded."""
    config = ActorConfig(host="127.0.0.1", port=0, kind="llm", num_envs=2, grace_period=1.0)
    server = create_server(config, core_factory=lambda c: _HostileCore(c, broken))
    with server.run_in_thread() as actor, GrpcLLMCollector(
        [f"127.0.0.1:{actor.port}"], dialog_turns_per_batch=2, total_dialog_turns=2,
        yield_completed_trajectories=True, batch_timeout=batch_timeout, vocab_size=vocab_size,
    ) as collector:  # fmt: skip
        with pytest.raises(MissingWorkersError, match=f"ProtocolError: .*{match}"):
            collector.next()
        stats = collector.stats()
    assert stats["batches"] == 0
    assert stats["yielded_turns"] == 0


def test_the_same_batch_unbroken_is_yielded() -> None:
    _yielded()


def _yielded(vocab_size=None) -> None:
    """The unbroken batch is yielded whole."""
    config = ActorConfig(host="127.0.0.1", port=0, kind="llm", num_envs=2, grace_period=1.0)
    server = create_server(config, core_factory=lambda c: _HostileCore(c, {}))
    with (
        server.run_in_thread() as actor,
        GrpcLLMCollector(
            [f"127.0.0.1:{actor.port}"], dialog_turns_per_batch=2, total_dialog_turns=2,
            yield_completed_trajectories=True, batch_timeout=10.0, vocab_size=vocab_size,
        ) as collector,
    ):  # fmt: skip
        batches = list(collector)
    assert len(batches) == 1
    assert batches[0]["tokens", "response"].shape == (2, 2)
