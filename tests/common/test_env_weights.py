"""``common.env_weights``: an env's parameters held by name, and tied across envs."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from common.env_weights import (
    env_parameters,
    parameters_module,
    tie_parameters,
    trains_parameters,
)


class _Transform(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.target = nn.Sequential(nn.Linear(3, width)).requires_grad_(False)
        self.predictor = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, width))
        self.register_buffer("count", torch.zeros(()))


class _Env(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self._transform = nn.ModuleList([nn.Identity(), _Transform(width)])


def test_the_module_holds_the_same_parameters_under_the_same_names() -> None:
    env = _Env()
    named = env_parameters(env)
    held = parameters_module(named)
    assert list(held.state_dict()) == list(named)  # parameters only: no buffer
    for name, parameter in held.named_parameters():
        assert parameter is named[name]
    with torch.no_grad():  # a push copies into the held module: the env sees it
        held.state_dict()["_transform.1.predictor.0.bias"].fill_(3.0)
    assert torch.equal(env._transform[1].predictor[0].bias, torch.full((4,), 3.0))


def test_tied_envs_share_one_set_and_step_with_it() -> None:
    first, second = _Env(), _Env()
    named = env_parameters(first)
    tie_parameters(second, named)
    for name, parameter in env_parameters(second).items():
        assert parameter is named[name]
    x = torch.randn(2, 3)
    assert torch.equal(second._transform[1].predictor(x), first._transform[1].predictor(x))


def test_envs_of_other_networks_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=re.escape("as [8, 3] torch.float32 and as [4, 3]")):
        tie_parameters(_Env(width=8), env_parameters(_Env()))
    other = _Env()
    other._transform.append(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=re.escape("_transform.2.weight")):
        tie_parameters(other, env_parameters(_Env()))


def test_envs_whose_networks_differ_only_in_dtype_are_refused() -> None:
    doubled = _Env().double()
    with pytest.raises(
        ValueError, match=re.escape("as [4, 3] torch.float64 and as [4, 3] torch.float32")
    ):
        tie_parameters(doubled, env_parameters(_Env()))
    assert all(p.dtype == torch.float64 for p in doubled.parameters())  # nothing tied


def test_only_trainable_parameters_make_weights_the_learner_trains() -> None:
    env = _Env()
    assert trains_parameters(env)
    env.requires_grad_(False)
    assert not trains_parameters(env)
    assert not trains_parameters(nn.Identity())
