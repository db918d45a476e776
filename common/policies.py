"""Built-in policy architectures, shared so a learner builds the very module an actor runs.

:func:`make_policy` resolves ``"random"``, ``"mlp"`` or ``"package.module:function"``;
:func:`make_value_mlp` builds the matching critic. The ``"mlp"`` policy is a tensordict
``ProbabilisticTensorDictSequential``: an MLP writes ``"logits"`` (Discrete actions, a
one-hot categorical) or ``"loc"`` plus a state-independent ``"scale"`` (Box actions, an
independent normal), then the distribution writes ``"action"`` and ``"action_log_prob"``.
A learner calls ``module.get_dist(td).log_prob(td["action"])`` on actor batches.
``tensordict.nn.set_interaction_type`` chooses sampling (RANDOM) or the mode/mean
(DETERMINISTIC, MODE, MEAN).

Actions follow TorchRL's GymEnv encoding: a Discrete action is a one-hot ``int64`` vector.
Besides the TensorDict forward, the built-in policies offer ``act_compact(observation)``,
the allocation-light path an actor uses once per env step: it returns the action in
*compact* form (a Discrete action as its ``int64`` index) plus the extra outputs, and it
draws from the same random stream as the TensorDict forward, so both give equal results
for equal RNG states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
)
from tensordict.nn.probabilistic import interaction_type
from torch import nn

from common._distributions import (
    IndependentNormal,
    OneHotCategorical,
    sample_index,
    standard_normal,
)
from common.gym_layout import batch_shape, torch_dtype
from common.import_paths import load_callable

__all__ = [
    "IndependentNormal",
    "MLPPolicy",
    "OneHotCategorical",
    "RandomPolicy",
    "make_policy",
    "make_value_mlp",
]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class _ObservationEncoder(nn.Module):
    """Flattens the observation dims and casts to float32 (no parameters)."""

    def __init__(self, observation_ndim: int) -> None:
        super().__init__()
        self.observation_ndim = observation_ndim

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.observation_ndim != 1:
            observation = observation.flatten(observation.ndim - self.observation_ndim)
        return observation.to(torch.float32)


class _LogStdScale(nn.Module):
    """A learnable, state-independent standard deviation: ``exp(log_std)`` shaped like ``loc``."""

    def __init__(self, action_dim: int) -> None:
        super().__init__()
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, loc: torch.Tensor) -> torch.Tensor:
        return self.log_std.exp().expand_as(loc)


def _observation_layout(space: gymnasium.Space[Any]) -> tuple[int, int]:
    """(encoded observation ndim, flat input width) of a supported observation space."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return 1, int(space.n)  # TorchRL one-hot encodes Discrete observations
    if isinstance(
        space, gymnasium.spaces.Box | gymnasium.spaces.MultiBinary | gymnasium.spaces.MultiDiscrete
    ):
        shape = batch_shape(space)  # a scalar Box is batched as (1,)
        return len(shape), int(np.prod(shape, dtype=np.int64))
    raise ValueError(
        f"observation space {space!r} is not supported: use Box, Discrete, "
        "MultiBinary or MultiDiscrete"
    )


def _mlp(
    observation_space: gymnasium.Space[Any],
    out_features: int,
    hidden: Sequence[int],
    activation: str,
) -> nn.Sequential:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    widths = [int(h) for h in hidden]
    if any(w <= 0 for w in widths):
        raise ValueError(f"hidden sizes must be positive, got {list(hidden)!r}")
    ndim, width = _observation_layout(observation_space)
    layers: list[nn.Module] = [_ObservationEncoder(ndim)]
    for size in widths:
        layers += [nn.Linear(width, size), _ACTIVATIONS[activation]()]
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def make_value_mlp(
    observation_space: gymnasium.Space[Any],
    hidden: Sequence[int] = (64, 64),
    activation: str = "tanh",
) -> nn.Module:
    """Build the critic that goes with the ``"mlp"`` policy.

    Args:
        observation_space: The single-env observation space.
        hidden: Hidden layer widths.
        activation: ``"tanh"``, ``"relu"``, ``"elu"``, ``"gelu"`` or ``"silu"``.

    Returns:
        An ``nn.Module`` mapping an observation tensor ``[..., *obs_shape]`` to ``[..., 1]``.

    Raises:
        ValueError: Unsupported space, activation or hidden sizes.
    """
    return _mlp(observation_space, 1, hidden, activation)


