"""Multi-agent env and policy factories for the TorchRL-env actor tests.

The actors import them as ``rlfleet_test_agents:<name>`` (this directory is on their
path). VMAS's ``balance`` scenario stacks its agents under ``("agents", ...)`` as
TorchRL's multi-agent scripts see it; :func:`vmas_policy` is the policy of TorchRL's
``multiagent/mappo_ippo.py``: a ``MultiAgentMLP`` and a ``TanhNormal``.
"""

from __future__ import annotations

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
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
