"""Policy factories for the collection-core tests (``"rlfleet_test_policies:<function>"``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from tensordict.nn import TensorDictModule
from torch import nn


class _Linear(nn.Module):
    """Observation → action index: a plain module without TensorDict."""

    def __init__(self, obs_dim: int, n: int) -> None:
        super().__init__()
        self.net = nn.Linear(obs_dim, n)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


def plain_index_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A plain ``nn.Module`` returning Discrete action indices."""
    return _Linear(int(np.prod(observation_space.shape)), int(action_space.n))


def plain_one_hot_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A plain ``nn.Module`` returning float one-hot Discrete actions."""
    module = _Linear(int(np.prod(observation_space.shape)), int(action_space.n))
    n = int(action_space.n)
    return nn.Sequential(module, _OneHot(n))


class _OneHot(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(index, self.n).float()


class _ValueAndIndex(nn.Module):
    def __init__(self, obs_dim: int, n: int) -> None:
        super().__init__()
        self.net = nn.Linear(obs_dim, n)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.net(observation)
        return scores.argmax(-1), scores.max(-1).values


def td_policy_with_extras(observation_space: Any, action_space: Any) -> nn.Module:
    """A TensorDictModule writing an index ``"action"`` and an extra ``"score"``."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action", "score"])


def td_policy_writing_reward(observation_space: Any, action_space: Any) -> nn.Module:
    """A TensorDictModule that writes a key the rollout owns (refused at start)."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action", "reward"])


def not_a_module(observation_space: Any, action_space: Any) -> object:
    """A factory returning something that is not an nn.Module."""
    return object()


class _Versioned(nn.Module):
    """Two scalar weights that every push sets equal; reads them with a pause in between."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch = observation.shape[0]
        a = self.a.detach().clone()
        time.sleep(0.0002)  # a swap landing mid-step would show as a != b
        b = self.b.detach().clone()
        action = torch.zeros(batch, dtype=torch.int64)
        return action, a.expand(batch).clone(), b.expand(batch).clone()


def versioned_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """Writes the weights it acted with as extras ``"weight_a"`` and ``"weight_b"``."""
    return TensorDictModule(
        _Versioned(), in_keys=["observation"], out_keys=["action", "weight_a", "weight_b"]
    )


def wrong_input_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A plain module built for 7-dim observations (CartPole has 4)."""
    return _Linear(7, int(action_space.n))


def bias_policy(observation_space: Any, action_space: Any, bias: float = 0.0) -> nn.Module:
    """A user-style TensorDictModule acting ``bias`` everywhere (zero weights, as TorchRL's
    distinct-policy-factory tests build theirs); its weights are ``module.weight/bias``."""
    module = nn.Linear(int(np.prod(observation_space.shape)), int(np.prod(action_space.shape)))
    with torch.no_grad():
        module.weight.zero_()
        module.bias.fill_(float(bias))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])
