"""A script's OmegaConf (Hydra) config as plain JSON data, and back on the actor.

A TorchRL script built with Hydra hands its factories the config it has, a ``DictConfig``
(``make_env(cfg)``, ``make_policy(env, cfg)``). Factory arguments travel to actors as JSON
(never pickle): :func:`to_plain` turns each OmegaConf container among them into its plain
data (``OmegaConf.to_container(..., resolve=True)``: interpolations resolved) under the
marker key :data:`OMEGACONF_KEY`, and :func:`from_plain` rebuilds a ``DictConfig`` (or
``ListConfig``) there when omegaconf is importable on the actor, plain dicts and lists
otherwise. Nothing here imports omegaconf unless a config is at hand.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["OMEGACONF_KEY", "from_plain", "to_plain"]

#: The key of a one-key mapping that stands for an OmegaConf container's plain data.
OMEGACONF_KEY = "__omegaconf__"


def _is_omegaconf(value: object) -> bool:
    cls = type(value)
    return cls.__module__.startswith("omegaconf") and cls.__name__ in ("DictConfig", "ListConfig")


def to_plain(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` (a mapping or a whole ``DictConfig``) with every OmegaConf container made JSON.

    Raises:
        omegaconf.errors.MissingMandatoryValue: A ``???`` value the config leaves unset.
    """
    return {str(key): _plain(value) for key, value in kwargs.items()}


def _plain(value: Any) -> Any:
    if _is_omegaconf(value):
        omegaconf = importlib.import_module("omegaconf")
        return {OMEGACONF_KEY: omegaconf.OmegaConf.to_container(value, resolve=True)}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


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
