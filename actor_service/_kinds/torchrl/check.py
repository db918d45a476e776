"""What ``rlfleet-actor --kind torchrl`` checks before it binds a port.

One env is built from the factory (or ``GymEnv``) and every model is built on it and
stepped once (:func:`~actor_service._kinds.torchrl.pool.check_torchrl_config`), so a
factory or policy that would fail at start is a usage error instead.
"""

from __future__ import annotations

from actor_service._config import ActorConfig

__all__ = ["check"]


def check(config: ActorConfig) -> None:
    """Raise ``ValueError`` if the env or a model of ``config`` would fail at start.

    Raises:
        ValueError: The reason, naming the env factory and the model.
    """
    from actor_service._kinds.torchrl.pool import check_torchrl_config

    check_torchrl_config(config)
