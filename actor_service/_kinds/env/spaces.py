"""Gymnasium spaces to batch tensors: the observation and action encodings of an actor.

Batches use TorchRL's GymEnv encodings: a Box keeps its shape and dtype (a scalar Box
becomes ``(1,)``, :func:`common.gym_layout.batch_shape`), a Discrete
observation or action becomes a one-hot ``int64`` vector. MultiDiscrete and
MultiBinary keep gymnasium's integer arrays (TorchRL would one-hot MultiDiscrete; we
keep the indices). Inside a rollout an action travels in *compact* form — a Discrete
action as its ``int64`` index — so a step costs no one-hot; :meth:`ActionCodec.to_batch`
expands a whole batch at once at the end.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import torch
import torch.nn.functional as F

from common.errors import InternalError
from common.gym_layout import batch_dtype, batch_shape, torch_dtype

__all__ = ["ActionCodec", "ObservationCodec", "check_space"]

_SUPPORTED = (
    gymnasium.spaces.Box,
    gymnasium.spaces.Discrete,
    gymnasium.spaces.MultiDiscrete,
    gymnasium.spaces.MultiBinary,
)


def check_space(space: gymnasium.Space, role: str) -> None:
    """Refuse spaces an actor cannot batch.

    Args:
        space: A single-env space.
        role: ``"observation"`` or ``"action"``, for the message.

    Raises:
        ValueError: Naming the space and the supported kinds.
    """
    if isinstance(space, _SUPPORTED):
        return
    parts = getattr(space, "spaces", None)  # Dict and Tuple: name the kind, not every part
    shown = f"{type(space).__name__} of {len(parts)} spaces" if parts is not None else repr(space)
    fixes = []
    if role == "observation" and _flattens_to_box(space):
        fixes.append("wrap the env in gymnasium's FlattenObservation")
    if not isinstance(space, gymnasium.spaces.Sequence | gymnasium.spaces.Graph):
        fixes.append(
            'host it as a TorchRL env (--kind torchrl, LocalFleet(kind="torchrl"), an env '
            "factory returning e.g. GymWrapper(env))"
        )
    fix = " or ".join(fixes) or (
        "turn it into one of those in a wrapper of your own (neither gymnasium's "
        "FlattenObservation nor TorchRL's GymWrapper takes it)"
    )
    raise ValueError(
        f"{role} space {shown:.300} is not supported by a gymnasium actor (Box, Discrete, "
        f"MultiDiscrete or MultiBinary): {fix}"
    )


def _flattens_to_box(space: gymnasium.Space) -> bool:
    """Whether gymnasium's ``FlattenObservation`` turns ``space`` into a Box."""
    try:
        return isinstance(gymnasium.spaces.flatten_space(space), gymnasium.spaces.Box)
    except (NotImplementedError, TypeError, ValueError):
        return False


class ObservationCodec:
    """Observations as gymnasium returns them (raw) and as batches hold them.

    Args:
        space: The single-env observation space.

    Attributes:
        raw_shape: Per-env shape of the numpy observation a vector env returns.
        raw_dtype: Its numpy dtype.
        shape: Per-env shape in a batch.
        dtype: Torch dtype in a batch.
        is_view: :meth:`encode` returns a view of its input (every space but Discrete,
            which becomes one-hot).
    """

    def __init__(self, space: gymnasium.Space) -> None:
        check_space(space, "observation")
        self.space = space
        self._discrete = isinstance(space, gymnasium.spaces.Discrete)
        self.is_view = not self._discrete
        self.raw_shape: tuple[int, ...] = tuple(space.shape or ())
        self.raw_dtype = np.dtype(space.dtype)
        if isinstance(space, gymnasium.spaces.Discrete):
            self._n = int(space.n)
            self._start = int(space.start)
        self.shape: tuple[int, ...] = batch_shape(space)
        self.dtype = batch_dtype(space)
        self._scalar = not self._discrete and not self.raw_shape

    def encode(self, raw: np.ndarray) -> torch.Tensor:
        """Raw observations ``[..., *raw_shape]`` → batch form (shares memory when it can)."""
        tensor = torch.from_numpy(raw)
        if self._discrete:
            return F.one_hot(tensor.long() - self._start, self._n)
        return tensor.unsqueeze(-1) if self._scalar else tensor

    def placeholder(self, batch: int) -> np.ndarray:
        """``batch`` valid raw observations (zeros moved inside the bounds) for probing a policy."""
        raw = np.zeros((batch, *self.raw_shape), dtype=self.raw_dtype)
        if isinstance(self.space, gymnasium.spaces.Box):
            raw = np.clip(raw, self.space.low, self.space.high).astype(self.raw_dtype)
        elif self._discrete:
            raw += self._start
        return raw


