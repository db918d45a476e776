"""A TorchRL env's state (its stateful transforms) and layout, as both sides read them.

An actor's env and a script's ``create_env_fn`` env hold state in their transforms
(``VecNorm``'s statistics, ``CatFrames``' frames, an ``ObservationNorm``'s ``loc``): the actor
hands it over in its ``state_dict()["env"]``, the learner loads it into the script's env, and
the actor starts its envs anew when its probe step moved it (``actor_service``'s TorchRL
core). Both ask :func:`env_has_state` whether there is any.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = [
    "batched_kind",
    "dense_refusal",
    "dynamic_shape_keys",
    "env_has_state",
    "lazy_stacked_keys",
    "quiet_fresh_vecnorm",
]

#: TorchRL's warnings about a ``VecNorm`` read or loaded before it saw a frame: they concern
#: statistics shared between processes, which the envs read here never share.
_FRESH_VECNORM = ("Querying state_dict on an uninitialized VecNorm", "VecNorm wasn't initialized")


@contextlib.contextmanager
def quiet_fresh_vecnorm() -> Iterator[None]:
    """Hide :data:`_FRESH_VECNORM` (and nothing else) within the block."""
    with warnings.catch_warnings():
        for message in _FRESH_VECNORM:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


def env_has_state(env: Any) -> bool:
    """Whether ``env`` has state to follow: stateful transforms, initialised or not yet.

    A transform that builds its buffers at the first step (``CatFrames``'s frames, an
    ``ObservationNorm`` before ``init_stats``) has state too: its ``state_dict()`` raises.
    A ``ParallelEnv`` not started yet is asked through one env its factory builds here (as
    it reads its specs): its workers, started for a ``state_dict()``, would die on that raise.
    """
    if batched_kind(env) == "ParallelEnv" and env.is_closed:
        local = env.create_env_fn[0](**env.create_env_kwargs[0])
        try:
            return env_has_state(local)
        finally:
            local.close(raise_if_closed=False)
    with quiet_fresh_vecnorm():
        try:
            return bool(env.state_dict())
        except ValueError:  # an uninitialised (lazy) buffer: state, once the env steps
            return True
        except (RuntimeError, AttributeError, TypeError):
            return False


def lazy_stacked_keys(env: Any) -> set[Any]:
    """The keys under which ``env``'s specs hold lazy stacks (agents of different shapes).

    The fleet's batches are dense: an actor refuses such an env, a learner such a
    ``create_env_fn``, both naming these keys.
    """
    return {  # output_spec's keys start with the spec's own name ("full_observation_spec")
        key[1] if len(key) == 2 else key[1:]
        for key, spec in env.output_spec.items(True, False)
        if _stacked_composite(spec) and len(key) > 1
    }


def dynamic_shape_keys(env: Any) -> set[Any]:
    """The keys whose specs have a dynamic dim (``-1``: a shape that varies from step to step).

    TorchRL's collectors lazy-stack such entries; the fleet's batches are dense, so an actor
    refuses such an env, a learner such a ``create_env_fn``, both naming these keys.
    """
    return {
        key[1] if len(key) == 2 else key[1:]
        for specs in (env.output_spec, env.input_spec)
        for key, spec in specs.items(True, True)
        if len(key) > 1 and -1 in tuple(getattr(spec, "shape", ()))
    }


def dense_refusal(env: Any, subject: str) -> str | None:
    """Why ``env``'s steps cannot travel as dense batches (``subject`` names it), or None.

    Agents of different shapes (:func:`lazy_stacked_keys`) and entries of a varying shape
    (:func:`dynamic_shape_keys`) are what TorchRL's collectors lazy-stack.
    """
    if lazy := lazy_stacked_keys(env):
        where, what = lazy, "agents of different shapes"
        cause = "a lazy stack, heterogeneous agents"
        fix = "give the agents one shape or put each kind of agent in a group of its own"
    elif dynamic := dynamic_shape_keys(env):
        where, what = dynamic, "entries of a varying shape"
        cause = "a -1 in their specs' shapes, which TorchRL's collectors lazy-stack"
        fix = "pad them to one shape in the env or a transform"
    else:
        return None
    keys = ", ".join(sorted(repr(k) for k in where))
    return f"{subject} has {what} under {keys} ({cause}): the fleet's batches are dense; {fix}"


def batched_kind(env: object) -> str | None:
    """``"ParallelEnv"`` (its envs in worker processes), ``"SerialEnv"`` or None.

    Known by its class's names: the libraries never import torchrl.
    """
    names = {cls.__name__ for cls in type(env).__mro__}
    return next((kind for kind in ("ParallelEnv", "SerialEnv") if kind in names), None)


def _stacked_composite(spec: object) -> bool:
    """Whether ``spec`` is a ``torchrl.data.StackedComposite``, known by its class's name.

    ``common`` never imports torchrl (an extra), so the class is not imported here.
    """
    return any(cls.__name__ == "StackedComposite" for cls in type(spec).__mro__)
