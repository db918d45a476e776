"""``crossq/crossq.py`` on actors: ``utils.env_maker`` under its transforms, and the actor.

The script hands its collector ``exploration_policy.eval()``: the actor's batch-norm layers
act on their running statistics, which travel with every push (they are buffers).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["make_env", "make_policy"]


def make_env(cfg: Any) -> Any:
    """The script's env layout for one env: ``make_environment``'s ``ParallelEnv`` of one.

    ``ParallelEnv(1, ..., serial_for_single=True)`` is a ``SerialEnv`` of one under the
    transforms, a batch of one env: the batch-norm actor needs that batch dimension (an
    actor steps a batched env as it is, as TorchRL's collector does).
    """
    from torchrl.envs import SerialEnv
    from utils import apply_env_transforms, env_maker

    batched = SerialEnv(1, functools.partial(env_maker, cfg))
    return apply_env_transforms(batched, max_episode_steps=cfg.env.max_episode_steps)


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_crossQ_agent``'s actor, in eval mode.

    ``make_crossQ_agent`` runs its nets once on the env's ``fake_tensordict()``, which its
    batch-norm layers need batched: ``env`` is a batch of one (:func:`make_env`).
    """
    from utils import make_crossQ_agent

    return make_crossQ_agent(cfg, env, "cpu")[1].eval()
