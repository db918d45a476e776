"""What ``rlfleet-actor --kind env`` checks before it binds a port.

A gymnasium actor's custom policies are built on one env's spaces, which must not read
more than a gymnasium step holds: a TensorDict policy that needs ``is_init``, recurrent
states or keys other than ``observation`` belongs on ``--kind torchrl``. The env is
built once here, then closed.
"""

from __future__ import annotations

from actor_service._config import ActorConfig

__all__ = ["check"]


def check(config: ActorConfig) -> None:
    """Raise ``ValueError`` if a custom policy of ``config`` reads what an env step lacks.

    Raises:
        ValueError: The reason, naming the env or the model and the offending keys.
    """
    custom = [spec for spec in config.models if ":" in spec.factory]
    if not custom:
        return  # the built-ins read observations only
    from tensordict.nn import TensorDictModuleBase

    from actor_service._core._settings import env_name
    from actor_service._kinds.env.models import unsupplied_keys
    from actor_service._kinds.env.pool import env_fn
    from common.policies import make_policy

    try:
        env = env_fn(config)()
    except Exception as exc:
        raise ValueError(
            f"env {env_name(config.env_pool)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    for spec in custom:
        try:
            module = make_policy(spec.factory, *spaces, **dict(spec.kwargs))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"model {spec.model_id!r}: {exc}") from exc
        missing = unsupplied_keys(module) if isinstance(module, TensorDictModuleBase) else []
        if missing:
            raise ValueError(
                f"model {spec.model_id!r} ({spec.factory}) reads {missing}, which a gymnasium "
                "env actor does not provide (its steps hold 'observation' only): run it on a "
                "TorchRL-env actor, --kind torchrl, whose steps carry them"
            )
