"""``multiagent/sac.py`` on actors: VMAS, and the script's actor (continuous or discrete).

The script builds both inline, by ``env.continuous_actions``; these are its lines.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.vmas import actor_mlp, tanh_normal_actor, vmas_env


def make_env(cfg: Any, num_envs: int) -> Any:
    """``num_envs`` of the script's VMAS envs, with its action settings."""
    return vmas_env(
        cfg,
        num_envs,
        continuous_actions=cfg.env.continuous_actions,
        categorical_actions=cfg.env.categorical_actions,
    )


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's ``ProbabilisticActor``: ``TanhNormal``, or categorical for discrete actions."""
    if cfg.env.continuous_actions:
        return tanh_normal_actor(env, cfg)
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torch.distributions import Categorical, OneHotCategorical
    from torchrl.modules import ProbabilisticActor

    action = env.full_action_spec_unbatched["agents", "action"]
    return ProbabilisticActor(
        module=TensorDictModule(
            nn.Sequential(actor_mlp(env, cfg, action.space.n)),
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "logits")],
        ),
        spec=action,
        in_keys=[("agents", "logits")],
        out_keys=[env.action_key],
        distribution_class=Categorical if cfg.env.categorical_actions else OneHotCategorical,
        return_log_prob=True,
    )
