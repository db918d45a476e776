"""``dreamer_v3/dreamer_v3.py`` on actors: its exploration env and its recurrent real-env actor.

The script builds both in ``main``; these are its lines, calling its own module-level
builders (``make_env``, ``build_world_model``, ``build_actor``, ``build_real_actor``; the
script's folder is on the actors' ``PYTHONPATH``). The actor is the world model's encoder,
posterior and prior around the policy head; every push carries all four (the learner's
``real_actor`` shares them with the world model it trains).
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_env", "make_policy"]


def make_env(cfg: Any) -> Any:
    """``explore_env``: the script's env seeded ``env.seed + 2``, with the RSSM's primer."""
    from dreamer_v3 import make_env as script_env
    from torchrl.data import Unbounded
    from torchrl.envs import TensorDictPrimer, TransformedEnv

    state_dim = cfg.networks.num_categoricals * cfg.networks.num_classes
    return TransformedEnv(
        script_env(cfg, cfg.env.seed + 2),
        TensorDictPrimer(
            random=False,
            default_value=0,
            state=Unbounded(state_dim),
            belief=Unbounded(cfg.networks.rnn_hidden_dim),
        ),
    )


def make_policy(env: Any, cfg: Any) -> Any:
    """``real_actor``: ``build_real_actor`` over a fresh world model and actor of ``cfg``."""
    from dreamer_v3 import build_actor, build_real_actor, build_world_model

    obs_dim = env.observation_spec["observation"].shape[-1]
    action_dim = env.action_spec.shape[-1]
    _, encoder, prior, posterior, *_ = build_world_model(
        cfg=cfg, obs_dim=obs_dim, action_dim=action_dim
    )
    return build_real_actor(
        observation_encoder=encoder,
        posterior_net=posterior,
        prior_net=prior,
        actor_model=build_actor(cfg=cfg, action_dim=action_dim),
    )
