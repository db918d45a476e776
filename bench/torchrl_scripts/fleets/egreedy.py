"""The epsilon-greedy collector policy of TorchRL's DQN scripts, as each builds it.

``dqn/dqn_cartpole.py`` and ``dqn/dqn_atari.py`` both hand their collector
``TensorDictSequential(model, EGreedyModule(...))`` with epsilon annealed over
``collector.annealing_frames`` from ``eps_start`` to ``eps_end``; they differ in the model.
"""

from __future__ import annotations

from typing import Any

__all__ = ["e_greedy"]


def e_greedy(model: Any, cfg: Any) -> Any:
    """``TensorDictSequential(model, EGreedyModule(...))`` with the script's epsilon schedule."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import EGreedyModule

    greedy = EGreedyModule(
        annealing_num_steps=cfg.collector.annealing_frames,
        eps_init=cfg.collector.eps_start,
        eps_end=cfg.collector.eps_end,
        spec=model.spec,
        device="cpu",
    )
    return TensorDictSequential(model, greedy)