class ActionCodec:
    """Actions in compact form (rollout), batch form (TorchRL) and env form (numpy).

    Args:
        space: The single-env action space.

    Attributes:
        compact_shape: Per-env shape of a compact action (``()`` for Discrete).
        compact_dtype: Its torch dtype.
        shape: Per-env shape in a batch (``(n,)`` one-hot for Discrete).
        dtype: Torch dtype in a batch.
    """

    def __init__(self, space: gymnasium.Space) -> None:
        check_space(space, "action")
        self.space = space
        self.discrete = isinstance(space, gymnasium.spaces.Discrete)
        if isinstance(space, gymnasium.spaces.Discrete):
            self.n = int(space.n)
            self._start: int | np.ndarray = int(space.start)
            self.compact_shape: tuple[int, ...] = ()
            self.compact_dtype = torch.int64
            self.shape: tuple[int, ...] = (self.n,)
            self.dtype = torch.int64
        else:
            self.compact_shape = batch_shape(space)
            self.compact_dtype = torch_dtype(np.dtype(space.dtype))
            self.shape = self.compact_shape
            self.dtype = self.compact_dtype
        # Per element, the exclusive upper bound of an index-valued action (None: a Box).
        self._bound: torch.Tensor | None = None
        if isinstance(space, gymnasium.spaces.MultiDiscrete):
            self._start = np.asarray(space.start)
            self._bound = torch.as_tensor(np.asarray(space.nvec), dtype=torch.int64)
        if isinstance(space, gymnasium.spaces.MultiBinary):
            self._bound = torch.full(self.compact_shape, 2, dtype=torch.int64)
        self._np_dtype = np.dtype(space.dtype)
        self._scalar = isinstance(space, gymnasium.spaces.Box) and not space.shape
        # An integer or bool Box's bounds: a float action is clipped before its cast (a cast
        # first would wrap -1 to 255 for uint8, which the clip for the env then kept).
        self._cast_bounds: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(space, gymnasium.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
            low, high = (torch.as_tensor(b.astype(np.float64)) for b in (space.low, space.high))
            self._cast_bounds = (low.reshape(self.compact_shape), high.reshape(self.compact_shape))

    def to_batch(self, compact: torch.Tensor) -> torch.Tensor:
        """Compact actions ``[..., *compact_shape]`` → batch form (Discrete: one-hot ``int64``)."""
        if self.discrete:
            return F.one_hot(compact, self.n)
        return compact

    def to_env(self, compact: torch.Tensor) -> np.ndarray:
        """Compact actions ``[B, ...]`` → what the vector env steps with (clipped to Box bounds)."""
        action = compact.detach().cpu().numpy()
        if self._scalar:  # [B, 1] in batches, [B] for the env
            action = action.reshape(len(action))
        if self.discrete:
            return action + self._start if self._start else action
        if isinstance(self.space, gymnasium.spaces.Box):
            return np.clip(action, self.space.low, self.space.high).astype(
                self._np_dtype, copy=False
            )
        if isinstance(self.space, gymnasium.spaces.MultiDiscrete):
            return (action + self._start).astype(self._np_dtype, copy=False)
        return action.astype(self._np_dtype, copy=False)

    def from_policy(self, action: torch.Tensor, batch: int) -> torch.Tensor:
        """A policy's action for ``batch`` envs → compact form, validated.

        Discrete accepts a one-hot ``[B, n]`` (any dtype) or an integer index ``[B]`` /
        ``[B, 1]``; other spaces need ``[B, *shape]`` and are cast to the space's dtype.

        Raises:
            InternalError: Not a tensor, or the shape or the index range is wrong; the
                policy, not the caller, is at fault.
        """
        if not isinstance(action, torch.Tensor):
            raise InternalError(
                f"the policy returned a {type(action).__name__} as action, not a tensor"
            )
        if self.discrete:
            return self._discrete_index(action, batch)
        expected = (batch, *self.compact_shape)
        if self._scalar and tuple(action.shape) == (batch,):  # the space's own shape
            action = action.unsqueeze(-1)
        if tuple(action.shape) != expected:
            raise InternalError(
                f"the policy returned an action of shape {list(action.shape)}, "
                f"expected {list(expected)}"
            )
        indices = self._bound is not None
        if indices and action.is_floating_point() and not torch.equal(action, action.round()):
            raise InternalError(  # the cast below would truncate them
                f"the policy returned {action.dtype} actions that are not whole numbers "
                f"for {self.space}; its actions are integers"
            )
        if self._cast_bounds is not None and action.is_floating_point():
            low, high = (b.to(action.device) for b in self._cast_bounds)
            action = action.double().clamp(low, high)
        compact = action.to(self.compact_dtype)
        if compact.device.type == "cpu":
            self.check_range(compact)
        return compact

    def _discrete_index(self, action: torch.Tensor, batch: int) -> torch.Tensor:
        if tuple(action.shape) == (batch, self.n) and not (
            self.n == 1 and not action.is_floating_point()
        ):
            return action.argmax(-1)
        if action.is_floating_point() or action.dtype == torch.bool:
            raise InternalError(
                f"the policy returned a {action.dtype} action of shape {list(action.shape)}; a "
                f"Discrete({self.n}) action must be one-hot [{batch}, {self.n}] or an integer "
                f"index [{batch}]"
            )
        index = action.reshape(batch) if action.numel() == batch else None
        if index is None:
            raise InternalError(
                f"the policy returned an action of shape {list(action.shape)}, expected "
                f"one-hot [{batch}, {self.n}] or an index [{batch}]"
            )
        if index.device.type == "cpu":
            self.check_range(index)
        return index.long()

    def check_range(self, compact: torch.Tensor) -> None:
        """Refuse actions outside the space (read on the host: it synchronises).

        Discrete and MultiDiscrete indices must lie in ``[0, n)`` (each element its own
        ``n``), MultiBinary values be 0 or 1. A policy on another device is checked once
        its action is back on the host.

        Raises:
            InternalError: An action out of range.
        """
        if compact.numel() == 0:
            return
        if self.discrete:
            low, high = int(compact.min()), int(compact.max())
            if low < 0 or high >= self.n:
                raise InternalError(
                    f"the policy returned action indices in [{low}, {high}], outside [0, {self.n})"
                )
        elif self._bound is not None:
            outside = (compact < 0) | (compact >= self._bound)
            if bool(outside.any()):
                shown = compact[outside][:4].tolist()
                raise InternalError(
                    f"the policy returned actions outside {self.space}: {shown} (each element "
                    f"in [0, {self._bound.tolist()}), before the space's start)"
                )
