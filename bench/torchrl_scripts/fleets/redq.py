"""``redq/redq.py`` on actors: its collector's env and its exploration policy, as it builds them.

The script fits its ``ObservationNorm`` on a proof env of the learner and builds its
collector's envs with those statistics (``obs_norm_state_dict``); the port hands them to the
actors as env kwargs (``loc`` and ``scale``, read from the learner's env), so every actor
normalises as the learner's env does. The policy is ``make_redq_model``'s actor, wrapped as
the script wraps it in an ``OrnsteinUhlenbeckProcessModule`` (``exploration.ou_exploration``);
the trainer anneals that noise on the learner (``policy_exploration.step``), and its state
travels with each push (buffers). ``utils`` is the script's own: its folder is on the actors'
``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_env", "make_policy"]


def make_env(cfg: Any, loc: list[float], scale: list[float]) -> Any:
    """``transformed_env_constructor(cfg, obs_norm_state_dict=...)()``: one collector env."""
    import torch
    from utils import transformed_env_constructor

    norm = {"loc": torch.tensor(loc), "scale": torch.tensor(scale)}
    return transformed_env_constructor(cfg=cfg, obs_norm_state_dict=norm)()


def make_policy(env: Any, cfg: Any) -> Any:
    """``make_redq_model(env, cfg)[0]``, with the script's Ornstein-Uhlenbeck noise after it."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import OrnsteinUhlenbeckProcessModule
    from utils import make_redq_model

    if cfg.exploration.gSDE:  # the script sizes gSDE's noise from a learner-side rollout
        raise ValueError("exploration.gSDE is not ported: its env needs the learner's gSDE dims")
    actor = make_redq_model(env, cfg=cfg, device="cpu")[0]
    if not cfg.exploration.ou_exploration:
        return actor
    noise = OrnsteinUhlenbeckProcessModule(
        spec=actor.spec,
        annealing_num_steps=cfg.exploration.annealing_frames,
        sigma=cfg.exploration.ou_sigma,
        theta=cfg.exploration.ou_theta,
        device="cpu",
    )
    return TensorDictSequential(actor, noise)
