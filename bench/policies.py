"""User-style policy factories for the benchmarks (``--policy bench.policies:<function>``).

These are what a new user writes, not the built-in ``"mlp"``: a ``TensorDictModule``
around an ``nn.Sequential``, given to the actor by factory. TorchRL's collectors run
the very same module in the same run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict.nn import TensorDictModule
from torch import nn

__all__ = ["pixel_policy", "sequential_policy"]


def sequential_policy(
    observation_space: Any, action_space: Any, hidden: Sequence[int] = (64, 64)
) -> TensorDictModule:
    """``observation -> action``: an MLP (tanh) whose scores pick a Discrete action (one-hot).

    The network's last layer writes one score per action; the actor (and TorchRL's
    GymEnv) read a ``[B, n]`` action as one-hot and step with its argmax.
    """
    width = int(np.prod(observation_space.shape))
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [nn.Linear(width, int(size)), nn.Tanh()]
        width = int(size)
    layers.append(nn.Linear(width, int(action_space.n)))
    return TensorDictModule(nn.Sequential(*layers), in_keys=["observation"], out_keys=["action"])


class _Scale(nn.Module):
    """uint8 pixels to floats in [0, 1]."""

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels.float().div(255.0)


def pixel_policy(
    observation_space: Any, action_space: Any, hidden: Sequence[int] = (16,)
) -> TensorDictModule:
    """``observation -> action`` on uint8 frame stacks: scale, flatten, an MLP (tanh), scores."""
    width = int(np.prod(observation_space.shape))
    layers: list[nn.Module] = [_Scale(), nn.Flatten(-len(observation_space.shape))]
    for size in hidden:
        layers += [nn.Linear(width, int(size)), nn.Tanh()]
        width = int(size)
    layers.append(nn.Linear(width, int(action_space.n)))
    return TensorDictModule(nn.Sequential(*layers), in_keys=["observation"], out_keys=["action"])


def nature_cnn_policy(observation_space: Any, action_space: Any) -> TensorDictModule:
    """``observation -> action`` on ``(4, 84, 84)`` uint8 frame stacks: the Nature DQN network.

    Three convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1), a 512-unit layer and one
    score per action, as a user writes it (a ``TensorDictModule``).
    """
    channels = int(observation_space.shape[0])
    network = nn.Sequential(
        _Scale(),
        nn.Conv2d(channels, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(-3),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
        nn.Linear(512, int(action_space.n)),
    )
    return TensorDictModule(network, in_keys=["observation"], out_keys=["action"])
