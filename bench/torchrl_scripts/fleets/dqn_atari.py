"""``dqn/dqn_atari.py`` on actors: ``utils_atari``'s env, its Q-network and the epsilon.

The script fixes ``frame_skip = 4`` in its body; these are its lines with that value. Its
env resizes frames with TorchRL's ``Resize`` (torchvision) and needs Atari's ROMs
(``ale-py``): it runs in the venv of ``make test-torchvision``.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.egreedy import e_greedy

#: The script's ``frame_skip``.
FRAME_SKIP = 4


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, frame_skip, device, gym_backend=...)``."""
    from utils_atari import make_env as script_env

    return script_env(cfg.env.env_name, FRAME_SKIP, "cpu", gym_backend=cfg.env.backend)


def make_policy(env: Any, cfg: Any) -> Any:
    """``TensorDictSequential(make_dqn_model(...), EGreedyModule(...))``, as in the script."""
    from utils_atari import make_dqn_model

    model = make_dqn_model(
        cfg.env.env_name, gym_backend=cfg.env.backend, frame_skip=FRAME_SKIP, device="cpu"
    )
    return e_greedy(model, cfg)
