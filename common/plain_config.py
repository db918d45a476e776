"""A script's OmegaConf (Hydra) config as plain JSON data, and back on the actor.

A TorchRL script built with Hydra hands its factories the config it has, a ``DictConfig``
(``make_env(cfg)``, ``make_policy(env, cfg)``). Factory arguments travel to actors as JSON
(never pickle): :func:`to_plain` turns each OmegaConf container among them into its plain
data (``OmegaConf.to_container(..., resolve=True)``: interpolations resolved) under the
marker key :data:`OMEGACONF_KEY`, and :func:`from_plain` rebuilds a ``DictConfig`` (or
``ListConfig``) there when omegaconf is importable on the actor, plain dicts and lists
otherwise. What JSON would not give the factory as the script has it (an enum but a str or
int one, a ``Path``, bytes, a tensor, a callable, a key that is not a string, nesting deeper
than :data:`MAX_DEPTH`) is refused by :func:`to_plain`, naming where it is. Nothing here imports
omegaconf unless a config is at hand.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_DEPTH", "OMEGACONF_KEY", "from_plain", "to_plain"]

#: The key of a one-key mapping that stands for an OmegaConf container's plain data.
OMEGACONF_KEY = "__omegaconf__"

#: The deepest nesting of dicts and lists factory arguments may have (the actor rebuilds
#: them recursively).
MAX_DEPTH = 100

_FIX = (
    "give its plain form (str(path), a tensor's .tolist(), an enum's .name, a function's "
    "'package.module:function') and rebuild it in the factory"
)


def _is_omegaconf(value: object) -> bool:
    cls = type(value)
    return cls.__module__.startswith("omegaconf") and cls.__name__ in ("DictConfig", "ListConfig")


def to_plain(kwargs: Mapping[str, Any], name: str = "kwargs") -> dict[str, Any]:
    """``kwargs`` (a mapping or a whole ``DictConfig``) with every OmegaConf container made JSON.

    Args:
        kwargs: The factory's keyword arguments.
        name: What the messages call them (``"env_kwargs"``).

    Raises:
        TypeError: A value JSON does not carry as it is (anything but strings, numbers,
            bools, None, lists, tuples, mappings and OmegaConf containers: an enum but a str or int
            one) or a key
            that is not a string; the message names where it is and the fix.
        ValueError: Dicts and lists nested deeper than :data:`MAX_DEPTH`.
        omegaconf.errors.MissingMandatoryValue: A ``???`` value read on the way (by an
            interpolation; a top-level one of a whole ``DictConfig`` as ``kwargs``).
    """
    return _mapping(kwargs, name, 1)


def _mapping(value: Mapping[Any, Any], where: str, depth: int) -> dict[str, Any]:
    for key in value:
        if not isinstance(key, str):
            raise TypeError(
                f"{where} has the key {key!r} ({type(key).__name__}): an actor gets its "
                f"factory's arguments as JSON, whose keys are strings; use {str(key)!r}"
            )
    return {key: _plain(item, f"{where}[{key!r}]", depth) for key, item in value.items()}


def _plain(value: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(
            f"{where:.120}... is nested more than {MAX_DEPTH} levels deep: an actor gets its "
            "factory's arguments as JSON it rebuilds; flatten them"
        )
    if _is_omegaconf(value):
        omegaconf = importlib.import_module("omegaconf")
        data = omegaconf.OmegaConf.to_container(value, resolve=True)
        return {OMEGACONF_KEY: _plain(data, where, depth)}
    if isinstance(value, Mapping):
        return _mapping(value, where, depth + 1)
    if isinstance(value, list | tuple):
        return [_plain(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, str | int | float | None):  # a str or int enum: JSON gives its value
        return value
    raise TypeError(
        f"{where} is a {type(value).__name__} ({value!r:.60}), which an actor cannot get "
        f"as JSON: {_FIX}"
    )


def from_plain(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` as the factory gets them: each marked config a ``DictConfig`` again.

    Without omegaconf on this side the configs stay plain dicts and lists.
    """
    try:
        omegaconf: Any = importlib.import_module("omegaconf")
    except ImportError:
        omegaconf = None
    return {key: _rebuilt(value, omegaconf) for key, value in kwargs.items()}


def _rebuilt(value: Any, omegaconf: Any) -> Any:
    if isinstance(value, Mapping):
        if set(value) == {OMEGACONF_KEY}:
            inner = value[OMEGACONF_KEY]
            return inner if omegaconf is None else omegaconf.OmegaConf.create(inner)
        return {key: _rebuilt(item, omegaconf) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item, omegaconf) for item in value]
    return value
