"""A frozen settings dataclass as a command line: one flag per field, validated by the class.

A job declares its fields with :func:`opt` (default and help text); :func:`parse_settings`
builds the ``argparse`` parser from them (the field name with dashes is the flag), so
the command line and the settings cannot drift apart, and turns a value the dataclass
refuses into an argparse error (exit code 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["check_positive_ints", "check_rank_shares", "opt", "parse_settings", "settings_parser"]

S = TypeVar("S")


def opt(default: Any, help_text: str, **extra: Any) -> Any:
    """A settings field: its default and its command-line help (``extra``: more metadata)."""
    return dataclasses.field(default=default, metadata={"help": help_text, **extra})


def check_positive_ints(settings: object, names: Iterable[str]) -> None:
    """Refuse any of the fields ``names`` of ``settings`` that is not a positive int.

    Raises:
        ValueError: Naming the first offending field and its value.
    """
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_rank_shares(num_actors: int, nproc_per_node: int) -> None:
    """Refuse a fleet the learner ranks cannot share equally (each starts its share).

    Raises:
        ValueError: ``num_actors`` is not a multiple of ``nproc_per_node``.
    """
    if num_actors % nproc_per_node:
        raise ValueError(
            f"num_actors ({num_actors}) must be a multiple of nproc_per_node "
            f"({nproc_per_node}): each learner rank starts an equal share of the fleet"
        )


def _parse_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers (e.g. 64,64), got {text!r}"
        ) from None


def _parse_strs(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _means_unset(text: str) -> bool:
    """The word the help writes for an unset optional flag (``none``), in any case or spacing."""
    return text.strip().lower() in ("", "none")


def _parse_optional_int(text: str) -> int | None:
    return None if _means_unset(text) else int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError("expected a number, got nan")
    return value


def _parse_optional_float(text: str) -> float | None:
    return None if _means_unset(text) else _parse_float(text)


# argparse names a parser in its "invalid <name> value" message.
_parse_optional_int.__name__ = "int"
_parse_float.__name__ = _parse_optional_float.__name__ = "float"

# Field types are strings under `from __future__ import annotations`.
_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": _parse_float,
    "str": str,
    "tuple[int, ...]": _parse_ints,
    "tuple[str, ...]": _parse_strs,
    "float | None": _parse_optional_float,
    "int | None": _parse_optional_int,
}


def settings_parser(settings_type: type, prog: str, description: str) -> argparse.ArgumentParser:
    """Build a parser with one flag per field of a settings dataclass.

    The field name with dashes is the flag and its ``help`` metadata the help; a
    ``bool`` field is ``--flag/--no-flag``, or ``--flag/--<negative>`` when its
    metadata names a ``negative``.

    Args:
        settings_type: A dataclass whose fields have ``help`` metadata.
        prog: The program name shown in the usage line.
        description: The parser's description.

    Returns:
        A parser whose namespace holds one attribute per field.
    """
    # No abbreviations: a mistyped flag (--num-env) is an error, not another flag.
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    for field in dataclasses.fields(settings_type):
        flag = "--" + field.name.replace("_", "-")
        if field.type != "bool":
            help_text = field.metadata["help"]
            if "default" not in help_text:  # some helps say their default in their words
                help_text += f" (default: {_shown(field.default)})"
            parser.add_argument(
                flag, type=_PARSERS[str(field.type)], default=field.default, help=help_text
            )
            continue
        negative = "--" + field.metadata.get("negative", "no-" + flag[2:])
        help_text = f"{field.metadata['help']} (default: {flag if field.default else negative})"
        if field.metadata.get("negative"):
            group = parser.add_mutually_exclusive_group()
            group.add_argument(flag, dest=field.name, action="store_true", help=help_text)
            group.add_argument(negative, dest=field.name, action="store_false")
            parser.set_defaults(**{field.name: field.default})
        else:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default, help=help_text
            )
    return parser


def _shown(default: object) -> str:
    """A default as the flag would be written: ``64,64`` for a tuple; ``none`` when unset."""
    if default in ((), "", None):
        return "none"
    if isinstance(default, tuple):
        return ",".join(map(str, default))
    return str(default)


def parse_settings(
    settings_type: type[S],
    prog: str,
    description: str,
    argv: Sequence[str] | None,
) -> S:
    """Parse a command line into validated settings of ``settings_type``.

    Args:
        settings_type: The settings dataclass (its fields are the flags).
        prog: The program name shown in the usage line.
        description: The parser's description.
        argv: The arguments without the program name; None reads ``sys.argv``.

    Returns:
        The settings.

    Raises:
        SystemExit: On an unknown flag or an invalid value (argparse prints why).
    """
    parser = settings_parser(settings_type, prog, description)
    namespace = parser.parse_args(argv)
    try:
        settings = settings_type(**vars(namespace))
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this keeps type checkers informed
    out_dir = getattr(settings, "out_dir", None)
    problem = _unwritable(pathlib.Path(out_dir)) if out_dir else None
    if problem:  # found before the run, not after it trained
        parser.error(f"--out {out_dir}: {problem}")
    return settings


def _unwritable(out_dir: pathlib.Path) -> str | None:
    """Why the job could not write its results to ``out_dir`` (made at the end), or None.

    The directory or its nearest existing parent must be a directory one can make
    directories in; nothing is left there.
    """
    path = out_dir.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return f"{path} is a file, not a directory"
    try:  # a directory made and removed there: what the job will do (access() trusts root)
        os.rmdir(tempfile.mkdtemp(prefix=".rlfleet-probe-", dir=path))
    except OSError as exc:
        return f"cannot make a directory in {path} ({exc.strerror})"
    return None
