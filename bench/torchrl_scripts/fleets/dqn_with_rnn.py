"""``tutorials/sphinx-tutorials/dqn_with_rnn.py`` on actors: its pixel env, LSTM and epsilon.

The tutorial builds both at module level; these are its lines. Its ``ObservationNorm``
statistics come from the learner (``init_stats`` on the tutorial's env) as ``loc`` and
``scale``; the env carries the LSTM's ``TensorDictPrimer``, as the tutorial appends it.
"""

from __future__ import annotations

from typing import Any

EMBED = 64  # the ConvNet's output size on 84x84 frames (the tutorial measures it)


def _lstm() -> Any:
    from torchrl.modules import LSTMModule

    return LSTMModule(input_size=EMBED, hidden_size=128, in_key="embed", out_key="embed")


def make_env(loc: list[Any], scale: list[Any]) -> Any:
    """The tutorial's ``TransformedEnv(GymEnv("CartPole-v1", from_pixels=True), ...)``."""
    import torch
    from torchrl.envs import (
        Compose,
        GrayScale,
        InitTracker,
        ObservationNorm,
        Resize,
        RewardScaling,
        StepCounter,
        ToTensorImage,
        TransformedEnv,
    )
    from torchrl.envs.libs.gym import GymEnv

    norm = ObservationNorm(
        standard_normal=True,
        in_keys=["pixels"],
        loc=torch.tensor(loc),
        scale=torch.tensor(scale),
    )
    env = TransformedEnv(
        GymEnv("CartPole-v1", from_pixels=True, device="cpu"),
        Compose(
            ToTensorImage(),
            GrayScale(),
            Resize(84, 84),
            StepCounter(),
            InitTracker(),
            RewardScaling(loc=0.0, scale=0.1),
            norm,
        ),
    )
    env.append_transform(_lstm().make_tensordict_primer())
    return env


def make_policy(env: Any) -> Any:
    """``TensorDictSequential(Seq(feature, lstm, mlp, qval), EGreedyModule(...))``."""
    from tensordict.nn import TensorDictModule as Mod
    from tensordict.nn import TensorDictSequential as Seq
    from torch import nn
    from torchrl.modules import MLP, ConvNet, EGreedyModule, QValueModule

    feature = Mod(
        ConvNet(
            num_cells=[32, 32, 64],
            squeeze_output=True,
            aggregator_class=nn.AdaptiveAvgPool2d,
            aggregator_kwargs={"output_size": (1, 1)},
        ),
        in_keys=["pixels"],
        out_keys=["embed"],
    )
    mlp = Mod(MLP(out_features=2, num_cells=[64]), in_keys=["embed"], out_keys=["action_value"])
    qval = QValueModule(action_space=None, spec=env.action_spec)
    policy = Seq(feature, _lstm(), mlp, qval)
    policy(env.reset())  # initialises the lazy layers, as the tutorial does
    exploration = EGreedyModule(annealing_num_steps=1_000_000, spec=env.action_spec, eps_init=0.2)
    return Seq(policy, exploration)
