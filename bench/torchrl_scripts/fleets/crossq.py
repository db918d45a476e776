"""``crossq/crossq.py`` on actors: ``utils.env_maker`` under its transforms, and the actor.

The script hands its collector ``exploration_policy.eval()``: the actor's batch-norm layers
act on their running statistics, which travel with every push (they are buffers).
"""

from __future__ import annotations

import functools
from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_crossQ_agent``'s actor, in eval mode.

    ``make_crossQ_agent`` runs its nets once on the env's ``fake_tensordict()``, which its
    batch-norm layers need batched: it gets a batch of one env, as the script's
    ``ParallelEnv`` of ``env_per_collector`` envs is.
    """
    from torchrl.envs import SerialEnv
    from utils import make_crossQ_agent

    batched = SerialEnv(1, functools.partial(make_env, cfg))
    try:
        return make_crossQ_agent(cfg, batched, "cpu")[1].eval()
    finally:
        batched.close(raise_if_closed=False)  # never started if only its specs were read
