"""The VMAS env and the actor network of TorchRL's ``multiagent/`` scripts, as each builds them.

Every script of that folder builds ``TransformedEnv(VmasEnv(...), RewardSum(...))`` inline,
differing only in the kind of actions; on an actor it has the actor's share of the VMAS envs
(a ``VmasEnv`` is batched itself: it is the actor's pool as it is). Each builds its acting
network as the same decentralised ``MultiAgentMLP``, differing only in its outputs, and the
continuous ones the same ``TanhNormal`` actor around it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["actor_mlp", "tanh_normal_actor", "vmas_env"]


def vmas_env(cfg: Any, num_envs: int, *, continuous_actions: bool, **vmas: Any) -> Any:
    """The script's env of ``num_envs`` VMAS envs under ``RewardSum`` (config ``cfg``).

    ``vmas`` adds ``VmasEnv`` arguments a script passes beyond the common ones
    (``multiagent/sac.py``: ``categorical_actions``).
    """
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.envs.libs.vmas import VmasEnv

    env = VmasEnv(
        scenario=cfg.env.scenario_name,
        num_envs=num_envs,
        continuous_actions=continuous_actions,
        max_steps=cfg.env.max_steps,
        device="cpu",
        seed=cfg.seed,
        **vmas,
        **cfg.env.scenario,
    )
    return TransformedEnv(
        env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
    )


def actor_mlp(env: Any, cfg: Any, n_agent_outputs: int) -> Any:
    """The scripts' acting ``MultiAgentMLP``: per agent, 2 layers of 256, tanh, on the CPU."""
    from torch import nn
    from torchrl.modules import MultiAgentMLP

    return MultiAgentMLP(
        n_agent_inputs=env.observation_spec["agents", "observation"].shape[-1],
        n_agent_outputs=n_agent_outputs,
        n_agents=env.n_agents,
        centralised=False,
        share_params=cfg.model.shared_parameters,
        device="cpu",
        depth=2,
        num_cells=256,
        activation_class=nn.Tanh,
    )


def tanh_normal_actor(env: Any, cfg: Any) -> Any:
    """The scripts' continuous ``ProbabilisticActor``: ``TanhNormal`` over :func:`actor_mlp`."""
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torch import nn
    from torchrl.modules import ProbabilisticActor, TanhNormal

    action = env.full_action_spec_unbatched[("agents", "action")]
    return ProbabilisticActor(
        module=TensorDictModule(
            nn.Sequential(actor_mlp(env, cfg, 2 * action.shape[-1]), NormalParamExtractor()),
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "loc"), ("agents", "scale")],
        ),
        spec=env.full_action_spec_unbatched,
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[env.action_key],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action.space.low, "high": action.space.high},
        return_log_prob=True,
    )
