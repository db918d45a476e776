"""Settings of LLM collection: how tokens are drawn and what a session collects.

:class:`GenerationSettings` and :class:`LLMSettings` travel in the ``open`` message;
the actor validates them against its own caps and refuses bad ones with INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS_CAP",
    "MAX_TURNS",
    "MIN_TEMPERATURE",
    "GenerationSettings",
    "LLMSettings",
]

#: The most new tokens per turn an actor accepts unless configured otherwise.
DEFAULT_MAX_NEW_TOKENS_CAP = 4096
_MAX_STOP_TOKENS = 64
#: The most turns a session may give a dialog (``LLMSettings.max_turns``; also the learner's
#: bound on the turns a dialog may count when the session sets none).
MAX_TURNS = 1 << 20
#: The lowest sampling temperature: vLLM samples at 0.01 below it (and the recorded
#: log-probs would not be those of the draw), and float32 ``logits / T`` overflows to
#: NaN log-probs as T nears float32's range. 0 stays greedy.
MIN_TEMPERATURE = 0.01


def _int(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How an LLM actor draws tokens. Nothing else applies: no library default ever does.

    The behaviour log-probs recorded are those of the distribution a token was drawn
    from: ``log_softmax(logits)`` when greedy, ``log_softmax(logits / temperature)``
    after the top-k / top-p cut (renormalised) when sampling
    (:func:`common.llm.process_logits`).

    Attributes:
        max_new_tokens: Most tokens generated per turn (> 0, at most the actor's cap).
        temperature: 0 is greedy (argmax); from ``MIN_TEMPERATURE`` (0.01) it samples from
            ``softmax(logits / T)``.
        top_p: Nucleus mass in (0, 1]; 1 is off.
        top_k: Keep the k most likely tokens; 0 is off.
        stop_token_ids: Tokens that end a response besides the tokenizer's EOS.
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int("max_new_tokens", self.max_new_tokens, 1, 2**31 - 1)
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got "
                f"{self.temperature!r} (below it vLLM samples at {MIN_TEMPERATURE} and "
                "logits / temperature overflows float32)"
            )
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        _int("top_k", self.top_k, 0, 2**31 - 1)
        stops = self.stop_token_ids
        if not isinstance(stops, tuple) or len(stops) > _MAX_STOP_TOKENS:
            raise ValueError(
                f"stop_token_ids must be a tuple of at most {_MAX_STOP_TOKENS} ints, "
                f"got {self.stop_token_ids!r}"
            )
        for token in self.stop_token_ids:
            _int("a stop token id", token, 0, 2**31 - 1)

    @property
    def greedy(self) -> bool:
        """Whether tokens are the argmax (``temperature == 0``)."""
        return self.temperature == 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> GenerationSettings:
        """Build from a dict such as ``{"max_new_tokens": 8, "temperature": 0}``.

        Raises:
            TypeError: ``values`` is not a mapping (a ``GenerationSettings``, a string).
            ValueError: An unknown key or a value out of range, naming it.
        """
        if values is not None and not isinstance(values, Mapping):
            raise TypeError(
                f"generation must be a dict such as {{'max_new_tokens': 8}} or None, got "
                f"{type(values).__name__} {values!r:.60}"
            )
        values = dict(values or {})
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown generation keys {unknown}; known: {sorted(known)}")
        if "stop_token_ids" in values:
            try:
                values["stop_token_ids"] = tuple(values["stop_token_ids"])
            except TypeError:  # an int, None: not a list of ids
                raise ValueError(
                    f"stop_token_ids must be a list of token ids, got "
                    f"{values['stop_token_ids']!r:.40}"
                ) from None
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class LLMSettings:
    """What an LLM session collects, beside ``CollectSettings``' turn counts.

    ``CollectSettings.frames_per_batch`` counts dialog turns (TorchRL's
    ``dialog_turns_per_batch``) and ``total_frames`` the total dialog turns.

    Attributes:
        generation: How tokens are drawn.
        group_size: GRPO G: every prompt is answered by G slots of one actor, marked
            by ``("collector", "group_id")``; must divide the actor's slot count.
        yield_completed_trajectories: Batches of whole dialogs (``[sum T_i]``).
        yield_only_last_steps: Only the last turn of each dialog (``[n]``).
        max_turns: Turn limit of a dialog; 0 keeps the task's.
        token_versions: Record the policy version of every response token.
        vocab_size: The learner model's vocabulary (its embedding rows); 0 checks nothing.
            An actor whose model draws from more token ids (its output rows) refuses the
            session, and a batch holding a token id at or beyond it is refused by the learner.
    """

    generation: GenerationSettings = dataclasses.field(default_factory=GenerationSettings)
    group_size: int = 1
    yield_completed_trajectories: bool = False
    yield_only_last_steps: bool = False
    max_turns: int = 0
    token_versions: bool = False
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.generation, GenerationSettings):
            raise TypeError(
                f"generation must be a GenerationSettings, got {type(self.generation).__name__}"
            )
        for flag in ("yield_completed_trajectories", "yield_only_last_steps", "token_versions"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, got {getattr(self, flag)!r:.40}")
        _int("group_size", self.group_size, 1, 65536)
        _int("max_turns", self.max_turns, 0, MAX_TURNS)
        _int("vocab_size", self.vocab_size, 0, 2**32 - 1)

    @property
    def trajectories(self) -> bool:
        """Whether batches hold completed dialogs (either trajectory mode)."""
        return self.yield_completed_trajectories or self.yield_only_last_steps
