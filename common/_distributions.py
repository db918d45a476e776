"""The action distributions of the built-in policies, with TorchRL's action encodings.

:class:`OneHotCategorical` samples one-hot ``int64`` vectors (TorchRL's GymEnv encoding
of a Discrete action) by inverse-CDF sampling; :class:`IndependentNormal` is a diagonal
normal with one joint log-prob per action. :func:`sample_index` and
:func:`standard_normal` are the random draws both distributions use, exposed so a
tensor-only fast path draws exactly the same numbers from the same RNG state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import distributions as D

__all__ = ["IndependentNormal", "OneHotCategorical", "sample_index", "standard_normal"]


def sample_index(probs: torch.Tensor) -> torch.Tensor:
    """One category index per row of ``probs`` ``[..., n]`` (inverse-CDF, one uniform each)."""
    # Inverse-CDF sampling: one uniform per row, cheaper than torch.multinomial on
    # small batches, and shared by both forward paths so they agree draw for draw.
    u = torch.rand((*probs.shape[:-1], 1), dtype=probs.dtype, device=probs.device)
    index = torch.searchsorted(probs.cumsum(-1), u).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1)  # float error may leave cdf[-1] < u


class OneHotCategorical(D.OneHotCategorical):
    """``torch.distributions.OneHotCategorical`` whose samples are one-hot ``int64``.

    TorchRL's GymEnv encodes a Discrete action as a one-hot ``int64`` vector; sampling
    that dtype directly keeps batches identical whether a TorchRL collector or an actor
    runs the policy. ``log_prob`` accepts the ``int64`` one-hot vectors.
    """

    def sample(self, sample_shape: torch.Size | Sequence[int] = ()) -> torch.Tensor:
        """Draw one-hot ``int64`` samples of shape ``sample_shape + batch_shape + (n,)``."""
        probs = self.probs.expand(torch.Size(sample_shape) + self.probs.shape)
        return F.one_hot(sample_index(probs), self.probs.shape[-1])

    @property
    def mode(self) -> torch.Tensor:
        """The most likely action, one-hot ``int64``."""
        return F.one_hot(self.probs.argmax(-1), self.probs.shape[-1])

    @property
    def mean(self) -> torch.Tensor:
        """The mode: the probability vector is not an action, so MEAN acts like MODE."""
        return self.mode

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """What ``InteractionType.DETERMINISTIC`` returns: the mode."""
        return self.mode


class IndependentNormal(D.Independent[D.Normal]):
    """A diagonal normal over the last dimension (one joint log-prob per action).

    Args:
        loc: The means.
        scale: The standard deviations, broadcastable to ``loc``.
        validate_args: Forwarded to torch's distributions.
    """

    def __init__(
        self, loc: torch.Tensor, scale: torch.Tensor, validate_args: bool | None = None
    ) -> None:
        super().__init__(D.Normal(loc, scale, validate_args=validate_args), 1, validate_args)

    def rsample(self, sample_shape: torch.Size | Sequence[int] = ()) -> torch.Tensor:
        """Reparameterised samples ``loc + eps * scale``."""
        shape = self._extended_shape(torch.Size(sample_shape))
        base = self.base_dist
        sample: torch.Tensor = (
            base.loc.expand(shape) + standard_normal(base.loc, shape) * base.scale
        )
        return sample

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """What ``InteractionType.DETERMINISTIC`` returns: the mean."""
        return self.mean


def standard_normal(like: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Standard normal draws of ``shape`` with ``like``'s dtype and device."""
    return torch.randn(shape, dtype=like.dtype, device=like.device)
