"""What the env-stepping kinds (gymnasium and TorchRL envs) agree on about frames and batches.

Both kinds fold observations only from the same size on, cut batches into trajectories
the way TorchRL's collectors do, and set the same tensordict interaction type for an
exploration type; the rule lives here once so neither kind imports the other.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn.probabilistic import InteractionType

from common.config import ExplorationType

__all__ = ["FOLD_MIN_FRAME_BYTES", "SPLIT_MASK", "interaction_of", "split_trajectories"]

#: Folding pays from this many observation bytes per frame: below it, rebuilding
#: ("next", "observation") costs the learner more CPU than receiving it (CartPole's
#: 16 bytes: about 1 us per frame more, measured by bench.learner_cost).
FOLD_MIN_FRAME_BYTES = 64

_INTERACTION = {
    ExplorationType.RANDOM: InteractionType.RANDOM,
    ExplorationType.DETERMINISTIC: InteractionType.DETERMINISTIC,
    ExplorationType.MODE: InteractionType.MODE,
    ExplorationType.MEAN: InteractionType.MEAN,
}


#: A split batch's entry marking its real frames (the rest is zero padding), as TorchRL's.
SPLIT_MASK = ("collector", "mask")


def interaction_of(exploration_type: ExplorationType) -> InteractionType:
    """The tensordict interaction type an exploration type sets."""
    return _INTERACTION[exploration_type]


def split_trajectories(batch: TensorDict) -> TensorDict:
    """Cut a ``[N, T]`` batch into zero-padded trajectories, like TorchRL's ``split_trajectories``.

    Frames are taken env by env in time order and cut wherever
    ``("collector", "traj_ids")`` changes; each piece becomes a row of
    ``[n_traj, T_max]``, padded with zeros, and ``("collector", "mask")`` marks the
    real frames. Vectorised: one scatter per key.

    Args:
        batch: A ``[N, T]`` batch with ``("collector", "traj_ids")``.

    Returns:
        A new ``[n_traj, T_max]`` TensorDict.
    """
    flat = batch.reshape(-1)
    ids = flat.get(("collector", "traj_ids"))
    total = ids.shape[0]
    starts_mask = torch.ones(total, dtype=torch.bool)
    starts_mask[1:] = ids[1:] != ids[:-1]
    row = starts_mask.cumsum(0) - 1
    starts = torch.nonzero(starts_mask).squeeze(-1)
    lengths = torch.diff(starts, append=torch.tensor([total]))
    col = torch.arange(total) - starts[row]
    shape = [int(starts.shape[0]), int(lengths.max())]

    def scatter(value: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((*shape, *value.shape[1:]), dtype=value.dtype)
        out[row, col] = value
        return out

    out = flat.apply(scatter, batch_size=shape)
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[row, col] = True
    out.set(SPLIT_MASK, mask)
    return out
