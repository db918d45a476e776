"""What an ``env_factory`` must return: one gymnasium env.

The env pool builds every env through :func:`one_env` (a spawned worker imports this module,
which loads neither torch nor gRPC), and the command line's check before binding builds its
env the same way, so an in-process server refuses what the command line refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

__all__ = ["NotOneEnvError", "one_env"]


class NotOneEnvError(ValueError):
    """An env factory returned something other than one gymnasium env (the fix is named)."""


def one_env(factory: Callable[..., Any], name: str, /, **kwargs: Any) -> gymnasium.Env:
    """One env of the pool from ``factory`` (the ``env_factory`` called ``name``).

    The env pool and the check before binding both build their envs through it, so an
    in-process server refuses what the command line refuses.

    Raises:
        ValueError: ``factory`` returned a TorchRL env (``--kind torchrl`` is the fix), a
            vector env (the actor builds ``num_envs`` envs itself), or no gymnasium env.
    """
    env = factory(**kwargs)
    if isinstance(env, gymnasium.Env):
        return env
    if callable(getattr(env, "close", None)):
        env.close()
    if callable(getattr(env, "fake_tensordict", None)) or type(env).__module__.startswith(
        "torchrl."
    ):
        raise NotOneEnvError(
            f"env_factory {name!r} returns a TorchRL env ({type(env).__name__}), which a "
            f"gymnasium actor (--kind env, the default) cannot step: run it on a TorchRL-env "
            f'actor, --kind torchrl (LocalFleet(..., kind="torchrl"), RLFLEET_KIND=torchrl)'
        )
    if isinstance(env, gymnasium.vector.VectorEnv):
        raise NotOneEnvError(
            f"env_factory {name!r} returned a {type(env).__name__}, a vector env of "
            f"{env.num_envs} envs: it must return one env (gymnasium.make(...), not "
            "gymnasium.make_vec(...) or a VectorEnv); the actor steps num_envs of them "
            "(num_envs=, --num-envs)"
        )
    raise NotOneEnvError(
        f"env_factory {name!r} returned a {type(env).__name__}, not a gymnasium.Env: it "
        "must return one env (gymnasium.make(...) or an Env subclass)"
    )
