"""Multi-agent env and policy factories for the TorchRL-env actor tests.

The actors import them as ``rlfleet_test_agents:<name>`` (this directory is on their
path). VMAS's ``balance`` scenario stacks its agents under ``("agents", ...)`` as
TorchRL's multi-agent scripts see it; :func:`vmas_policy` is the policy of TorchRL's
``multiagent/mappo_ippo.py``: a ``MultiAgentMLP`` and a ``TanhNormal``.
"""

from __future__ import annotations

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs import EnvBase, RewardSum, TransformedEnv, VmasEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal

AGENTS = 3


def vmas_balance(num_envs: int = 4, steps: int = 5) -> EnvBase:
    """VMAS's ``balance`` (batched itself: ``num_envs``), episodes of ``steps`` steps."""
    env = VmasEnv(
        "balance",
        num_envs=num_envs,
        n_agents=AGENTS,
        continuous_actions=True,
        max_steps=steps,
    )
    reward = RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
    return TransformedEnv(env, reward)


def vmas_policy(env: EnvBase, seed: int = 0) -> ProbabilisticActor:
    """MAPPO's actor: a ``MultiAgentMLP`` per agent (shared weights), a ``TanhNormal``."""
    observations = env.observation_spec["agents", "observation"].shape[-1]
    actions = env.full_action_spec["agents", "action"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = MultiAgentMLP(
            n_agent_inputs=observations,
            n_agent_outputs=2 * actions.shape[-1],
            n_agents=AGENTS,
            centralized=False,
            share_params=True,
            depth=1,
            num_cells=16,
            activation_class=nn.Tanh,
        )
    module = TensorDictModule(
        nn.Sequential(net, NormalParamExtractor()),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "loc"), ("agents", "scale")],
    )
    return ProbabilisticActor(
        module,
        spec=actions,
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[("agents", "action")],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": actions.space.low, "high": actions.space.high},
        return_log_prob=True,
    )


def vmas_tag(num_envs: int = 4, steps: int = 5, one_group: bool = False) -> EnvBase:
    """VMAS's ``simple_tag``: 3 adversaries (16 observations) chase 1 agent (14).

    VMAS groups agents by name (``adversary``, ``agent``): each group dense, its own shape,
    as TorchRL's heterogeneous-agent scripts have them. ``one_group`` puts all four in one
    group, which TorchRL can only stack lazily.
    """
    from torchrl.envs.utils import MarlGroupMapType

    group_map = MarlGroupMapType.ALL_IN_ONE_GROUP if one_group else None
    env = VmasEnv(
        "simple_tag",
        num_envs=num_envs,
        continuous_actions=True,
        max_steps=steps,
        group_map=group_map,
    )
    out_keys = [(group, "episode_reward") for group in env.group_map]
    return TransformedEnv(env, RewardSum(in_keys=env.reward_keys, out_keys=out_keys))


def vmas_tag_one_group() -> EnvBase:
    """:func:`vmas_tag` with every agent in one group (a lazy stack of two shapes)."""
    return vmas_tag(one_group=True)


def vmas_groups_policy(env: EnvBase, seed: int = 0) -> TensorDictSequential:
    """One deterministic ``MultiAgentMLP`` actor per group, each on its group's shapes."""
    actors = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for group, agents in env.group_map.items():
            net = MultiAgentMLP(
                n_agent_inputs=env.observation_spec[group, "observation"].shape[-1],
                n_agent_outputs=env.full_action_spec[group, "action"].shape[-1],
                n_agents=len(agents),
                centralized=False,
                share_params=True,
                depth=1,
                num_cells=16,
            )
            module = nn.Sequential(net, nn.Tanh())
            actors.append(
                TensorDictModule(
                    module, in_keys=[(group, "observation")], out_keys=[(group, "action")]
                )
            )
    return TensorDictSequential(*actors)
