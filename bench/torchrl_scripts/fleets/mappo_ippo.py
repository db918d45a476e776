"""``multiagent/mappo_ippo.py`` on actors: its VMAS env and its policy, as the script builds them.

The script builds both inline; these are its lines, with the actor's share of the VMAS
envs (a ``VmasEnv`` is batched itself: it is the actor's pool as it is).
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets import config_of


def make_env(cfg: dict[str, Any], num_envs: int) -> Any:
    """``TransformedEnv(VmasEnv(...), RewardSum(...))`` of ``num_envs`` envs."""
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.envs.libs.vmas import VmasEnv

    c = config_of(cfg)
    env = VmasEnv(
        scenario=c.env.scenario_name,
        num_envs=num_envs,
        continuous_actions=True,
        max_steps=c.env.max_steps,
        device="cpu",
        seed=c.seed,
        **c.env.scenario,
    )
    return TransformedEnv(
        env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
    )


def make_policy(env: Any, cfg: dict[str, Any]) -> Any:
    """The script's ``ProbabilisticActor`` over a ``MultiAgentMLP``."""
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal

    c = config_of(cfg)
    actor_net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=env.observation_spec["agents", "observation"].shape[-1],
            n_agent_outputs=2 * env.full_action_spec_unbatched[env.action_key].shape[-1],
            n_agents=env.n_agents,
            centralised=False,
            share_params=c.model.shared_parameters,
            device="cpu",
            depth=2,
            num_cells=256,
            activation_class=nn.Tanh,
        ),
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
