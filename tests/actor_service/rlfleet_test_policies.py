"""Policy factories for the collection-core tests (``"rlfleet_test_policies:<function>"``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
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


def lazy_index_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A plain module whose first layer is lazy (``nn.LazyLinear``: sized by its first input)."""
    net = nn.Sequential(nn.LazyLinear(8), nn.Tanh(), nn.Linear(8, int(action_space.n)))
    return nn.Sequential(net, _ArgMax())


class _ArgMax(nn.Module):
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.argmax(-1)


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


def td_policy_with_extras(
    observation_space: Any, action_space: Any, general: bool = False
) -> nn.Module:
    """A TensorDictModule writing an index ``"action"`` and an extra ``"score"``."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    td_module = TensorDictModule(module, in_keys=["observation"], out_keys=["action", "score"])
    return _maybe_general(td_module, general)


def td_policy_writing_reward(
    observation_space: Any, action_space: Any, key: str = "reward"
) -> nn.Module:
    """A TensorDictModule that writes ``key``, one the rollout owns (refused at start)."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action", key])


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


# User-style TensorDict policies, each built the way a user writes one. ``general=True``
# registers a no-op forward hook on the outermost module, which keeps the actor on the
# TensorDict path, so a test can compare both paths for one policy and one seed.


def _mlp(obs_dim: int, out: int, hidden: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, out))


def _maybe_general(module: nn.Module, general: bool) -> nn.Module:
    if general:
        module.register_forward_hook(lambda _module, _args, _out: None)
    return module


def user_sequential(observation_space: Any, action_space: Any, general: bool = False) -> nn.Module:
    """``TensorDictModule(nn.Sequential(...), ["observation"], ["action"])``: one-hot scores."""
    net = _mlp(int(np.prod(observation_space.shape)), int(action_space.n))
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    return _maybe_general(module, general)


class _SampleWithLogProb(nn.Module):
    """Samples an index from softmax(logits) with torch's RNG; returns it and its log-prob."""

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
        return index, logits.log_softmax(-1).gather(-1, index[:, None]).squeeze(-1)


def user_chain(observation_space: Any, action_space: Any, general: bool = False) -> nn.Module:
    """A ``TensorDictSequential``: logits (kept), then a sampled action, its log-prob, a value
    under a nested key and an ignored ``"_"`` output."""
    obs_dim, n = int(np.prod(observation_space.shape)), int(action_space.n)
    module = TensorDictSequential(
        TensorDictModule(_mlp(obs_dim, n), in_keys=["observation"], out_keys=["logits"]),
        TensorDictModule(
            _SampleWithLogProb(), in_keys=["logits"], out_keys=["action", "sample_log_prob"]
        ),
        TensorDictModule(
            _ValueAndIndex(obs_dim, n), in_keys=["observation"], out_keys=["_", ("critic", "v")]
        ),
    )
    return _maybe_general(module, general)


def user_dict_output(observation_space: Any, action_space: Any, general: bool = False) -> nn.Module:
    """A module returning a dict of its outputs, read by ``out_keys`` as tensordict does."""
    module = TensorDictModule(
        _DictOut(int(np.prod(observation_space.shape)), int(action_space.n)),
        in_keys=["observation"],
        out_keys=["action", "noise"],
    )
    return _maybe_general(module, general)


class _DictOut(nn.Module):
    def __init__(self, obs_dim: int, n: int) -> None:
        super().__init__()
        self.net = _mlp(obs_dim, n)

    def forward(self, observation: torch.Tensor) -> dict[str, torch.Tensor]:
        noise = torch.randn(observation.shape[0])
        return {"noise": noise, "action": self.net(observation) + noise[:, None]}


def user_probabilistic_actor(
    observation_space: Any, action_space: Any, general: bool = False
) -> nn.Module:
    """TorchRL's ProbabilisticActor shape (logits, then a distribution module) from tensordict."""
    net = _mlp(int(np.prod(observation_space.shape)), int(action_space.n))
    module = ProbabilisticTensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"],
            out_keys=["action"],
            distribution_class=torch.distributions.OneHotCategorical,
            return_log_prob=True,
        ),
    )
    return _maybe_general(module, general)


def torchrl_probabilistic_actor(
    observation_space: Any, action_space: Any, general: bool = False
) -> nn.Module:
    """TorchRL's own ``ProbabilisticActor`` over a ``TensorDictModule``, as its PPO tutorial."""
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    net = _mlp(int(np.prod(observation_space.shape)), int(action_space.n))
    module = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    return _maybe_general(module, general)


