"""The actors' side of each ported TorchRL script: its env and policy factories.

Each module here is what a port's ``LocalFleet(kind="torchrl", ...)`` names: ``make_env``
and ``make_policy`` build, on an actor, the env and the acting policy the script builds on
the learner, by calling the script's own helpers where it has them (``utils_cartpole``,
``utils_mujoco``, ``utils``: importable on the actors because the script's folder is on
their ``PYTHONPATH``) and by repeating the script's few lines where it builds them inline.
The acting policy must have the learner's structure (its ``state_dict`` keys), since the
learner's policy is pushed onto it. A script's hydra config travels as JSON
(:func:`plain_config` on the learner, :func:`config_of` on the actor).
"""

from __future__ import annotations

from typing import Any

__all__ = ["config_of", "plain_config"]


def plain_config(cfg: Any) -> dict[str, Any]:
    """A hydra ``DictConfig`` as plain JSON-able values (for ``env_kwargs``/``policy_kwargs``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def config_of(plain: dict[str, Any]) -> Any:
    """The ``DictConfig`` back from :func:`plain_config`'s values, as the script reads it."""
    from omegaconf import OmegaConf

    return OmegaConf.create(plain)
