"""What ``rlfleet-actor --kind env`` checks before it binds a port.

An env id must be registered with gymnasium; an env factory must return a gymnasium env
(a TorchRL env names ``--kind torchrl``).
A gymnasium actor's custom policies are built on one env's spaces, which must not read
more than a gymnasium step holds: a TensorDict policy that needs ``is_init``, recurrent
states or keys other than ``observation`` belongs on ``--kind torchrl``. The env is
built once here, then closed.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium.envs.registration import parse_env_id

from actor_service._config import ActorConfig, ModelSpec
from common.plain_config import from_plain

__all__ = ["check"]


def check(config: ActorConfig) -> None:
    """Raise ``ValueError`` if the env factory or a custom policy of ``config`` cannot run here.

    Raises:
        ValueError: The reason, naming the env or the model and the offending keys; an env
            factory that returns a TorchRL env names ``--kind torchrl``.
    """
    custom = [spec for spec in config.models if ":" in spec.path]
    if not config.env_factory:
        _check_registered(config.env)
    if not custom and not config.env_factory:
        return  # gymnasium.make's env, and built-ins that read observations only
    from actor_service._core._settings import env_name
    from actor_service._kinds.env.pool import env_fn

    try:
        env = env_fn(config)()
    except Exception as exc:
        raise ValueError(
            f"env {env_name(config.env_pool)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    try:
        _check_not_torchrl(config, env)
        if not isinstance(env, gymnasium.Env):
            raise ValueError(
                f"env_factory {config.env_factory!r} returned a {type(env).__name__}, not a "
                "gymnasium.Env: it must return one env (gymnasium.make(...) or an Env "
                "subclass)"
            )
        spaces = env.observation_space, env.action_space
    finally:
        if callable(getattr(env, "close", None)):
            env.close()
    _check_policies(custom, spaces)


def _check_registered(env_id: str) -> None:
    """Raise ``ValueError`` unless ``gymnasium.make`` will find ``env_id``.

    A typo or an unknown version is named with the ones there are. A ``module:id`` is left
    to ``make``, which imports the module first, and so is an id without a version, which
    ``make`` resolves to the newest (``gymnasium.spec`` does not).
    """
    if ":" in env_id:
        return
    try:
        if parse_env_id(env_id)[2] is not None:
            gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise ValueError(f"env {env_id!r}: {exc}") from exc


def _check_not_torchrl(config: ActorConfig, env: Any) -> None:
    """A TorchRL env from the factory: the fix is ``--kind torchrl``, not a gymnasium error."""
    if callable(getattr(env, "fake_tensordict", None)) or type(env).__module__.startswith(
        "torchrl."
    ):
        raise ValueError(
            f"env_factory {config.env_factory!r} returns a TorchRL env "
            f"({type(env).__name__}), which a gymnasium actor (--kind env, the default) "
            f"cannot step: run it on a TorchRL-env actor, --kind torchrl "
            f'(LocalFleet(..., kind="torchrl"), RLFLEET_KIND=torchrl)'
        )


def _check_policies(custom: list[ModelSpec], spaces: tuple[Any, Any]) -> None:
    """Build each custom policy on the env's spaces; refuse one that reads other keys."""
    from tensordict.nn import TensorDictModuleBase

    from actor_service._kinds.env.models import unsupplied_keys
    from common.policies import make_policy

    for spec in custom:
        try:
            module = make_policy(spec.path, *spaces, **from_plain(spec.kwargs))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"model {spec.model_id!r}: {exc}") from exc
        except Exception as exc:  # the user's factory failed in its own way
            raise ValueError(
                f"model {spec.model_id!r}: policy factory {spec.factory!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        missing = unsupplied_keys(module) if isinstance(module, TensorDictModuleBase) else []
        if missing:
            raise ValueError(
                f"model {spec.model_id!r} ({spec.factory}) reads {missing}, which a gymnasium "
                "env actor does not provide (its steps hold 'observation' only): run it on a "
                "TorchRL-env actor, --kind torchrl, whose steps carry them"
            )