class _Doubling(TensorDictModule):
    """A TensorDictModule subclass with its own forward: only the TensorDict path runs it."""

    def forward(self, tensordict: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(tensordict, *args, **kwargs)
        out.set("doubled", out.get("action") * 2)
        return out


def user_overridden_forward(observation_space: Any, action_space: Any) -> nn.Module:
    """A policy whose forward override writes ``"doubled"`` (not in its out_keys)."""
    net = _mlp(int(np.prod(observation_space.shape)), int(action_space.n))
    return _Doubling(net, in_keys=["observation"], out_keys=["action"])


class _Counting(nn.Module):
    """Outputs how often it was called: two calls from one RNG state never agree."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        batch = observation.shape[0]
        return torch.zeros(batch, dtype=torch.int64), torch.full((batch,), float(self.calls))


def counting_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A stateful TensorDictModule: its two paths differ on the probe, so it keeps TensorDicts."""
    return TensorDictModule(_Counting(), in_keys=["observation"], out_keys=["action", "calls"])


def bias_policy(observation_space: Any, action_space: Any, bias: float = 0.0) -> nn.Module:
    """A user-style TensorDictModule acting ``bias`` everywhere (zero weights, as TorchRL's
    distinct-policy-factory tests build theirs); its weights are ``module.weight/bias``."""
    module = nn.Linear(int(np.prod(observation_space.shape)), int(np.prod(action_space.shape)))
    with torch.no_grad():
        module.weight.zero_()
        module.bias.fill_(float(bias))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


class _ReusedOutput(nn.Module):
    """Writes every call's outputs into the same tensors (as a CUDA-graph replay does)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.calls = 0
        self.action: torch.Tensor | None = None
        self.step: torch.Tensor | None = None

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = observation.shape[0]
        if self.action is None or self.action.shape[0] != batch:
            self.action = torch.zeros(batch, dtype=torch.int64)
            self.step = torch.zeros(batch)
        assert self.step is not None
        self.calls += 1
        self.action.fill_(self.calls % self.n)
        self.step.fill_(float(self.calls))
        return self.action, self.step


def reused_output_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """Returns the same two tensors at every call, overwritten in place."""
    module = _ReusedOutput(int(action_space.n))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action", "step"])


class _FailsOnCall(nn.Module):
    """Acts 0; raises on the ``fail_in``-th call from when a test sets it (never by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_in = 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.fail_in:
            self.fail_in -= 1
            if not self.fail_in:
                raise RuntimeError("the policy failed mid-batch")
        return torch.zeros(observation.shape[0], dtype=torch.int64)


def failing_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A TensorDictModule whose module's ``fail_in`` a test sets to make a later call raise."""
    return TensorDictModule(_FailsOnCall(), in_keys=["observation"], out_keys=["action"])


class _ScalarExtra(nn.Module):
    """Has its own ``act_compact`` (acts 0) whose extra ``"loss"`` is 0-dim: no row per env."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[0], dtype=torch.int64)

    def act_compact(self, observation: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        return self(observation), {"loss": torch.zeros(self.shape)}


def scalar_extra_policy(
    observation_space: Any, action_space: Any, shape: tuple[int, ...] = ()
) -> nn.Module:
    """A module with ``act_compact`` whose extra ``"loss"`` has ``shape`` whatever the batch."""
    return _ScalarExtra(tuple(shape))


class _Flipping(nn.Module):
    """Acts 0; its ``"extra"`` differs between odd and even calls in ``differ`` only.

    ``"dtype"``: float32 zeros, then float64 zeros; ``"shape"``: ``[B, 1]`` zeros, then
    ``[B]`` zeros; ``"nothing"``: float64 NaN every call (equal to itself as the probe compares).
    """

    def __init__(self, differ: str) -> None:
        super().__init__()
        self.differ = differ
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        batch, odd = observation.shape[0], self.calls % 2 == 1
        action = torch.zeros(batch, dtype=torch.int64)
        if self.differ == "dtype":
            return action, torch.zeros(batch, dtype=torch.float32 if odd else torch.float64)
        if self.differ == "shape":
            return action, torch.zeros((batch, 1) if odd else (batch,))
        return action, torch.full((batch,), float("nan"), dtype=torch.float64)


def flipping_policy(observation_space: Any, action_space: Any, differ: str) -> nn.Module:
    """A stateful TensorDictModule whose probe calls differ in ``differ`` (see ``_Flipping``)."""
    return TensorDictModule(
        _Flipping(differ), in_keys=["observation"], out_keys=["action", "extra"]
    )


def private_nested_extra_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """Writes an index ``"action"`` and ``("critic", "_cache")``: private, under a public key."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    out_keys = ["action", ("critic", "_cache")]
    return TensorDictModule(module, in_keys=["observation"], out_keys=out_keys)


def actionless_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """A TensorDictModule writing ``"index"`` and ``"score"`` but no ``"action"``."""
    module = _ValueAndIndex(int(np.prod(observation_space.shape)), int(action_space.n))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["index", "score"])
