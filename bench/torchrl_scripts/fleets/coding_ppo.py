"""``tutorials/sphinx-tutorials/coding_ppo.py`` on actors: its env and policy, as it builds them.

The tutorial builds both at module level; these are its lines. Its ``ObservationNorm``
statistics come from the learner (the tutorial's ``init_stats`` on its own env), as
``loc`` and ``scale`` in the actors' env kwargs, so every actor normalises as the
learner's env does.
"""

from __future__ import annotations

from typing import Any

NUM_CELLS = 256  # the tutorial's num_cells


def make_env(loc: list[float], scale: list[float]) -> Any:
    """``TransformedEnv(GymEnv("InvertedDoublePendulum-v4"), Compose(ObservationNorm, ...))``."""
    import torch
    from torchrl.envs import Compose, DoubleToFloat, ObservationNorm, StepCounter, TransformedEnv
    from torchrl.envs.libs.gym import GymEnv

    norm = ObservationNorm(
        in_keys=["observation"],
        loc=torch.tensor(loc, dtype=torch.float64),
        scale=torch.tensor(scale, dtype=torch.float64),
    )
    base = GymEnv("InvertedDoublePendulum-v4", device="cpu")
    return TransformedEnv(base, Compose(norm, DoubleToFloat(), StepCounter()))


def make_policy(env: Any) -> Any:
    """The tutorial's ``ProbabilisticActor`` (``TanhNormal``) over lazy linear layers."""
    from tensordict.nn import TensorDictModule
    from tensordict.nn.distributions import NormalParamExtractor
    from torch import nn
    from torchrl.modules import ProbabilisticActor, TanhNormal

    actor_net = nn.Sequential(
        nn.LazyLinear(NUM_CELLS),
        nn.Tanh(),
        nn.LazyLinear(NUM_CELLS),
        nn.Tanh(),
        nn.LazyLinear(NUM_CELLS),
        nn.Tanh(),
        nn.LazyLinear(2 * env.action_spec.shape[-1]),
        NormalParamExtractor(),
    )
    policy_module = TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"])
    policy = ProbabilisticActor(
        module=policy_module,
        spec=env.action_spec,
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={
            "low": env.action_spec_unbatched.space.low,
            "high": env.action_spec_unbatched.space.high,
        },
        return_log_prob=True,
    )
    policy(env.reset())  # initialises the lazy layers, as the tutorial's dummy forward does
    return policy
