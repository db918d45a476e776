"""``iql/iql_online.py`` on actors: ``utils.env_maker`` under its transforms, and the actor."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """One env of the script's ``make_environment``: ``env_maker`` + ``apply_env_transforms``.

    The script batches ``env.train_num_envs`` of them in a ``ParallelEnv`` (one by default).
    """
    from utils import apply_env_transforms, env_maker

    return apply_env_transforms(env_maker(cfg))


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_iql_model(...)[0]``, the actor."""
    from utils import make_iql_model

    return make_iql_model(cfg, env, env, "cpu")[0]
