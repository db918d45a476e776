"""``dqn/dqn_cartpole.py`` on actors: ``utils_cartpole``'s env, its Q-network and the epsilon."""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, "cpu")``, as its collector gets it."""
    from utils_cartpole import make_env as script_env

    return script_env(cfg.env.env_name, "cpu")


def make_policy(env: Any, cfg: Any) -> Any:
    """``TensorDictSequential(make_dqn_model(...), EGreedyModule(...))``, as in the script."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import EGreedyModule
    from utils_cartpole import make_dqn_model

    model = make_dqn_model(cfg.env.env_name, device="cpu")
    greedy = EGreedyModule(
        annealing_num_steps=cfg.collector.annealing_frames,
        eps_init=cfg.collector.eps_start,
        eps_end=cfg.collector.eps_end,
        spec=model.spec,
        device="cpu",
    )
    return TensorDictSequential(model, greedy)
