"""``multiagent/mappo_ippo.py`` on actors: its VMAS env and its policy, as the script builds them.

The script builds both inline; these are its lines (the env: :func:`vmas_env`).
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.vmas import actor_mlp, vmas_env


def make_env(cfg: Any, num_envs: int) -> Any:
    """``num_envs`` of the script's VMAS envs, continuous actions."""
    return vmas_env(cfg, num_envs, continuous_actions=True)


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's ``ProbabilisticActor`` over a ``MultiAgentMLP``."""
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import ProbabilisticActor, TanhNormal

    actor_net = nn.Sequential(
        actor_mlp(env, cfg, 2 * env.full_action_spec_unbatched[env.action_key].shape[-1]),
        NormalParamExtractor(),
    )
    policy_module = TensorDictModule(
        actor_net,
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "loc"), ("agents", "scale")],
    )
    action = env.full_action_spec_unbatched[("agents", "action")]
    return ProbabilisticActor(
        module=policy_module,
        spec=env.full_action_spec_unbatched,
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[env.action_key],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action.space.low, "high": action.space.high},
        return_log_prob=True,
    )
