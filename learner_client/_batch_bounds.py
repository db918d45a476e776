"""What an actor's batches may claim in one ``Collect`` session, checked before they are used.

Every number a ``BatchInfo`` carries comes from the peer. A :class:`BatchBounds` per
session holds the facts the learner knows for itself (the epoch and first new seq the
actor's ``opened`` gave, the credits granted since, the session's settings) and checks
each batch against them: its epoch is the session's; its seq lies between 1 and the last
seq the credits granted so far allow (a batch is started only on a credit, so a larger
seq was never collected); its ``model_id`` is the session's; its policy versions form a
range within ``[0, MAX_POLICY_VERSION]``, and the versions its frames carry lie in that
range (the learner's lag and staleness read the range, the user the frames), and its
trajectory and group ids name the actor (no actor pours frames into another's
trajectories or GRPO groups), both integers (NaN names no version and no worker); its
frames are no more than its rows (an LLM batch of last steps counts each dialog's turns,
at most its turn limit); an LLM batch is in the padded
form with token ids below the learner's ``vocab_size`` (``common.llm.check_padded``); a
batch of steps has the session's shape (``frames_per_batch`` frames,
``frames_per_batch // num_envs`` steps last); and its rows are no more than its bytes
(every batch holds at least one byte per row, its done flags or its tokens), so a small
packet cannot make the learner allocate by a large declared batch size. A batch that fails raises
:class:`~common.errors.ProtocolError`; the link drops it with the stream and reconnects,
before the batch counts anywhere: in a sync round the other actors' shares stay for the
round.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from tensordict import TensorDictBase

from common.config import MAX_POLICY_VERSION, CollectSettings
from common.errors import ProtocolError
from common.llm import MAX_TURNS, check_padded
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.traj_ids import worker_of

__all__ = ["BatchBounds"]

#: Where a batch's frames carry the version of the weights that acted.
_VERSION_KEYS = ("policy_version", ("next", "policy_version"))
#: Ids an actor draws with its worker_id in their top bits (``common.traj_ids``).
_ID_KEYS = (("collector", "traj_ids"), ("collector", "group_id"))
#: A split batch's real frames (TorchRL's ``split_trajectories``).
_MASK_KEY = ("collector", "mask")


class BatchBounds:
    """The checks one session's batches pass (use on the learner's event loop).

    Args:
        address: The actor's address, for messages.
        settings: The session's settings.
        credits: Credits granted in ``open``.
        num_envs: The actor's env pool (chat slots) as Describe reported it.
        worker_id: The actor's worker_id as Describe reported it.
    """

    def __init__(
        self,
        address: str,
        settings: CollectSettings,
        credits: int,
        num_envs: int,
        worker_id: int,
    ) -> None:
        self._address = address
        self._worker_id = worker_id
        self._model_id = settings.model_id
        self._frames_per_row = 1
        llm = settings.llm
        self._vocab_size = None if llm is None else llm.vocab_size
        if llm is not None and llm.yield_only_last_steps:
            self._frames_per_row = llm.max_turns or MAX_TURNS
        # Batches of steps are [envs, T] (an env pool of more dims: [*envs, T]) with
        # T = frames_per_batch // num_envs; split trajectories and LLM dialogs vary.
        self._steps: int | None = None
        self._rows = 0
        if not settings.split_trajs and (llm is None or not llm.trajectories):
            self._steps = settings.frames_per_batch // max(num_envs, 1)
            self._rows = self._steps * num_envs
        self._padded = settings.split_trajs  # a split batch's padding holds zeros
        self._credits = credits
        self._epoch = 0
        self._next_seq = 1

    def opened(self, epoch: int, next_seq: int) -> None:
        """The actor's ``opened``: the session's epoch and its first new seq."""
        if epoch < 1 or next_seq < 1:
            raise ProtocolError(
                f"{self._address}: 'opened' gives epoch {epoch} and next_seq {next_seq}; "
                "both start at 1"
            )
        self._epoch, self._next_seq = epoch, next_seq

    def granted(self, batches: int) -> None:
        """Count credits granted after ``open``."""
        self._credits += batches

    def check_info(self, info: pb.BatchInfo) -> None:
        """Check a batch's info as its first chunk arrives (before anything is allocated)."""
        if info.epoch != self._epoch:
            self._refuse(info, f"epoch {info.epoch}, but the session is epoch {self._epoch}")
        last = self._next_seq - 1 + self._credits
        if not 1 <= info.seq <= last:
            self._refuse(info, f"a seq outside 1..{last} (the credits granted allow no more)")
        if info.model_id and info.model_id != self._model_id:
            self._refuse(
                info,
                f"model_id {info.model_id!r:.80}; the session collects with {self._model_id!r}",
            )
        low, high = info.policy_version_min, info.policy_version_max
        if not low <= high <= MAX_POLICY_VERSION:
            self._refuse(
                info, f"policy versions {low}..{high}, not a range within 0..{MAX_POLICY_VERSION}"
            )

    def check_batch(self, info: pb.BatchInfo, batch: TensorDictBase) -> int:
        """Check a decoded batch against its info; return the frames it counts for.

        A ``frames`` of 0 (an actor that does not count them) counts the batch's rows.
        """
        rows = batch.numel()
        steps = self._steps
        if steps is not None and (rows != self._rows or batch.batch_size[-1:] != (steps,)):
            self._refuse(
                info,
                f"batch size {list(batch.batch_size)}; the session's batches are "
                f"{self._rows} frames, {steps} steps of each env",
            )
        if rows > info.total_bytes:
            self._refuse(
                info,
                f"{rows} rows in {info.total_bytes} bytes; a batch holds at least a byte per row",
            )
        most = rows * self._frames_per_row
        if info.frames > most:
            self._refuse(info, f"{info.frames} frames for {rows} rows (at most {most})")
        real = self._real_frames(info, batch)
        for key in _VERSION_KEYS:
            self._check_versions(info, key, self._of_real(info, batch, key, real))
        for key in _ID_KEYS:
            self._check_ids(info, key, self._of_real(info, batch, key, real))
        if self._vocab_size is not None:
            try:
                check_padded(batch, self._vocab_size)
            except ProtocolError as exc:
                raise ProtocolError(f"{self._address}: batch seq {info.seq}: {exc}") from exc
        return info.frames or rows

    def _real_frames(self, info: pb.BatchInfo, batch: TensorDictBase) -> torch.Tensor | None:
        """A split batch's mask of real frames (its padding holds zeros); None: all are."""
        if not self._padded:
            return None
        mask = batch.get(_MASK_KEY, None)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            self._refuse(info, f"split trajectories without a boolean {_MASK_KEY!r}")
        return mask

    def _of_real(
        self, info: pb.BatchInfo, batch: TensorDictBase, key: Any, real: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The values of ``key`` at the real frames; None when the batch holds none."""
        values = batch.get(key, None)
        if not isinstance(values, torch.Tensor) or not values.numel():
            return None  # the layout checks say what is missing
        if values.is_floating_point() or values.is_complex():  # NaN names no version, no worker
            self._refuse(info, f"{key!r} of dtype {values.dtype}; versions and ids are integers")
        if real is None:
            return values
        if values.shape[: real.ndim] != real.shape:
            self._refuse(
                info, f"{key!r} of shape {list(values.shape)} beside a mask {list(real.shape)}"
            )
        return values[real]

    def _check_ids(self, info: pb.BatchInfo, key: Any, ids: torch.Tensor | None) -> None:
        """The trajectory (or group) ids of the batch name this actor."""
        if ids is None or not ids.numel():
            return
        named = worker_of(ids)
        if not bool((named == self._worker_id).all()):
            other = int(named[named != self._worker_id][0])
            self._refuse(info, f"{key!r} of worker_id {other}; it is worker_id {self._worker_id}")

    def _check_versions(self, info: pb.BatchInfo, key: Any, versions: torch.Tensor | None) -> None:
        """The versions the batch's frames carry lie in the range its info claims."""
        if versions is None or not versions.numel():
            return
        low, high = info.policy_version_min, info.policy_version_max
        first, last = int(versions.min()), int(versions.max())
        if first < low or last > high:
            self._refuse(
                info, f"policy versions {low}..{high}, but its frames' {key!r} hold {first}..{last}"
            )

    def _refuse(self, info: pb.BatchInfo, what: str) -> NoReturn:
        raise ProtocolError(f"{self._address}: batch seq {info.seq} claims {what}")
