"""The env actor's collection core: env pool + models → batches with TorchRL Collector semantics.

An :class:`EnvCore` has no gRPC in it. One thread collects (``collect_batch``,
``set_seed``, ``configure``, ``load_state_dict``, ``close``); others may call
``describe`` and ``models.load_weights`` at any time. A step costs one batched forward
pass for the whole pool and one vector-env step; per-step results go into
preallocated ``[num_envs, T]`` buffers and become a TensorDict once per batch. A hung
or crashed env raises ``EnvError`` and the pool is
rebuilt before the next batch. Its slots are the envs of the pool.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import set_interaction_type

from actor_service._config import ActorConfig
from actor_service._core._base import CoreBase, check_abandoned
from actor_service._core._frames import interaction_of, split_trajectories
from actor_service._core._protocol import BatchRecorder
from actor_service._core._settings import env_name
from actor_service._kinds.env.batch import BatchBuffers
from actor_service._kinds.env.models import ModelRegistry
from actor_service._kinds.env.pool import (
    close_pool,
    derive_seed,
    kill_pool,
    make_env_pool,
    reset_pool,
    step_pool,
)
from common.config import MAX_FRAMES_PER_BATCH, CollectSettings
from common.errors import EnvError, RlfleetError
from common.packets import DEFAULT_LIMITS, encode_packet
from common.packets.folding import FoldedBatch
from common.policies import RandomPolicy

__all__ = ["EnvCore", "derive_seed"]


class EnvCore(CoreBase):
    """Env pool + models → batches, with TorchRL Collector semantics.

    Thread-compatible: one thread collects, others may call ``models.load_weights`` and
    ``describe`` concurrently. Batches are ``[num_envs, T]`` (``T = frames_per_batch /
    num_envs``) with the keys of TorchRL's ``Collector(track_policy_version=True)``;
    ``policy_version`` is the version of the weights that chose each action.

    Batch keys: ``observation``, ``action`` (one-hot ``int64`` for Discrete), the policy's
    extra outputs (``logits`` / ``loc``, ``scale`` and ``action_log_prob`` for ``"mlp"``),
    ``done``/``terminated``/``truncated`` (``[N, T, 1]`` bool, the state at t: always
    False, since ended envs are reset in the same step), ``policy_version`` ``[N, T]``,
    ``("collector", "traj_ids")`` ``[N, T]``, and under ``"next"``: ``observation`` (the
    final one where an episode ended), ``reward`` (``float32`` ``[N, T, 1]``),
    ``done``/``terminated``/``truncated`` and ``policy_version``; with
    ``max_frames_per_traj > 0`` also ``step_count`` at the root and in ``"next"``.
    ``CollectSettings.total_frames`` is the caller's to enforce.

    Args:
        config: The actor's settings (env, pool, models, device, seed, worker_id).
        metrics: Where to count batches and step latencies; None counts nothing.

    Attributes:
        num_slots: Size of the env pool (``config.num_envs``).
        models: The :class:`~actor_service._kinds.env.models.ModelRegistry` (pushes go through it).
        observation_space: The single-env observation space.
        action_space: The single-env action space.

    The rest (``worker_id``, ``epoch``, ``frames``, ...) is :class:`CoreBase`'s.

    Raises:
        ValueError: A bad setting, an env or model that cannot be built, or
            unsupported spaces.

    Example::

        with EnvCore(ActorConfig(num_envs=8)) as core:
            core.configure(CollectSettings(frames_per_batch=1024))
            batch = core.collect_batch()        # [8, 128]
            core.models.load_weights("policy", 1, state)
    """

    kind = "env"
    models: ModelRegistry
    observation_space: gymnasium.Space
    action_space: gymnasium.Space
    _obs: np.ndarray  # the envs' current observations, set by every reset

    def __init__(self, config: ActorConfig, metrics: BatchRecorder | None = None) -> None:
        super().__init__(config, metrics)
        self.env_id = env_name(config.env_pool)
        self.backend = config.env_backend
        self._session_frames = 0
        torch.manual_seed(self._first_seed)  # model initialisation is part of what a seed fixes
        self._pool = make_env_pool(config)
        try:
            self.observation_space = self._pool.single_observation_space
            self.action_space = self._pool.single_action_space
            self.models = ModelRegistry(
                config.models, self.observation_space, self.action_space, self.device
            )
            self._random = RandomPolicy(self.observation_space, self.action_space)
            self._pool_broken = self._needs_reset = False
            self._fresh = True  # no step since the last reset of every env
            self.set_seed(self._first_seed)
        except BaseException:
            close_pool(self._pool, force=True)
            raise

    def configure(self, settings: CollectSettings) -> None:
        """Validate and apply collection settings for the following batches.

        Starts a new count of frames for ``init_random_frames``: its random
        frames are the first frames collected under these settings, not the
        first of the actor's life.

        Raises:
            TypeError: ``settings`` is not a ``CollectSettings``.
            ValueError: ``frames_per_batch`` is not a multiple of ``num_envs``.
            UnknownModelError: ``settings.model_id`` is not registered.
        """
        self._check_settings_type(settings)
        self._check_settings(settings)
        with self._lock:
            self._settings = settings
            self._session_frames = 0

    def _check_settings(self, settings: CollectSettings) -> None:
        if settings.llm is not None:
            raise ValueError(
                "this is an env actor: LLM settings need an actor started with --kind llm"
            )
        if settings.frames_per_batch % self.num_slots:
            raise ValueError(
                f"frames_per_batch={settings.frames_per_batch} is not a positive multiple of "
                f"num_envs={self.num_slots}"
            )
        self.models.policy_version(settings.model_id)  # raises UnknownModelError
        largest = self.max_frames_per_batch(settings)
        if settings.frames_per_batch > largest:
            raise ValueError(
                f"frames_per_batch={settings.frames_per_batch} is too large for this actor: a "
                f"batch must fit the {DEFAULT_LIMITS.max_packet_bytes}-byte packet cap and hold at "
                f"most {MAX_FRAMES_PER_BATCH} frames; the largest that fits is {largest}"
            )

    def start_anew(self) -> None:
        """Envs that stepped since their last reset start new trajectories at the next batch."""
        with self._lock:
            if not self._fresh:
                self._needs_reset = True

    def max_frames_per_batch(self, settings: CollectSettings) -> int:
        """The largest ``frames_per_batch`` (a multiple of ``num_envs``) ``settings`` may ask for.

        A batch's packet must fit the packet cap learners decode by default
        (``common.packets.DEFAULT_LIMITS.max_packet_bytes``) and hold at most
        ``MAX_FRAMES_PER_BATCH`` frames; the packet size is measured by encoding
        empty batches of one and two steps (``split_trajs`` pads batches beyond this).
        """
        one, two = (self._frame_bytes(steps, settings) for steps in (1, 2))
        per_step = max(1, two - one)
        # Each entry may gain up to 15 bytes of alignment padding as the batch grows.
        steps = 1 + (DEFAULT_LIMITS.max_packet_bytes - one - 16 * 64) // per_step
        return max(0, min(steps, MAX_FRAMES_PER_BATCH // self.num_slots)) * self.num_slots

    def _buffers(self, steps: int, settings: CollectSettings) -> BatchBuffers:
        """Empty buffers for a batch of ``steps`` steps of every env, as ``settings`` shape it."""
        extras = self.models.output_specs(settings.model_id)
        extras.pop("action")
        return BatchBuffers(
            self.num_slots,
            steps,
            self.models.observation_codec,
            self.models.action_codec,
            extras,
            step_counts=settings.max_frames_per_traj > 0,
        )

    def _frame_bytes(self, steps: int, settings: CollectSettings) -> int:
        buffers = self._buffers(steps, settings)
        buffers.obs[...] = self.models.observation_codec.placeholder(1)[0]  # valid (a start>0)
        return encode_packet(buffers.to_tensordict(settings.set_truncated)).nbytes

    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict | FoldedBatch:
        """Collect one batch (blocking): ``frames_per_batch`` frames as ``[num_envs, T]``.

        Folded (:class:`~common.packets.folding.FoldedBatch`) when the settings ask for
        ``fold_observations``, do not ``split_trajs`` and observations are large enough
        (``FOLD_MIN_FRAME_BYTES``).

        Args:
            abandon: Set from another thread to give the batch up before its next env step
                (its session ended); the envs are reset before the next batch.

        Raises:
            SessionStateError: Not configured, or abandoned.
            ClosedError: The core is closed.
            EnvError: An env raised, or a step exceeded ``step_timeout`` (async backend: a
                ``TimeoutError``); the pool is rebuilt on the next call (the env factory's
                failure to rebuild it is an ``EnvError`` too).
        """
        with self._lock:
            settings = self._configured()
            self._ensure_pool()
            if settings.reset_at_each_iter:
                self._reset(seeds=None)
            batch = self._rollout(settings, abandon)
            self._fresh = False
            self.frames += batch.numel()
            self._session_frames += batch.numel()
            self.batches += 1
        if settings.split_trajs:
            assert isinstance(batch, TensorDict)  # never folded when split
            batch = split_trajectories(batch)
        return batch

    def _rollout(
        self, settings: CollectSettings, abandon: threading.Event | None
    ) -> TensorDict | FoldedBatch:
        steps = settings.frames_per_batch // self.num_slots
        random = self._session_frames < settings.init_random_frames
        buffers = self._buffers(steps, settings)
        buffers.obs[:, 0] = self._obs
        # Per-step timings go into an array the metrics bin once per batch.
        timings = None if self._metrics is None else np.empty((steps, 2))
        started = time.perf_counter()
        try:
            with torch.no_grad(), set_interaction_type(interaction_of(settings.exploration_type)):
                for t in range(steps):
                    check_abandoned(abandon, t, steps)
                    self._step(t, buffers, settings, random, timings)
        except EnvError:
            # Its workers go now, not at the next batch: a hung one must not outlive the
            # session (nor an actor SIGKILLed before that batch, whose pipes it holds).
            kill_pool(self._pool)
            self._pool_broken = True
            raise
        except BaseException:
            self._needs_reset = True  # the envs moved on from self._obs
            raise
        self._obs = buffers.obs[:, steps].copy()
        if self._metrics is not None and timings is not None:
            self._metrics.record_batch(
                settings.frames_per_batch, timings, time.perf_counter() - started
            )
        if settings.fold_observations and not settings.split_trajs and buffers.folding_pays():
            return buffers.to_folded(settings.set_truncated)
        return buffers.to_tensordict(settings.set_truncated)

    def _step(
        self,
        t: int,
        buf: BatchBuffers,
        settings: CollectSettings,
        random: bool,
        timings: np.ndarray | None,
    ) -> None:
        obs = buf.policy_input(t)
        extras: dict[str, torch.Tensor]
        start = time.perf_counter()
        if random:
            version = self.models.policy_version(settings.model_id)
            action, extras = self._random.sample_compact(self.num_slots), {}
        else:
            version, action, extras = self.models.act_compact(settings.model_id, obs)
        acted = time.perf_counter()
        buf.versions[t] = version
        buf.record_policy(t, action, extras)
        buf.traj_ids[:, t] = self._traj_ids
        env_action = self.models.action_codec.to_env(action)
        stepping = time.perf_counter()
        next_obs, reward, terminated, truncated, info = step_pool(
            self._pool, env_action, self.config.step_timeout, env=self.env_id
        )
        if timings is not None:
            timings[t] = (acted - start, time.perf_counter() - stepping)
        buf.obs[:, t + 1] = next_obs
        buf.reward[:, t] = reward
        ended = terminated | truncated  # gymnasium already reset these (SAME_STEP)
        done = ended
        if buf.step_count is not None:
            buf.step_count[:, t] = self._step_count
            self._step_count += 1
            limit = self._step_count >= settings.max_frames_per_traj
            if np.count_nonzero(limit):
                truncated = truncated | limit
                done = ended | limit
                self._cut(t, buf, limit & ~ended)
        buf.terminated[:, t] = terminated
        buf.truncated[:, t] = truncated
        if np.count_nonzero(done):  # 0.2 us where done.any() takes 1 us, every step
            self._end_trajectories(t, buf, ended, done, info)

    def _cut(self, t: int, buf: BatchBuffers, envs: np.ndarray) -> None:
        """Envs that reached max_frames_per_traj: keep their final obs and reset them."""
        if not envs.any():
            return
        for env in np.flatnonzero(envs):
            buf.final_obs.append((int(env), t, buf.obs[env, t + 1].copy()))
        reset_obs = reset_pool(self._pool, self.config.step_timeout, mask=envs, env=self.env_id)
        buf.obs[envs, t + 1] = reset_obs[envs]

    def _end_trajectories(
        self, t: int, buf: BatchBuffers, ended: np.ndarray, done: np.ndarray, info: dict[str, Any]
    ) -> None:
        """Record final observations of auto-reset envs; give every done env a new traj id."""
        if np.count_nonzero(ended):
            final = info["final_obs"]
            for env in np.flatnonzero(ended):
                buf.final_obs.append((int(env), t, np.asarray(final[env])))
        self._traj_ids[done] = self._traj.take(int(done.sum()))
        self._step_count[done] = 0

    def _reset(self, seeds: list[int] | None) -> None:
        """Reset every env: fresh observations, new traj ids, step counts at 0."""
        try:
            obs = reset_pool(self._pool, self.config.step_timeout, seed=seeds, env=self.env_id)
        except RlfleetError:
            kill_pool(self._pool)  # as after a failed step
            self._pool_broken = True
            raise
        self._obs = np.array(obs, copy=True)
        self._needs_reset, self._fresh = False, True
        self._traj_ids = self._traj.take(self.num_slots)
        self._step_count = np.zeros(self.num_slots, dtype=np.int64)

    def _ensure_pool(self) -> None:
        """Rebuild a failed pool, or reset the envs a failed batch left mid-way."""
        if self._pool_broken:
            close_pool(self._pool, force=True)
            try:
                self._pool = make_env_pool(self.config)
            except Exception as exc:  # the factory that built the first pool fails now
                raise EnvError.of(self.env_id, exc) from exc
            self._pool_broken = False
            self._needs_reset = True
        if self._needs_reset:
            self._reset(seeds=None)

    def _seed(self, seed: int, static_seed: bool) -> int:
        """Seed the envs (each is reset with its seed), torch and numpy; chain like TorchRL.

        Env ``i`` gets ``seed_i``: ``seed_0 = seed`` and ``seed_{i+1} = derive_seed(seed_i)``
        (every env gets ``seed`` when ``static_seed``). Every env is reset, so new
        trajectories start. Returns the seed for the next actor: ``derive_seed`` of the
        last env's seed, or ``seed`` when ``static_seed``.
        """
        seeds, current = [], seed
        for _ in range(self.num_slots):
            seeds.append(current)
            if not static_seed:
                current = derive_seed(current)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        if self._pool_broken:
            self._ensure_pool()
        self._reset(seeds=seeds)
        return current

    def _restored(self) -> None:
        self._traj_ids = self._traj.take(self.num_slots)

    def _release_now(self) -> int:
        """SIGKILL the env pool's subprocesses; returns how many lived."""
        return kill_pool(self._pool)

    def _release(self) -> None:
        """Close the env pool and reap its subprocesses."""
        close_pool(self._pool, force=self._pool_broken)
