"""What ``rlfleet-actor --kind env`` checks before it binds a port.

An env id must be registered with gymnasium; an env factory must return one gymnasium env
(a TorchRL env names ``--kind torchrl``, a vector env ``num_envs``):
:func:`~actor_service._kinds.env.factory.one_env` holds that rule, and the env pool builds its
envs through it, so ``create_server`` refuses the same.
A gymnasium actor's custom policies are built on one env's spaces, which must not read
more than a gymnasium step holds: a TensorDict policy that needs ``is_init``, recurrent
states or keys other than ``observation`` belongs on ``--kind torchrl``. The env is
built once here, then closed (a ``close()`` that hangs or raises is logged and left).
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium.envs.registration import parse_env_id

from actor_service._config import ActorConfig, ModelSpec
from actor_service._kinds.env.factory import NotOneEnvError
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
    from actor_service._kinds.env.pool import close_throwaway, env_fn

    try:
        env = env_fn(config)()
    except NotOneEnvError:
        raise
    except Exception as exc:
        raise ValueError(
            f"env {env_name(config.env_pool)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    try:
        spaces = env.observation_space, env.action_space
    finally:
        close_throwaway(env, env_name(config.env_pool))
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
