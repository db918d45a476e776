"""``multiagent/iql.py`` and ``multiagent/qmix_vdn.py`` on actors: VMAS, the exploring Q-net.

Both scripts build the same env (discrete actions) and the same collector policy inline,
``TensorDictSequential(qnet, EGreedyModule(...))``; these are their lines. The epsilon
the learner anneals is a buffer of that module, so it travels with every push.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.vmas import actor_mlp, vmas_env


def make_env(cfg: Any, num_envs: int) -> Any:
    """``num_envs`` of the script's VMAS envs, discrete actions."""
    return vmas_env(cfg, num_envs, continuous_actions=False)


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's ``qnet_explore``: a ``MultiAgentMLP`` Q-net, ``QValueModule``, e-greedy."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import EGreedyModule, QValueModule, SafeSequential

    net = actor_mlp(env, cfg, env.full_action_spec["agents", "action"].space.n)
    module = TensorDictModule(
        net, in_keys=[("agents", "observation")], out_keys=[("agents", "action_value")]
    )
    value_module = QValueModule(
        action_value_key=("agents", "action_value"),
        out_keys=[env.action_key, ("agents", "action_value"), ("agents", "chosen_action_value")],
        spec=env.full_action_spec_unbatched,
        action_space=None,
    )
    return TensorDictSequential(
        SafeSequential(module, value_module),
        EGreedyModule(
            eps_init=0.3,
            eps_end=0,
            annealing_num_steps=int(cfg.collector.total_frames * (1 / 2)),
            action_key=env.action_key,
            spec=env.full_action_spec_unbatched,
        ),
    )
