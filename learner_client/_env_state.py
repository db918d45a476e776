"""The script's env following the actors' env state (``create_env_fn``'s env).

An actor's ``state_dict()["env"]`` is its pool's state (``worker0``, ``worker1``... for the
envs it steps). :func:`joined_state` makes the script's env's state of the first actors'
(one env's when the script's env is unbatched; several actors' envs in turn when it holds
more envs than one actor), and :func:`load_env_state` loads it as if the script's env had
stepped, all or nothing: a state that does not fit leaves the env as it was.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from common.env_state import batched_kind, quiet_fresh_vecnorm

__all__ = ["joined_state", "load_env_state", "pool_size"]


def load_env_state(env: Any, state: Mapping[str, Any]) -> None:
    """Load an actor's env state (its ``state_dict()``) into ``env``, as if ``env`` had stepped.

    What TorchRL's helpers read after a ``Collector`` stepped the env is then there:
    ``VecNorm``'s ``loc``/``scale`` (v1 and v2) on an env that never stepped itself, and
    the buffers transforms build at their first step (``CatFrames``) materialised in the
    actor's shapes. TorchRL's warnings about a ``VecNorm`` loaded before its first frame
    (they concern statistics shared between processes) are not raised. ``env``'s
    parameters (networks in its transforms) are the learner's: they are kept, never
    replaced by the actor's copy (the learner pushes them, ``common.env_weights``).

    Raises:
        RuntimeError, KeyError, ValueError, TypeError: ``state`` does not fit ``env``
            (nothing of it stays loaded).
    """
    envs, given = getattr(env, "num_workers", None), pool_size(state)
    if isinstance(envs, int) and given is not None and given != envs:  # nothing loaded, not half
        raise KeyError(f"the actors' state holds {given} envs, create_env_fn's env {envs}")
    _materialize(env, state)
    with quiet_fresh_vecnorm():
        kept = _without_parameters(env, state)
        before = _copied(env.state_dict())
        try:
            if kept is None:
                env.load_state_dict(state)
            else:
                env.load_state_dict(kept, strict=False)
        except BaseException:
            # torch loads every entry that fits before it raises for those that do not:
            # what went in goes back, so a refused state leaves nothing of it.
            env.load_state_dict(before, strict=False)
            raise


def _copied(state: Any) -> Any:
    """A copy of a ``state_dict()`` (nested per env in a batched env's), tensors cloned."""
    if isinstance(state, Mapping):
        return OrderedDict((key, _copied(value)) for key, value in state.items())
    clone = getattr(state, "clone", None)
    return clone() if callable(clone) else copy.deepcopy(state)


def _without_parameters(env: Any, state: Mapping[str, Any]) -> dict[str, Any] | None:
    """``state`` less the entries of ``env``'s parameters; None when ``env`` has none.

    Raises:
        KeyError: ``state`` lacks another entry of ``env``'s, or has one ``env`` lacks.
    """
    pointers = {p.data_ptr() for p in env.parameters()} if isinstance(env, torch.nn.Module) else ()
    if not pointers:
        return None
    own = env.state_dict()
    owned = {k for k, v in own.items() if isinstance(v, torch.Tensor) and v.data_ptr() in pointers}
    kept = {k: v for k, v in state.items() if k not in owned}
    missing, unexpected = own.keys() - owned - kept.keys(), kept.keys() - own.keys()
    if missing or unexpected:
        raise KeyError(
            f"the env states differ: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}"
        )
    return kept


def _materialize(env: Any, state: Mapping[str, Any]) -> None:
    """Give ``env``'s uninitialised buffers the shape and dtype of their entry in ``state``.

    A ``SerialEnv``'s envs (started first, as its ``load_state_dict`` starts them) each take
    theirs from its ``worker<i>`` entry. A ``ParallelEnv``'s envs live in its workers, which
    die on a ``state_dict()`` of such buffers: one not started yet is reset, as TorchRL's
    ``Collector`` resets its env, so that they build them.
    """
    kind = batched_kind(env)
    if kind == "ParallelEnv":
        if env.is_closed:
            env.reset()
        return
    if kind == "SerialEnv":
        if env.is_closed:
            env.start()
        for index, inner in enumerate(env._envs):
            part = state.get(f"worker{index}")
            if isinstance(part, Mapping):
                _materialize(inner, part)
        return
    transform = getattr(env, "transform", None)
    if not isinstance(transform, torch.nn.Module):
        return
    for name, buffer in transform.named_buffers():
        value = state.get(name)
        if isinstance(buffer, torch.nn.parameter.UninitializedBuffer) and isinstance(
            value, torch.Tensor
        ):
            buffer.materialize(value.shape, device=buffer.device, dtype=value.dtype)


def pool_size(state: Mapping[str, Any]) -> int | None:
    """How many envs an actor's pool state holds (``worker0``...); None: not a pool's."""
    workers = [k for k in state if isinstance(k, str) and k.startswith("worker")]
    return len(workers) if workers and len(workers) == len(state) else None


def joined_state(states: list[Mapping[str, Any]], env: Any) -> Mapping[str, Any]:
    """The actors' pool states as the script's env's.

    The first actor's alone (one env's when the script's env is unbatched), or each
    actor's envs in turn, as the batch lays them out (``worker0``, ``worker1``...).
    """
    if len(states) == 1 or any(pool_size(s) is None for s in states):
        return _one_env(states[0], env)
    joined: dict[str, Any] = {}
    for state in states:
        for key in sorted(state, key=lambda k: int(k[len("worker") :])):
            joined[f"worker{len(joined)}"] = state[key]
    return joined


def _one_env(state: Mapping[str, Any], env: Any) -> Mapping[str, Any]:
    """An actor pool's state as one env's: ``worker0``'s, when the script's env is unbatched."""
    batched = tuple(getattr(env, "batch_size", ())) != ()
    inner = state.get("worker0")
    if not batched and isinstance(inner, Mapping) and all(k.startswith("worker") for k in state):
        return inner
    return state
