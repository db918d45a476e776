"""A valid LLM batch in the padded wire form, for the suites that check or carry one.

Import it as ``from llm_batches import padded`` (``tests/`` is on ``sys.path`` because it
holds the root ``conftest.py``).
"""

from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict

from common.traj_ids import WORKER_SHIFT


def _strings(rows: list) -> NonTensorStack:
    return NonTensorStack.from_list(rows)


def padded(
    n: int = 3, width: int = 10, span: int = 4, messages: int = 2, worker_id: int = 0
) -> TensorDict:
    """A valid batch of n turns: prompt 5 tokens, response n-dependent, history of 2 messages.

    Its trajectory and group ids name ``worker_id`` (their top bits).
    """
    worker = worker_id << WORKER_SHIFT
    prompt_len = torch.full((n,), 5)
    response_len = torch.arange(n) % (span + 1)
    tokens = torch.zeros((n, width), dtype=torch.long)
    for i in range(n):
        tokens[i, : 5 + int(response_len[i])] = torch.arange(1, 6 + int(response_len[i]))
    log_probs = -torch.rand(n, span) * (torch.arange(span)[None] < response_len[:, None])
    flag = torch.zeros((n, 1), dtype=torch.bool)
    return TensorDict(
        {
            "tokens": tokens,
            "prompt_len": prompt_len,
            "response_len": response_len,
            "log_probs": log_probs,
            "policy_version": torch.zeros(n, dtype=torch.long),
            "done": flag.clone(),
            "terminated": flag.clone(),
            "truncated": flag.clone(),
            "history": {
                "length": torch.full((n,), min(messages, 2)),
                "next_length": torch.full((n,), messages),
                "role": _strings([["user", "assistant", "user"][:messages]] * n),
                "content": _strings([[f"q{i}", f"a{i}", "x"][:messages] for i in range(n)]),
            },
            "text": {
                "prompt": _strings([f"p{i}" for i in range(n)]),
                "response": _strings([f"r{i}" for i in range(n)]),
            },
            "query": _strings([f"q{i}" for i in range(n)]),
            "collector": {
                "traj_ids": torch.arange(n) + worker,
                "group_id": torch.arange(n) // 2 + worker,
                "dialog_turns": torch.ones(n, dtype=torch.long),
                "stopped": torch.ones(n, dtype=torch.bool),
            },
            "next": {
                "reward": torch.ones(n, 1),
                "done": ~flag,
                "terminated": ~flag,
                "truncated": flag.clone(),
                "success": flag.clone(),
            },
        },
        batch_size=[n],
    )
