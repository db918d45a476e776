"""Episode returns computed from collector batches, following trajectories across batches.

A trajectory is named by ``(("collector", "worker_id"), ("collector", "traj_ids"))``
and ends at the frame whose ``("next", "done")`` is set. Rewards are summed per
trajectory with one vectorised pass over the batch; a trajectory still running
at the end of a batch carries its partial sum into the next batch it appears in
(the next batch of the same env in sync mode, of the same actor in async mode).
"""

from __future__ import annotations

import collections
import statistics

import torch
from tensordict import TensorDictBase

__all__ = ["EpisodeTracker"]

# Open trajectories kept at most; more would mean ids that never end (e.g. a dead actor's).
_MAX_OPEN = 100_000


class EpisodeTracker:
    """Collects the return and length of every finished episode.

    Args:
        window: Finished episodes averaged by :attr:`recent_mean`.

    Example::

        tracker = EpisodeTracker(window=20)
        for batch in collector:
            tracker.add(batch, frames_so_far)
            print(tracker.recent_mean)
    """

    def __init__(self, window: int = 20) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window!r}")
        self.window = window
        self.returns: list[float] = []
        self.lengths: list[int] = []
        #: Frames collected in the run when each episode was reported (for learning curves).
        self.end_frames: list[int] = []
        self._open: collections.OrderedDict[tuple[int, int], tuple[float, int]] = (
            collections.OrderedDict()
        )

    @property
    def recent_mean(self) -> float | None:
        """Mean return of the last ``window`` finished episodes (None before the first)."""
        if not self.returns:
            return None
        return statistics.fmean(self.returns[-self.window :])

    @property
    def recent_full(self) -> bool:
        """Whether at least ``window`` episodes finished, so :attr:`recent_mean` is full."""
        return len(self.returns) >= self.window

    def add(self, batch: TensorDictBase, frames: int) -> list[float]:
        """Account for one batch.

        Args:
            batch: A collector batch shaped ``[..., T]`` with ``("collector", "traj_ids")``,
                ``("next", "reward")`` and ``("next", "done")``.
            frames: Frames collected in the run so far, recorded with the finished episodes.

        Returns:
            The returns of the episodes that finished in this batch.
        """
        # The bookkeeping is on the host, whichever device the learner's batches are on.
        traj = batch["collector", "traj_ids"].reshape(-1).cpu()
        worker = batch.get(("collector", "worker_id"), None)
        worker = (
            torch.zeros_like(traj) if worker is None else worker.reshape(-1).cpu().to(traj.dtype)
        )
        reward = batch["next", "reward"].reshape(traj.shape[0], -1).sum(-1).double().cpu()
        done = batch["next", "done"].reshape(traj.shape[0], -1).any(-1).cpu()

        keys, inverse = torch.unique(torch.stack([worker, traj], -1), dim=0, return_inverse=True)
        sums = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, reward)
        counts = torch.zeros(len(keys), dtype=torch.int64).index_add_(
            0, inverse, torch.ones_like(inverse)
        )
        ended = torch.zeros(len(keys), dtype=torch.bool).index_put_(
            (inverse,), done, accumulate=True
        )

        finished: list[float] = []
        for key, total, count, end in zip(
            map(tuple, keys.tolist()), sums.tolist(), counts.tolist(), ended.tolist(), strict=True
        ):
            carried, carried_len = self._open.pop(key, (0.0, 0))
            if end:
                finished.append(carried + total)
                self.lengths.append(carried_len + count)
            else:
                self._open[key] = (carried + total, carried_len + count)
        while len(self._open) > _MAX_OPEN:
            self._open.popitem(last=False)
        self.returns.extend(finished)
        self.end_frames.extend([frames] * len(finished))
        return finished
