"""Converters of the ``rlfleet-actor`` flags and variables: text in, a checked value out.

Each converter raises :class:`BadValue` with the reason; the command line
(:mod:`actor_service._cli._main`) prefixes the flag or variable it came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

from actor_service._config import CHOICES, INT_RANGES
from common.import_paths import IMPORT_PATH_RE
from common.plain_config import to_plain

__all__ = [
    "TORCHRL_BACKEND",
    "BadValue",
    "boolean",
    "choice",
    "chosen",
    "existing_file_or_empty",
    "factory",
    "float_min",
    "import_path_or_empty",
    "int_in",
    "json_object",
    "lora",
    "nonempty",
    "optional",
    "ranged",
    "share",
]


# ``--env-backend torchrl`` spells ``--kind torchrl --env-backend sync``: an actor that hosts
# ``GymEnv(--env)`` (or the factory's TorchRL env) in-process.
TORCHRL_BACKEND = "torchrl"


class BadValue(ValueError):
    """A flag or variable value that does not convert; the message names why."""


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in ``[low, high]`` (no upper bound when ``high`` is None)."""

    def convert(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise BadValue(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise BadValue(f"expected an integer {bounds}, got {value}")
        return value

    return convert


def float_min(low: float, *, strict: bool) -> Callable[[str], float]:
    """A finite float above ``low`` (or at it unless ``strict``)."""

    def convert(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise BadValue(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise BadValue(f"expected a finite number {'>' if strict else '>='} {low}, got {text}")
        return value

    return convert


def share(text: str) -> float:
    """A fraction in (0, 1]."""
    value = float_min(0.0, strict=True)(text)
    if value > 1.0:
        raise BadValue(f"expected a number in (0, 1], got {text}")
    return value


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``)."""
    try:
        return _BOOLEANS[text.strip().lower()]
    except KeyError:
        raise BadValue(f"expected true or false, got {text!r}") from None


def choice(*choices: str) -> Callable[[str], str]:
    """One of ``choices``."""

    def convert(text: str) -> str:
        if text not in choices:
            raise BadValue(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return convert


def ranged(field: str) -> Callable[[str], int]:
    """The converter of an integer setting, with its range from :data:`INT_RANGES`."""
    return int_in(*INT_RANGES[field])


def chosen(field: str) -> Callable[[str], str]:
    """The converter of a choice setting, with its choices from :data:`CHOICES`."""
    return choice(*CHOICES[field])


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (a dict); the message shows the first 80 characters of a bad one.

    Nesting deeper than a learner's factory arguments may have (:data:`MAX_DEPTH`) is
    refused here: the actor rebuilds them recursively when it starts.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadValue(f"expected a JSON object, got {text!r:.80} ({exc})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise BadValue(f"expected a JSON object nested less deeply, got {text!r:.80}") from None
    if not isinstance(value, dict):
        raise BadValue(f"expected a JSON object, got {type(value).__name__}: {text!r:.80}")
    try:
        to_plain(value)  # the learner's own check of factory arguments
    except ValueError as exc:
        raise BadValue(str(exc)) from None
    return value


def nonempty(text: str) -> str:
    """The text without its surrounding blanks, which must leave something."""
    if not text.strip():
        raise BadValue("expected a non-empty value")
    return text.strip()


def factory(text: str) -> str:
    """A model factory: ``random``, ``mlp`` or ``package.module:function``."""
    if text.strip() not in ("random", "mlp") and not IMPORT_PATH_RE.match(text.strip()):
        raise BadValue(f"expected random, mlp or package.module:function, got {text!r}")
    return text.strip()


def import_path_or_empty(text: str) -> str:
    """A ``package.module:function`` path, or empty."""
    if text and not IMPORT_PATH_RE.match(text.strip()):
        raise BadValue(f"expected package.module:function, got {text!r}")
    return text.strip()


def optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """``convert``, or None for an empty value."""

    def wrapped(text: str) -> Any:
        return None if text.strip() == "" else convert(text)

    return wrapped


def lora(text: str) -> Any:
    """A LoRA setting (``common.llm.parse_lora``), None when empty."""
    from common.llm import parse_lora

    if not text.strip():
        return None
    try:
        return parse_lora(text)
    except ValueError as exc:
        raise BadValue(str(exc)) from None


def existing_file_or_empty(text: str) -> str:
    """The path of an existing file, or empty."""
    if text and not os.path.isfile(text):
        raise BadValue(f"no such file: {text!r}")
    return text
