"""``dqn/dqn_cartpole.py`` on actors: ``utils_cartpole``'s env, its Q-network and the epsilon."""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets import config_of


def make_env(cfg: dict[str, Any]) -> Any:
    """The script's ``make_env(cfg.env.env_name, "cpu")``, as its collector gets it."""
    from utils_cartpole import make_env as script_env

    return script_env(config_of(cfg).env.env_name, "cpu")


def make_policy(env: Any, cfg: dict[str, Any]) -> Any:
    """``TensorDictSequential(make_dqn_model(...), EGreedyModule(...))``, as in the script."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import EGreedyModule
    from utils_cartpole import make_dqn_model

    c = config_of(cfg)
    model = make_dqn_model(c.env.env_name, device="cpu")
    greedy = EGreedyModule(
        annealing_num_steps=c.collector.annealing_frames,
        eps_init=c.collector.eps_start,
        eps_end=c.collector.eps_end,
        spec=model.spec,
        device="cpu",
    )
    return TensorDictSequential(model, greedy)
