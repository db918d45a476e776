"""Batch buffers and layout: preallocated per-step storage turned into one TensorDict.

:class:`BatchBuffers` holds one batch's ``[num_envs, T]`` storage. The rollout writes
one column per env step (numpy for what the env returns, torch for what the policy
returns) and :meth:`BatchBuffers.to_tensordict` assembles TorchRL's layout once, at the
end.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from actor_service._core._frames import FOLD_MIN_FRAME_BYTES
from actor_service._kinds.env.spaces import ActionCodec, ObservationCodec
from common.packets.folding import FoldedBatch, fold_from_steps

__all__ = ["BatchBuffers"]


class BatchBuffers:
    """Storage for one batch of ``T`` steps of ``N`` envs.

    Args:
        num_envs: N.
        steps: T.
        obs_codec: Observation layout.
        act_codec: Action layout.
        extras: Per-env shape and dtype of each extra policy output.
        step_counts: Whether to record ``step_count`` (``max_frames_per_traj > 0``).
    """

    def __init__(
        self,
        num_envs: int,
        steps: int,
        obs_codec: ObservationCodec,
        act_codec: ActionCodec,
        extras: dict,
        step_counts: bool,
    ) -> None:
        n, t = num_envs, steps
        self._obs_codec, self._act_codec = obs_codec, act_codec
        # Column t is the observation the policy saw at step t; column t+1 what the env
        # returned (reset observations included; final ones are patched into "next").
        self.obs = np.empty((n, t + 1, *obs_codec.raw_shape), dtype=obs_codec.raw_dtype)
        self.action = torch.zeros((n, t, *act_codec.compact_shape), dtype=act_codec.compact_dtype)
        self.extras = {
            k: torch.zeros((n, t, *shape), dtype=dtype) for k, (shape, dtype) in extras.items()
        }
        # One view per step, made once: copying into a ready view costs ~0.7 us where
        # indexing a column (``action[:, t] = ...``) costs 2-4 us per key and step.
        self._action_steps = self.action.unbind(1)
        self._extra_steps = {k: v.unbind(1) for k, v in self.extras.items()}
        self._obs_steps = obs_codec.encode(self.obs).unbind(1) if obs_codec.is_view else None
        self.reward = np.zeros((n, t), dtype=np.float32)
        self.terminated = np.zeros((n, t), dtype=bool)
        self.truncated = np.zeros((n, t), dtype=bool)
        self.traj_ids = np.zeros((n, t), dtype=np.int64)
        self.versions = np.zeros(t, dtype=np.int64)
        self.step_count = np.zeros((n, t), dtype=np.int64) if step_counts else None
        self.final_obs: list[tuple[int, int, np.ndarray]] = []

    def policy_input(self, t: int) -> torch.Tensor:
        """The observations ``[N, ...]`` the policy sees at step ``t``, in batch form."""
        if self._obs_steps is not None:
            return self._obs_steps[t]
        return self._obs_codec.encode(self.obs[:, t])

    def record_policy(self, t: int, action: torch.Tensor, extras: dict[str, torch.Tensor]) -> None:
        """Copy step ``t``'s compact action ``[N, ...]`` and extra outputs into the batch."""
        self._action_steps[t].copy_(action)
        for key, value in extras.items():
            self._extra_steps[key][t].copy_(value)

    def to_tensordict(self, set_truncated: bool) -> TensorDict:
        """Assemble TorchRL's batch layout: ``[N, T]``, last dim named ``"time"``."""
        next_raw = self.obs[:, 1:].copy()
        for env, step, final in self.final_obs:
            next_raw[env, step] = final
        return self._assemble(set_truncated, self._obs_codec.encode(next_raw))

    def folding_pays(self) -> bool:
        """Whether an observation frame is large enough for :meth:`to_folded` to pay."""
        shape, dtype = self._obs_codec.shape, self._obs_codec.dtype
        return int(np.prod(shape)) * dtype.itemsize >= FOLD_MIN_FRAME_BYTES

    def to_folded(self, set_truncated: bool) -> FoldedBatch:
        """The same batch folded (:mod:`common.packets.folding`): each observation held once.

        ``("next", "observation")`` is left out; the finals hold it where it is
        not the following step's observation: the final observations of ended
        episodes and every env's last step.
        """
        n, t = self.reward.shape
        finals = {env * t + step: final for env, step, final in self.final_obs}
        for env in range(n):
            finals.setdefault(env * t + t - 1, self.obs[env, t])
        index = sorted(finals)
        raw = np.stack([finals[i] for i in index]) if index else self.obs[:0, 0]
        batch = self._assemble(set_truncated, None)
        values: dict[tuple[str, ...], torch.Tensor] = {
            ("observation",): self._obs_codec.encode(raw)
        }
        return fold_from_steps(batch, values, torch.tensor(index, dtype=torch.int64))

    def _assemble(self, set_truncated: bool, next_obs: torch.Tensor | None) -> TensorDict:
        n, t = self.reward.shape
        terminated = torch.from_numpy(self.terminated).unsqueeze(-1)
        truncated = torch.from_numpy(self.truncated).unsqueeze(-1)
        if set_truncated:
            truncated[:, -1] = True
        versions = torch.from_numpy(self.versions).expand(n, t)
        observation = self._obs_codec.encode(self.obs[:, :-1])
        root = {
            # Folded, rows of the [N, T + 1] buffer travel as they are (one row per env).
            "observation": observation if next_obs is None else observation.contiguous(),
            "action": self._act_codec.to_batch(self.action),
            **self.extras,
            "done": torch.zeros((n, t, 1), dtype=torch.bool),
            "terminated": torch.zeros((n, t, 1), dtype=torch.bool),
            "truncated": torch.zeros((n, t, 1), dtype=torch.bool),
            "policy_version": versions.clone(),
            "collector": {"traj_ids": torch.from_numpy(self.traj_ids)},
        }
        nxt = {} if next_obs is None else {"observation": next_obs}
        nxt.update(
            {
                "reward": torch.from_numpy(self.reward).unsqueeze(-1),
                "done": terminated | truncated,
                "terminated": terminated,
                "truncated": truncated,
                "policy_version": versions.clone(),
            }
        )
        if self.step_count is not None:
            count = torch.from_numpy(self.step_count).unsqueeze(-1)
            root["step_count"] = count
            nxt["step_count"] = count + 1
        root["next"] = nxt
        return TensorDict(root, batch_size=[n, t], names=[None, "time"])
