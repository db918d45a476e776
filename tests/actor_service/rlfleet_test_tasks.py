"""User chat tasks, loaded by LLM actors as ``rlfleet_test_tasks:<name>``.

Most are the built-in ``arith`` task but for one thing its ``score`` (or ``sample``) does
wrong, as a user's reward function may: raise, return a reward that is no number, or
return something that is no ``Outcome``. ``uneven`` is well-behaved: its dialogs end after
different numbers of turns.
"""

from __future__ import annotations

import random
from typing import Any

from common.llm import Outcome, Problem, build_task


class BuggyTask:
    """``arith`` whose ``score`` (or ``sample``) goes wrong as ``mode`` says."""

    def __init__(self, mode: str) -> None:
        self._arith = build_task("arith")
        self.max_turns = 4 if mode == "flaky" else self._arith.max_turns
        self.mode = mode
        self.scored = 0

    def sample(self, rng: random.Random) -> Problem:
        """A problem of ``arith``; ``mode="sample"`` raises instead."""
        if self.mode == "sample":
            raise KeyError("no such problem")
        if self.mode == "query_surrogate":  # a file name decoded with surrogateescape
            return Problem("solve \udcff", "1")
        return self._arith.sample(rng)

    def score(self, problem: Problem, response: str, turn: int) -> Any:
        """Not an ``Outcome`` of a real reward, or an exception, as ``mode`` says.

        ``mode="flaky"``: four-turn dialogs (every response is wrong) whose fourth score
        raises, once (a reward server's hiccup).
        """
        self.scored += 1
        if self.mode == "flaky":
            if self.scored == 4:
                raise RuntimeError("reward server hiccup")
            return Outcome(0.0, terminated=turn >= 4, reply=None if turn >= 4 else "No.")
        if self.mode == "raise":
            raise RuntimeError("user reward function bug")
        if self.mode == "system_exit":  # a user's sys.exit in a reward function
            raise SystemExit("reward server gone")
        if self.mode == "surrogates":  # bytes decoded with surrogateescape
            raise RuntimeError("bad byte \udcff")
        if self.mode == "reply_surrogate":
            return Outcome(0.0, terminated=False, reply="try again \udcff")
        if self.mode == "text_reward":
            return Outcome("high", terminated=True)  # type: ignore[arg-type]
        if self.mode == "tuple":
            return (1.0, True)
        if self.mode == "flag_tensor":  # a batched reward function's flags, one per row
            import torch

            return Outcome(1.0, terminated=torch.tensor([True, False]))  # type: ignore[arg-type]
        return self._arith.score(problem, response, turn)


def buggy(mode: str) -> BuggyTask:
    """The task factory (``--task rlfleet_test_tasks:buggy --task-kwargs '{"mode": ...}'``)."""
    return BuggyTask(mode)


class UnevenTask:
    """``arith`` in dialogs of one or two turns, alternately: a group's dialogs end apart.

    Slots are scored in order, so of two slots starting together one ends at its first
    turn and the other is told "No." and ends at its second.
    """

    def __init__(self) -> None:
        self._arith = build_task("arith")
        self.max_turns = 2
        self.scored = 0

    def sample(self, rng: random.Random) -> Problem:
        """A problem of ``arith``."""
        return self._arith.sample(rng)

    def score(self, problem: Problem, response: str, turn: int) -> Outcome:
        """No reward; the dialog ends at turn 2, or at turn 1 on every other score."""
        self.scored += 1
        ended = turn >= 2 or self.scored % 2 == 0
        return Outcome(0.0, terminated=ended, reply=None if ended else "No.")


def uneven() -> UnevenTask:
    """The task factory (``--task rlfleet_test_tasks:uneven``)."""
    return UnevenTask()


def cfg_arith(cfg: Any) -> Any:
    """A Hydra script's task factory: ``arith`` with ``cfg.retries`` read from a ``DictConfig``."""
    from omegaconf import DictConfig

    if not isinstance(cfg, DictConfig):
        raise TypeError(f"cfg is a {type(cfg).__name__}, not the script's DictConfig")
    return build_task("arith", retries=cfg.retries)
