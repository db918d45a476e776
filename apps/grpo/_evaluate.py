"""Greedy accuracy of the learner's copy of the model on a task's held-out problems.

The held-out set is drawn once from the task with its own seed: distinct problems (by
query), as many as asked for or as the task has — one-digit ``arith`` has exactly 100,
``a+b`` for ``a, b`` in 0..9, so there the set is the whole problem space. Each is
answered greedily by the learner's model through the same decode loop and chat
template the actors use, and scored by the task itself: accuracy is the fraction of
problems the task calls a success.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from common.llm import GenerationSettings, Problem, Task, cached_forward, generate

__all__ = ["Evaluator", "held_out_problems"]

# Draws per wanted problem before concluding the task has no more distinct ones.
_DRAWS_PER_PROBLEM = 50


def held_out_problems(task: Task, count: int, seed: int) -> list[Problem]:
    """Up to ``count`` distinct problems (by query) of ``task``, drawn with ``seed``."""
    rng = random.Random(seed)
    found: dict[str, Problem] = {}
    for _ in range(count * _DRAWS_PER_PROBLEM):
        problem = task.sample(rng)
        found.setdefault(problem.query, problem)
        if len(found) == count:
            break
    return sorted(found.values(), key=lambda p: p.query)


def prompt_ids(tokenizer: Any, problem: Problem) -> list[int]:
    """The tokens of ``problem``'s first prompt, as an actor builds it (chat template)."""
    messages = [{"role": "system", "content": problem.system}] if problem.system else []
    messages.append({"role": "user", "content": problem.query})
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])


class Evaluator:
    """Scores a model greedily on fixed problems.

    Args:
        task: The task that scores the answers.
        problems: The held-out problems.
        tokenizer: The model's tokenizer (chat template, EOS, pad).
        max_new_tokens: Most tokens per answer.
    """

    def __init__(
        self, task: Task, problems: list[Problem], tokenizer: Any, max_new_tokens: int
    ) -> None:
        if not problems:
            raise ValueError("no held-out problems to evaluate on")
        self.task, self.problems, self.tokenizer = task, problems, tokenizer
        self.settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0)
        self.prompts = [self._prompt(p) for p in problems]

    def _prompt(self, problem: Problem) -> list[int]:
        return prompt_ids(self.tokenizer, problem)

    @torch.no_grad()
    def accuracy(self, model: Any) -> float:
        """The fraction of the problems ``model`` answers right, greedily."""

        def forward(
            ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
        ) -> tuple[torch.Tensor, Any, int]:
            return (*cached_forward(model, ids, mask, positions, past), 0)

        eos = int(self.tokenizer.eos_token_id)
        result = generate(
            forward,
            self.prompts,
            self.settings,
            budgets=[self.settings.max_new_tokens] * len(self.prompts),
            stop_ids=(eos,),
            pad_id=int(self.tokenizer.pad_token_id),
            device=next(model.parameters()).device,  # decode where the learner's model is
        )
        right = 0
        for row, problem in enumerate(self.problems):
            length = int(result.lengths[row])
            body = result.tokens[row, :length].tolist()
            if result.stopped[row]:
                body = body[:-1]
            answer = self.tokenizer.decode(body, skip_special_tokens=True)
            right += bool(self.task.score(problem, answer, 1).success)
        return right / len(self.problems)
