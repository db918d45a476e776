"""TorchRL parity: LLMCollector(ChatEnv + TransformersWrapper) and an rlfleet LLM actor, greedy.

Same tiny model, tokenizer, prompts and greedy decoding on both sides — TorchRL in process,
rlfleet through an actor process and ``GrpcLLMCollector``: the response tokens are identical
turn by turn, and the batches' key trees match in steps mode, with
``yield_completed_trajectories`` and with ``yield_only_last_steps``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from common.llm import Outcome, Problem, build_policy
from learner_client import GrpcLLMCollector, LocalFleet

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 2, "seed": 11}
QUERIES = ["1+2=", "what is 7*8?", "reverse abc", "hello"]
NEW_TOKENS = 4
TURNS = 2


class _Queries:
    """The QUERIES in order; the dialog never ends on its own (as a plain ChatEnv)."""

    max_turns = TURNS

    def __init__(self) -> None:
        self.cursor = 0

    def sample(self, rng):
        query = QUERIES[self.cursor % len(QUERIES)]
        self.cursor += 1
        return Problem(query=query, answer="")

    def score(self, problem, response, turn):
        return Outcome(reward=0.0, terminated=False)


def make_queries():
    return _Queries()


def _torchrl_collector(**modes):
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import TransformersWrapper

    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)

    class Loader:
        def __iter__(self):
            while True:
                yield {"query": list(QUERIES)}

    env = ChatEnv.from_dataloader(
        dataloader=Loader(), tokenizer=tok, batch_size=len(QUERIES), input_mode="history"
    )
    env = env.append_transform(StepCounter(max_steps=TURNS))
    policy = TransformersWrapper(
        model, tokenizer=tok, input_mode="history", generate=True, return_log_probs=True,
        generate_kwargs={"max_new_tokens": NEW_TOKENS, "do_sample": False},
    )  # fmt: skip
    turns = len(QUERIES) * TURNS
    return LLMCollector(
        env, policy=policy, dialog_turns_per_batch=turns, total_dialog_turns=turns,
        track_policy_version=True, **modes,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rlfleet_actor():
    """One LLM actor process serving the QUERIES task with the tiny model."""
    with LocalFleet(
        1,
        kind="llm",
        task="tests.integration.test_llm_torchrl_parity:make_queries",
        policy="rlfleet:tiny-qwen2",
        policy_kwargs=TINY,
        num_envs=len(QUERIES),
        seed=0,
        grace_period=1.0,
    ) as fleet:
        yield fleet


def _rlfleet_batch(fleet, **modes):
    with GrpcLLMCollector(
        fleet.addresses,
        dialog_turns_per_batch=len(QUERIES) * TURNS,
        total_dialog_turns=len(QUERIES) * TURNS,
        sync=True,
        generation={"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
        track_policy_version=True,  # as TorchRL's collector above
        **modes,
    ) as collector:
        return next(iter(collector))


def _first_batch(collector):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return next(iter(collector))
        finally:
            collector.shutdown()


@pytest.mark.parametrize(
    "modes",
    [{}, {"yield_completed_trajectories": True}, {"yield_only_last_steps": True}],
    ids=["steps", "completed_trajectories", "last_steps"],
)
@pytest.mark.long
def test_torchrl_and_rlfleet_generate_the_same_tokens_with_the_same_key_tree(
    rlfleet_actor, modes
) -> None:
    theirs = _first_batch(_torchrl_collector(**modes))
    ours = _rlfleet_batch(rlfleet_actor, **modes)
    assert ours.batch_size == theirs.batch_size
    missing = set(theirs.keys(True, True)) - set(ours.keys(True, True))
    assert missing == set()
    for key in theirs.keys(True, True):
        assert ours[(0,) * ours.ndim][key].dtype == theirs[(0,) * ours.ndim][key].dtype, key
        assert ours[(0,) * ours.ndim][key].ndim == theirs[(0,) * ours.ndim][key].ndim, key
    responses = set()
    for index in (
        torch.cartesian_prod(*[torch.arange(s) for s in ours.batch_size])
        .reshape(-1, ours.ndim)
        .tolist()
    ):
        a, b = ours[tuple(index)], theirs[tuple(index)]
        assert a["tokens", "prompt"].tolist() == b["tokens", "prompt"].tolist()
        assert a["tokens", "response"].tolist() == b["tokens", "response"].tolist()
        responses.add(tuple(a["tokens", "response"].tolist()))
        assert a["query"] == b["query"]
        assert bool(a["next", "done"]) == bool(b["next", "done"])
    assert len(responses) > 1  # the model does not answer everything alike
