"""Dialog turns of an LLM actor: chat slots, one batched turn over them, and the padded batch.

A *turn* is one response of one dialog: its prompt is the chat template applied to the
dialog's history, its response comes from :func:`common.llm.generate`, and the task
scores it. :class:`DialogEngine` runs a turn for many slots at once (one decode loop);
:func:`pack_turns` lays turns out in the dense wire form described in
:func:`common.llm.check_padded`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

from actor_service._kinds.llm.models import LLMModels
from common.errors import EnvError
from common.llm import GenerationSettings, Outcome, Problem, Task

__all__ = ["Dialog", "DialogEngine", "Turn", "pack_turns"]


@dataclasses.dataclass
class Dialog:
    """A dialog in progress in one slot."""

    problem: Problem
    messages: list[dict[str, str]]
    traj_id: int
    group_id: int
    turns: int = 0


@dataclasses.dataclass
class Turn:
    """One turn: what the batch records for it."""

    prompt: list[int]
    response: list[int]
    log_probs: torch.Tensor
    versions: torch.Tensor
    version: int
    query: str
    text_prompt: str
    text_response: str
    # The history after the turn: its prompt, its response, then the task's reply if any
    # (the next turn's prompt, TorchRL's ``next.history.prompt``).
    messages: list[dict[str, str]]
    # How many of ``messages`` are the turn's own (prompt and response: ``history.full``).
    full_length: int
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    stopped: bool
    traj_id: int
    group_id: int
    dialog_turns: int

    @property
    def done(self) -> bool:
        """Whether the dialog ended with this turn."""
        return self.terminated or self.truncated


class DialogEngine:
    """Runs turns of dialogs with one model and one task.

    Args:
        models: The model, tokenizer and lock.
        task: The task that makes problems and scores responses.
        name: The task's name in errors (``--task``).
    """

    def __init__(self, models: LLMModels, task: Task, name: str = "task") -> None:
        self.models = models
        self.task = task
        self.name = name
        tokenizer = models.tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.vocab = len(tokenizer)

    def new_dialog(self, problem: Problem, traj_id: int, group_id: int) -> Dialog:
        """A dialog starting from ``problem`` (system prompt, then the query)."""
        messages = [{"role": "system", "content": problem.system}] if problem.system else []
        messages.append({"role": "user", "content": problem.query})
        return Dialog(problem, messages, traj_id, group_id)

    def sample(self, rng: random.Random) -> Problem:
        """A new problem from the task.

        Raises:
            EnvError: The task raised, or gave something else than a :class:`Problem`.
        """
        try:
            problem = self.task.sample(rng)
            if not isinstance(problem, Problem):
                raise TypeError(f"returned {type(problem).__name__}, not a Problem")
            _check_text("query", problem.query)
            if problem.system is not None:
                _check_text("system", problem.system)
        except BaseException as exc:  # the user's task: its error, as an env's (env/pool.py)
            raise EnvError.of(self.name, exc, "sample(): ") from exc
        return problem

    def _judge(self, dialog: Dialog, content: str) -> Outcome:
        """The task's verdict on a response, checked as a step of an env is.

        Raises:
            EnvError: ``score`` raised, or gave something else than an :class:`Outcome`
                with a real reward, flags with one truth value each (not a tensor of
                several) and a text (or None) reply.
        """
        try:
            outcome = self.task.score(dialog.problem, content, dialog.turns)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"returned {type(outcome).__name__}, not an Outcome")
            if isinstance(outcome.reward, str | bytes):  # float() would parse text
                raise TypeError(f"reward {outcome.reward!r:.40} is not a number")
            if outcome.reply is not None:
                _check_text("reply", outcome.reply)
            # None, a list, a tensor of several values...: TypeError, ValueError
            reward, terminated, success = (
                float(outcome.reward),
                bool(outcome.terminated),
                bool(outcome.success),
            )
        except BaseException as exc:  # the user's task: its error, as an env's (env/pool.py)
            raise EnvError.of(self.name, exc, "score(): ") from exc
        return dataclasses.replace(outcome, reward=reward, terminated=terminated, success=success)

    def run(
        self,
        dialogs: Sequence[Dialog],
        settings: GenerationSettings,
        max_turns: int,
        generator: torch.Generator,
    ) -> list[Turn]:
        """One turn of every dialog (advanced in place); returns the turns in order."""
        tokenizer = self.models.tokenizer
        prompts = [self._prompt_ids(d) for d in dialogs]
        budgets = [min(settings.max_new_tokens, self.models.context - len(p)) for p in prompts]
        rows = [i for i, b in enumerate(budgets) if b > 0]
        generation = None
        if rows:
            generation = self.models.generate(
                [prompts[i] for i in rows],
                settings,
                budgets=[budgets[i] for i in rows],
                stop_ids=(*self.models.end_ids, *settings.stop_token_ids),
                pad_id=self.pad_id,
                generator=generator,
            )
        turns = []
        for index, dialog in enumerate(dialogs):
            if generation is not None and index in rows:
                row = rows.index(index)
                length = int(generation.lengths[row])
                response = generation.tokens[row, :length].tolist()
                log_probs = generation.log_probs[row, :length]
                versions = generation.versions[row, :length]
                stopped = bool(generation.stopped[row])
            else:  # the prompt fills the context: the dialog ends truncated
                response, stopped = [], False
                log_probs = torch.zeros(0)
                versions = torch.zeros(0, dtype=torch.long)
            version = int(versions[0]) if len(response) else self.models.version
            overflow = len(prompts[index]) + len(response) >= self.models.context
            turns.append(
                self._score(
                    dialog,
                    prompts[index],
                    response,
                    log_probs,
                    versions,
                    version,
                    stopped,
                    truncate=overflow or dialog.turns + 1 >= max_turns,
                    tokenizer=tokenizer,
                )
            )
        return turns

    def _prompt_ids(self, dialog: Dialog) -> list[int]:
        """The dialog's prompt: the model's chat template over its history.

        Raises:
            EnvError: The template refused the task's messages (a system prompt or a
                role order the model's template does not take) or rendered no token.
        """
        try:
            out = self.models.tokenizer.apply_chat_template(
                dialog.messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            ids = list(out["input_ids"])
            if not ids:
                raise ValueError("rendered no token")
        except Exception as exc:  # the task's messages against the model's template
            roles = ", ".join(m["role"] for m in dialog.messages)
            raise EnvError.of(
                self.name, exc, f"the model's chat template over the roles [{roles}]: "
            ) from exc
        return ids

    def _score(
        self,
        dialog: Dialog,
        prompt: list[int],
        response: list[int],
        log_probs: torch.Tensor,
        versions: torch.Tensor,
        version: int,
        stopped: bool,
        *,
        truncate: bool,
        tokenizer: Any,
    ) -> Turn:
        body = response[:-1] if stopped else response
        content = tokenizer.decode(body, skip_special_tokens=True)
        dialog.turns += 1
        # No room left in the context: the dialog is cut, not judged.
        outcome = self._judge(dialog, content) if response else Outcome(0.0, terminated=False)
        full = [*dialog.messages, {"role": "assistant", "content": content}]
        terminated = outcome.terminated
        truncated = not terminated and truncate
        dialog.messages = (
            [*full, {"role": "user", "content": outcome.reply}] if outcome.reply else full
        )
        return Turn(
            prompt=prompt,
            response=response,
            log_probs=log_probs,
            versions=versions,
            version=version,
            query=dialog.problem.query,
            text_prompt=tokenizer.decode(prompt),
            text_response=tokenizer.decode(response),
            messages=dialog.messages,
            full_length=len(full),
            reward=outcome.reward,
            terminated=terminated,
            truncated=truncated,
            success=outcome.success,
            stopped=stopped,
            traj_id=dialog.traj_id,
            group_id=dialog.group_id,
            dialog_turns=dialog.turns,
        )


def _strings(values: list[Any], shape: tuple[int, ...]) -> NonTensorStack:
    nested: Any = values
    for size in reversed(shape[1:]):
        nested = [nested[i : i + size] for i in range(0, len(nested), size)]
    return NonTensorStack.from_list(nested) if shape else NonTensorStack(*values)


class PackedSize:
    """A running estimate of the packet :func:`pack_turns` makes of the turns added.

    Rows are padded to the widest turn, so a row costs the widest turn's tokens (8 bytes
    each), log-probs and token versions (12 bytes a response token) and message slots;
    texts cost a byte a character (more for non-ASCII: the encoder's own cap then
    refuses the batch). An LLM batch grows turn by turn; this lets the core stop a batch
    the packet cap would refuse before it fills the actor's memory.
    """

    def __init__(self) -> None:
        self.rows = 0
        self._width = self._span = self._messages = self._text = 0

    def add(self, turns: Sequence[Turn]) -> None:
        """Count ``turns`` in."""
        for turn in turns:
            self.rows += 1
            self._width = max(self._width, len(turn.prompt) + len(turn.response))
            self._span = max(self._span, len(turn.response))
            self._messages = max(self._messages, len(turn.messages))
            self._text += len(turn.text_prompt) + len(turn.text_response) + len(turn.query)
            self._text += sum(len(m["role"]) + len(m["content"]) for m in turn.messages)

    @property
    def nbytes(self) -> int:
        """The estimated packet bytes."""
        per_row = 8 * self._width + 12 * self._span + 16 * self._messages + 128
        return self.rows * per_row + self._text


def pack_turns(
    turns: Sequence[Turn], shape: tuple[int, ...], pad_id: int, token_versions: bool
) -> TensorDict:
    """Lay turns out in the padded wire form, batch ``shape`` (row-major over ``turns``)."""
    count = len(turns)
    tokens, log_probs, versions = _dense(turns, pad_id)
    width, span = tokens.shape[-1], log_probs.shape[-1]
    messages = max((len(t.messages) for t in turns), default=0)
    roles = [m["role"] for t in turns for m in _padded(t.messages, messages)]
    contents = [m["content"] for t in turns for m in _padded(t.messages, messages)]

    def column(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(values, dtype=dtype).reshape(shape)

    def flag(values: list[bool]) -> torch.Tensor:
        return column(values, torch.bool).unsqueeze(-1)

    false = [False] * count
    td = TensorDict(
        {
            "tokens": tokens.reshape(*shape, width),
            "prompt_len": column([len(t.prompt) for t in turns], torch.long),
            "response_len": column([len(t.response) for t in turns], torch.long),
            "log_probs": log_probs.reshape(*shape, span),
            "policy_version": column([t.version for t in turns], torch.long),
            "done": flag(false),
            "terminated": flag(false),
            "truncated": flag(false),
            "history": {
                "length": column([t.full_length for t in turns], torch.long),
                "next_length": column([len(t.messages) for t in turns], torch.long),
                "role": _strings(roles, (*shape, messages)),
                "content": _strings(contents, (*shape, messages)),
            },
            "text": {
                "prompt": _strings([t.text_prompt for t in turns], shape),
                "response": _strings([t.text_response for t in turns], shape),
            },
            "query": _strings([t.query for t in turns], shape),
            "collector": {
                "traj_ids": column([t.traj_id for t in turns], torch.long),
                "group_id": column([t.group_id for t in turns], torch.long),
                "stopped": column([t.stopped for t in turns], torch.bool),
                "dialog_turns": column([t.dialog_turns for t in turns], torch.long),
            },
            "next": {
                "reward": column([t.reward for t in turns], torch.float32).unsqueeze(-1),
                "success": flag([t.success for t in turns]),
                "done": flag([t.done for t in turns]),
                "terminated": flag([t.terminated for t in turns]),
                "truncated": flag([t.truncated for t in turns]),
            },
        },
        batch_size=shape,
    )
    if token_versions:
        td.set(("collector", "token_policy_version"), versions.reshape(*shape, span))
    return td


def _dense(turns: Sequence[Turn], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt ‖ response`` tokens, response log-probs and token versions."""
    width = max((len(t.prompt) + len(t.response) for t in turns), default=0)
    span = max((len(t.response) for t in turns), default=0)
    tokens = torch.full((len(turns), width), pad_id, dtype=torch.long)
    log_probs = torch.zeros((len(turns), span), dtype=torch.float32)
    versions = torch.zeros((len(turns), span), dtype=torch.long)
    for i, turn in enumerate(turns):
        full = turn.prompt + turn.response
        tokens[i, : len(full)] = torch.as_tensor(full, dtype=torch.long)
        log_probs[i, : len(turn.response)] = turn.log_probs
        versions[i, : len(turn.response)] = turn.versions
    return tokens, log_probs, versions


def _padded(messages: list[dict[str, str]], size: int) -> list[dict[str, str]]:
    return messages + [{"role": "", "content": ""}] * (size - len(messages))


def _check_text(field: str, value: object) -> None:
    """Refuse a task's text that no tokenizer takes: not a ``str``, or not valid UTF-8.

    Raises:
        TypeError: ``value`` is not a ``str``.
        ValueError: It holds a lone surrogate (bytes decoded with ``surrogateescape``).
    """
    if not isinstance(value, str):
        raise TypeError(f"{field} {value!r:.40} is not a str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field} is not valid UTF-8: {exc.reason} at character {exc.start} "
            f"({value[max(0, exc.start - 20) : exc.start]!r} before it)"
        ) from None
