"""``multiagent/maddpg_iddpg.py`` on actors: VMAS, and the deterministic policy with noise.

The script builds both inline; these are its lines. The noise scale the learner anneals is
a buffer of ``AdditiveGaussianModule``, so it travels with every push.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.vmas import actor_mlp, vmas_env


def make_env(cfg: Any, num_envs: int) -> Any:
    """``num_envs`` of the script's VMAS envs, continuous actions."""
    return vmas_env(cfg, num_envs, continuous_actions=True)


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's ``policy_explore``: a ``TanhDelta`` actor and ``AdditiveGaussianModule``."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import AdditiveGaussianModule, ProbabilisticActor
    from torchrl.modules.distributions import TanhDelta

    action = env.full_action_spec_unbatched[("agents", "action")]
    actor_net = actor_mlp(env, cfg, env.full_action_spec_unbatched[env.action_key].shape[-1])
    policy = ProbabilisticActor(
        module=TensorDictModule(
            actor_net, in_keys=[("agents", "observation")], out_keys=[("agents", "param")]
        ),
        spec=env.full_action_spec_unbatched,
        in_keys=[("agents", "param")],
        out_keys=[env.action_key],
        distribution_class=TanhDelta,
        distribution_kwargs={"low": action.space.low, "high": action.space.high},
        return_log_prob=False,
    )
    return TensorDictSequential(
        policy,
        AdditiveGaussianModule(
            spec=env.full_action_spec_unbatched,
            annealing_num_steps=int(cfg.collector.total_frames * (1 / 2)),
            action_key=env.action_key,
            device="cpu",
        ),
    )