class MLPPolicy(ProbabilisticTensorDictSequential):
    """The ``"mlp"`` policy: MLP → distribution parameters → ``"action"`` and its log-prob.

    Discrete(n) actions: ``observation → logits`` then :class:`OneHotCategorical`.
    Box actions (1-D): ``observation → loc``, a learnable state-independent ``scale``,
    then :class:`IndependentNormal`. ``return_log_prob`` writes ``"action_log_prob"``
    (one value per frame).

    Args:
        observation_space: The single-env observation space.
        action_space: ``Discrete`` or 1-D ``Box``.
        hidden: Hidden layer widths.
        activation: The hidden activation's name.

    Example::

        policy = MLPPolicy(env.observation_space, env.action_space)
        td = policy(TensorDict({"observation": obs}, batch_size=[8]))
        log_prob = policy.get_dist(td).log_prob(td["action"])
    """

    def __init__(
        self,
        observation_space: gymnasium.Space[Any],
        action_space: gymnasium.Space[Any],
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
    ) -> None:
        dist_class: type[torch.distributions.Distribution]
        if isinstance(action_space, gymnasium.spaces.Discrete):
            net = _mlp(observation_space, int(action_space.n), hidden, activation)
            modules: list[TensorDictModuleBase] = [
                TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
            ]
            dist_keys, dist_class = ["logits"], OneHotCategorical
        elif _float_box(action_space) and len(batch_shape(action_space)) == 1:
            dim = batch_shape(action_space)[0]  # a scalar Box acts as (1,)
            net = _mlp(observation_space, dim, hidden, activation)
            modules = [
                TensorDictModule(net, in_keys=["observation"], out_keys=["loc"]),
                TensorDictModule(_LogStdScale(dim), in_keys=["loc"], out_keys=["scale"]),
            ]
            dist_keys, dist_class = ["loc", "scale"], IndependentNormal
        else:
            raise ValueError(
                "the 'mlp' policy supports Discrete and 1-D (or scalar) float Box action "
                f"spaces, got {action_space!r} (its Gaussian samples are not integers or "
                "bools: use policy 'random' or a policy of your own)"
            )
        head = ProbabilisticTensorDictModule(
            in_keys=dist_keys,
            out_keys=["action"],
            distribution_class=dist_class,
            return_log_prob=True,
            log_prob_key="action_log_prob",
        )
        super().__init__(*modules, head)
        self.discrete = dist_class is OneHotCategorical
        # Plain references for act_compact, in tuples: a tuple is not registered as a
        # submodule, so the state dict is unchanged (a module attribute would add its
        # parameters a second time); calling layer.forward directly skips tensordict's
        # attribute lookups and nn.Module's call overhead (no hooks run on that path).
        self._fast_layers = tuple(net)
        self._fast_scale: tuple[nn.Module, ...] = () if self.discrete else (modules[1].module,)
        self._default_mode = head.default_interaction_type

    def act_compact(
        self, observation: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The per-step fast path: same outputs as the TensorDict forward, no TensorDict.

        Reads the interaction type like the TensorDict forward does (unset → the
        head's default, DETERMINISTIC). Module hooks do not run on this path.

        Args:
            observation: ``[B, *obs_shape]``.

        Returns:
            ``(action, extras)``: the action as an ``int64`` index ``[B]`` (Discrete) or
            the sampled vector ``[B, d]`` (Box), and ``{"logits"}`` or ``{"loc", "scale"}``
            plus ``"action_log_prob"`` ``[B]``.
        """
        mode = interaction_type() or self._default_mode
        out = observation
        for layer in self._fast_layers:
            out = layer.forward(out)
        if self.discrete:
            logits = out
            log_probs = logits.log_softmax(-1)
            if mode is InteractionType.RANDOM:
                index = sample_index(logits.softmax(-1))
            else:
                index = logits.argmax(-1)
            log_prob = log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
            return index, {"logits": logits, "action_log_prob": log_prob}
        loc = out
        (scale_module,) = self._fast_scale  # built for every non-discrete space
        scale = scale_module.forward(loc)
        if mode is InteractionType.RANDOM:
            action = loc + standard_normal(loc, loc.shape) * scale
        else:
            action = loc
        log_prob = (-((action - loc) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI).sum(-1)
        return action, {"loc": loc, "scale": scale, "action_log_prob": log_prob}


def _float_box(space: gymnasium.Space[Any]) -> bool:
    """Whether ``space`` is a Box of a floating dtype."""
    return isinstance(space, gymnasium.spaces.Box) and np.issubdtype(space.dtype, np.floating)


class RandomPolicy(TensorDictModuleBase):
    """Uniform actions from the action space, drawn with torch's RNG; no parameters.

    Discrete → one-hot ``int64``; float Box dims bounded on both sides → uniform in
    ``[low, high]``, other dims → a standard normal clipped to any finite bound; integer Box
    → uniform integers in ``[low, high]``; bool Box → fair bits; MultiDiscrete → ``int64``
    indices; MultiBinary → ``int8`` bits.

    Args:
        observation_space: The single-env observation space (unused; kept for the
            factory signature).
        action_space: The single-env action space.
    """

    def __init__(
        self, observation_space: gymnasium.Space[Any], action_space: gymnasium.Space[Any]
    ) -> None:
        super().__init__()
        self.in_keys = ["observation"]
        self.out_keys = ["action"]
        self.action_space = action_space
        if isinstance(action_space, gymnasium.spaces.Box):
            self._low = torch.as_tensor(action_space.low, dtype=torch.float64)
            self._high = torch.as_tensor(action_space.high, dtype=torch.float64)
            self._finite = torch.isfinite(self._low) & torch.isfinite(self._high)
            self._bounded = bool(self._finite.all())
            self._dtype = torch_dtype(action_space.dtype)
        elif isinstance(action_space, gymnasium.spaces.MultiDiscrete):
            self._nvec = torch.as_tensor(action_space.nvec, dtype=torch.float64)
        elif not isinstance(action_space, gymnasium.spaces.Discrete | gymnasium.spaces.MultiBinary):
            raise ValueError(
                f"the 'random' policy supports Box, Discrete, MultiDiscrete and MultiBinary "
                f"action spaces, got {action_space!r}"
            )

    def sample_compact(self, batch: int) -> torch.Tensor:
        """``batch`` actions in compact form (a Discrete action as its ``int64`` index)."""
        space = self.action_space
        if isinstance(space, gymnasium.spaces.Discrete):
            return torch.randint(int(space.n), (batch,))
        if isinstance(space, gymnasium.spaces.MultiBinary):
            return torch.randint(2, (batch, *space.shape), dtype=torch.int8)
        if isinstance(space, gymnasium.spaces.MultiDiscrete):
            return (torch.rand((batch, *self._nvec.shape), dtype=torch.float64) * self._nvec).long()
        shape = (batch, *batch_shape(space))
        if self._dtype == torch.bool:
            return torch.randint(2, shape, dtype=torch.bool)
        if not self._dtype.is_floating_point:  # each integer of [low, high] alike
            span = (self._high - self._low + 1) * torch.rand(shape, dtype=torch.float64)
            return (self._low + span.floor()).clamp(max=self._high).to(self._dtype)
        if self._bounded:
            u = torch.rand(shape, dtype=torch.float64)
            return (self._low + u * (self._high - self._low)).to(self._dtype)
        normal = torch.randn(shape, dtype=torch.float64).clamp(self._low, self._high)
        if not self._finite.any():
            return normal.to(self._dtype)
        uniform = self._low + torch.rand(shape, dtype=torch.float64) * (self._high - self._low)
        return torch.where(self._finite, uniform, normal).to(self._dtype)

    def act_compact(
        self, observation: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Random compact actions for a ``[B, ...]`` observation batch; no extras."""
        return self.sample_compact(observation.shape[0]), {}

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``"action"`` (TorchRL form) for every element of ``tensordict``."""
        batch = int(np.prod(tensordict.batch_size, dtype=np.int64))
        action = self.sample_compact(batch)
        if isinstance(self.action_space, gymnasium.spaces.Discrete):
            action = F.one_hot(action, int(self.action_space.n))
        tensordict.set("action", action.reshape(*tensordict.batch_size, *action.shape[1:]))
        return tensordict


def make_policy(
    name_or_factory: str,
    observation_space: gymnasium.Space[Any],
    action_space: gymnasium.Space[Any],
    **kwargs: Any,
) -> nn.Module:
    """Build a policy by name: ``"random"``, ``"mlp"`` or ``"package.module:function"``.

    Args:
        name_or_factory: The built-in name, or a factory called as
            ``factory(observation_space, action_space, **kwargs)``.
        observation_space: The single-env observation space.
        action_space: The single-env action space.
        **kwargs: For ``"mlp"``: ``hidden=(64, 64)``, ``activation="tanh"``; for a
            factory, anything it takes; ``"random"`` takes none.

    Returns:
        The policy module (a :class:`MLPPolicy`, a :class:`RandomPolicy` or whatever the
        factory returns).

    Raises:
        ValueError: Unknown name, malformed factory string, unsupported spaces or
            unexpected keyword arguments.
        TypeError: The factory did not return an ``nn.Module``.

    Example::

        policy = make_policy("mlp", env.observation_space, env.action_space, hidden=(32, 32))
    """
    if name_or_factory == "mlp":
        unknown = sorted(set(kwargs) - {"hidden", "activation"})
        if unknown:
            raise ValueError(f"the 'mlp' policy takes hidden and activation, got {unknown}")
        return MLPPolicy(observation_space, action_space, **kwargs)
    if name_or_factory == "random":
        if kwargs:
            raise ValueError(f"the 'random' policy takes no arguments, got {sorted(kwargs)}")
        return RandomPolicy(observation_space, action_space)
    if not isinstance(name_or_factory, str) or ":" not in name_or_factory:
        raise ValueError(
            f"policy must be 'random', 'mlp' or 'package.module:function', got {name_or_factory!r}"
        )
    module = load_callable(name_or_factory)(observation_space, action_space, **kwargs)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"policy factory {name_or_factory!r} returned a {type(module).__name__}, "
            "not an nn.Module"
        )
    return module
