"""``rnd/rnd_mujoco.py`` on actors: ``utils_mujoco``'s env with an ``RNDTransform``, and actor.

The script builds the RND networks before the env, so that the env's transform and the
loss share them. An actor's env builds networks of the same shapes (its own random
values): the collector pushes the script's env's weights, the predictor as trained so far
and the frozen target, before every batch that follows a training step (``common.env_weights``).
"""

from __future__ import annotations

from typing import Any


def make_env(cfg: Any) -> Any:
    """The script's ``make_env(cfg.env.env_name, device, rnd_transform=rnd_transform)``."""
    from torchrl.envs.transforms import RNDTransform
    from utils_mujoco import make_env as script_env
    from utils_mujoco import make_rnd_networks

    proof_env = script_env(cfg.env.env_name, device="cpu")
    obs_dim = proof_env.observation_spec["observation"].shape[-1]
    proof_env.close()
    target_net, predictor_net = make_rnd_networks(
        obs_dim=obs_dim, embed_dim=cfg.rnd.embed_dim, device="cpu"
    )
    rnd_transform = RNDTransform(
        target_network=target_net,
        predictor_network=predictor_net,
        normalize_obs=False,
        reward_clip=cfg.rnd.reward_clip,
    )
    return script_env(cfg.env.env_name, "cpu", rnd_transform=rnd_transform)


def make_policy(env: Any, cfg: Any) -> Any:
    """The actor of the script's ``make_ppo_models``."""
    from utils_mujoco import make_ppo_models

    return make_ppo_models(cfg.env.env_name, device="cpu")[0]
