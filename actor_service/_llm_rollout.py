"""The LLM actor's collection core: chat slots + task + language model → batches of dialog turns.

:class:`LLMRolloutWorker` has no gRPC in it and the surface of the env actor's
``RolloutWorker`` (``configure``, ``collect_batch``, ``set_seed``, ``describe``,
``state_dict``/``load_state_dict``, ``models``, ``close``), so the same server,
sessions, credits and pushes serve it. Its semantics are TorchRL's ``LLMCollector``:

* steps mode: every slot runs one turn per step, ``T = frames_per_batch / num_envs``
  steps, batch ``[num_envs, T]``; a slot whose dialog ended starts a new one at the
  next step; dialogs in progress carry over to the next batch;
* ``yield_completed_trajectories``: whole dialogs, concatenated, ``[sum T_i]``, until at
  least ``frames_per_batch`` turns; ``yield_only_last_steps``: the last turn of each
  dialog, ``[n]``, until at least ``frames_per_batch`` rows (the dropped turns count in
  ``last_batch_frames``, as TorchRL 0.14.1 counts them toward the budget).

Groups: slots ``[gG, (g+1)G)`` form block ``g``; slots of a block that start a dialog
together share one problem and one ``("collector", "group_id")``. In the trajectory
modes a block starts a group only when all its slots are idle, and a batch holds whole
groups only, so a group is never split.
"""

from __future__ import annotations

import collections
import random
import secrets
import threading
from typing import Any

import torch
from tensordict import TensorDict

import common
from actor_service._batch import TrajIds
from actor_service._config import ActorConfig
from actor_service._identity import ActorIdentity, describe_models, draw_epoch
from actor_service._llm_models import LLMModels
from actor_service._llm_turns import Dialog, DialogEngine, Turn, pack_turns
from actor_service._state import core_counters, core_state
from common.config import CollectSettings, check_seed
from common.errors import SessionStateError
from common.llm import LLMSettings, build_task

__all__ = ["LLMRolloutWorker"]


class LLMRolloutWorker:
    """Chat slots, a task and a causal LM → batches of dialog turns (see the module docstring).

    Args:
        config: The actor's settings (``kind="llm"``, ``task``, the ``policy`` model spec).

    Attributes:
        worker_id: The actor's id in the fleet.
        epoch: Random 63-bit, nonzero, drawn at each start.
        num_envs: Number of chat slots.
        models: The :class:`LLMModels` (pushes go through it).
        frames: Dialog turns collected so far (dropped ones included).
        batches: Batches collected so far.
        dropped_dialogs: Dialogs abandoned in progress (``reset_at_each_iter``, reseeding).
        last_batch_frames: Turns the last batch accounts for.

    Raises:
        ValueError: A bad setting, task or model spec.
    """

    kind = "llm"

    def __init__(self, config: ActorConfig) -> None:
        if not isinstance(config, ActorConfig):
            raise TypeError(f"config must be an ActorConfig, got {type(config).__name__}")
        self.config = config
        self.worker_id = config.worker_id
        self.epoch = draw_epoch()
        self.num_envs = config.num_envs
        self.device = torch.device(config.device)
        self.frames = self.batches = self.dropped_dialogs = self.last_batch_frames = 0
        self._settings: CollectSettings | None = None
        self._llm = LLMSettings()
        self._closed = False
        self._abandon: threading.Event | None = None
        self._lock = threading.RLock()
        torch.set_num_threads(config.torch_threads)
        spec = config.models[0]
        self.models = LLMModels(spec.factory, spec.kwargs, self.device, config.lora)
        self.engine = DialogEngine(self.models, build_task(config.task, **config.task_kwargs))
        self._traj = TrajIds(config.worker_id, self.epoch)
        self._groups = TrajIds(config.worker_id, self.epoch)
        self._slots: list[Dialog | None] = [None] * self.num_envs
        self._partial: list[list[Turn]] = [[] for _ in range(self.num_envs)]
        self._ready: collections.deque[list[list[Turn]]] = collections.deque()
        self.set_seed(config.seed if config.seed is not None else secrets.randbits(32))

    def __enter__(self) -> LLMRolloutWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def describe(self) -> ActorIdentity:
        """A snapshot of what this actor is (safe from any thread)."""
        return ActorIdentity(
            worker_id=self.worker_id,
            epoch=self.epoch,
            env_id=self.config.task,
            observation_space=None,
            action_space=None,
            models=describe_models(self.models),
            num_envs=self.num_envs,
            env_backend="llm",
            device=str(self.device),
            software_version=common.__version__,
            kind="llm",
            policy=self.models.spec,
        )

    def configure(self, settings: CollectSettings) -> None:
        """Validate settings against this actor; a change of LLM settings restarts the dialogs.

        Raises:
            ValueError: No LLM settings, a turn count the slots cannot split, a group
                size that does not divide the slots, generation settings beyond this
                actor's caps or vocabulary.
        """
        if not isinstance(settings, CollectSettings):
            raise TypeError(f"settings must be a CollectSettings, got {type(settings).__name__}")
        llm = settings.llm
        if llm is None:
            raise ValueError("this is an LLM actor: open the session with LLM settings")
        if not llm.trajectories and settings.frames_per_batch % self.num_envs:
            raise ValueError(
                f"dialog_turns_per_batch={settings.frames_per_batch} is not a multiple of "
                f"num_envs={self.num_envs}"
            )
        if self.num_envs % llm.group_size:
            raise ValueError(
                f"group_size={llm.group_size} does not divide num_envs={self.num_envs}"
            )
        self._check_generation(llm)
        self.models.policy_version(settings.model_id)
        with self._lock:
            if llm != self._llm:
                self._restart()
            self._settings, self._llm = settings, llm

    def _check_generation(self, llm: LLMSettings) -> None:
        generation, cap = llm.generation, self.config.max_new_tokens_cap
        if generation.max_new_tokens > cap:
            raise ValueError(
                f"max_new_tokens={generation.max_new_tokens} is above this actor's cap {cap}"
            )
        if generation.top_k > self.engine.vocab:
            raise ValueError(
                f"top_k={generation.top_k} exceeds the vocabulary ({self.engine.vocab})"
            )
        bad = [t for t in generation.stop_token_ids if t >= self.engine.vocab]
        if bad:
            raise ValueError(
                f"stop_token_ids {bad} are outside the vocabulary of {self.engine.vocab}"
            )

    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict:
        """Collect one batch of dialog turns (blocking).

        Args:
            abandon: Set from another thread to give the batch up before its next turn.

        Raises:
            SessionStateError: Not configured, closed, or abandoned.
        """
        self._abandon = abandon
        with self._lock:
            self._check_open()
            settings = self._settings
            if settings is None:
                raise SessionStateError("configure() the worker before collect_batch()")
            if settings.reset_at_each_iter:
                self._restart()
            if self._llm.trajectories:
                turns, frames = self._trajectories(settings.frames_per_batch)
                shape: tuple[int, ...] = (len(turns),)
            else:
                turns = self._steps(settings.frames_per_batch // self.num_envs)
                frames, shape = len(turns), (self.num_envs, len(turns) // self.num_envs)
            self.frames += frames
            self.batches += 1
            self.last_batch_frames = frames
            return pack_turns(
                turns, shape, self.engine.pad_id, token_versions=self._llm.token_versions
            )

    def _check_abandon(self) -> None:
        if self._abandon is not None and self._abandon.is_set():
            raise SessionStateError("the batch was abandoned")

    def _max_turns(self) -> int:
        return self._llm.max_turns or self.engine.task.max_turns

    def _steps(self, steps: int) -> list[Turn]:
        grid: list[list[Turn]] = [[] for _ in range(self.num_envs)]
        for _ in range(steps):
            self._check_abandon()
            self._refill(whole_blocks=False)
            dialogs = [d for d in self._slots if d is not None]
            turns = self.engine.run(dialogs, self._llm.generation, self._max_turns(), self._gen)
            for slot, turn in enumerate(turns):
                grid[slot].append(turn)
                if turn.done:
                    self._slots[slot] = None
        return [turn for row in grid for turn in row]

    def _trajectories(self, wanted: int) -> tuple[list[Turn], int]:
        last_only = self._llm.yield_only_last_steps
        while sum(self._rows(group, last_only) for group in self._ready) < wanted:
            self._check_abandon()
            self._refill(whole_blocks=True)
            active = [s for s, d in enumerate(self._slots) if d is not None]
            dialogs = [self._slots[s] for s in active]
            turns = self.engine.run(dialogs, self._llm.generation, self._max_turns(), self._gen)  # type: ignore[arg-type]
            for slot, turn in zip(active, turns, strict=True):
                self._partial[slot].append(turn)
                if turn.done:
                    self._slots[slot] = None
            self._collect_groups()
        out: list[Turn] = []
        frames = 0
        while len(out) < wanted:
            for dialog in self._ready.popleft():
                out.extend(dialog[-1:] if last_only else dialog)
                frames += len(dialog)
        return out, frames

    @staticmethod
    def _rows(group: list[list[Turn]], last_only: bool) -> int:
        return len(group) if last_only else sum(len(d) for d in group)

    def _collect_groups(self) -> None:
        size = self._llm.group_size
        for start in range(0, self.num_envs, size):
            block = range(start, start + size)
            if any(self._slots[s] is not None or not self._partial[s] for s in block):
                continue
            self._ready.append([self._partial[s] for s in block])
            for s in block:
                self._partial[s] = []

    def _refill(self, *, whole_blocks: bool) -> None:
        """Start dialogs in idle slots; a block's slots starting together share a problem."""
        size = self._llm.group_size
        for start in range(0, self.num_envs, size):
            idle = [s for s in range(start, start + size) if self._slots[s] is None]
            if not idle or (whole_blocks and len(idle) < size):
                continue
            if whole_blocks and any(self._partial[s] for s in idle):
                continue  # the block's finished group is not collected yet
            problem = self.engine.sample(self._rng)
            group = int(self._groups.take(1)[0])
            for slot, traj in zip(idle, self._traj.take(len(idle)).tolist(), strict=True):
                self._slots[slot] = self.engine.new_dialog(problem, int(traj), group)

    def _restart(self) -> None:
        """Abandon every dialog in progress (counted in ``dropped_dialogs``)."""
        in_progress = {id(d) for d in self._slots if d is not None}
        self.dropped_dialogs += len(in_progress)
        self._slots = [None] * self.num_envs
        self._partial = [[] for _ in range(self.num_envs)]
        self._ready.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionStateError(f"actor {self.worker_id}'s LLM worker is closed")

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed problem sampling and token sampling; every dialog restarts.

        Returns:
            The seed for the next actor (``seed + 1``, or ``seed`` when ``static_seed``).

        Raises:
            ValueError: ``seed`` is not an int in ``[0, 2**64)``.
        """
        check_seed(seed)
        with self._lock:
            self._check_open()
            self._rng = random.Random(seed)
            self._gen = torch.Generator().manual_seed(seed % 2**63)
            self._restart()
            return seed if static_seed else (seed + 1) % 2**64

    def state_dict(self) -> dict[str, Any]:
        """Weights, versions and counters: ``models``, ``frames``, ``batches``, ``traj_counter``."""
        with self._lock:
            return core_state(
                self.models.state_dict(), self.frames, self.batches, self._traj.counter
            )

    def load_state_dict(
        self, state: dict[str, Any], *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore a :meth:`state_dict`, all or nothing; dialogs in progress restart.

        Returns:
            ``{"policy": (old_version, new_version)}``.

        Raises:
            WeightsError: A malformed state or weights that do not fit.
            StaleVersionError: The version would go back and ``allow_rollback`` is false.
        """
        counters = core_counters(state)
        with self._lock:
            self._check_open()
            changes = self.models.load_state_dict(
                state.get("models"), allow_rollback=allow_rollback
            )
            self.frames, self.batches = counters["frames"], counters["batches"]
            self._traj.counter = counters["traj_counter"]
            self._restart()
            return changes

    def kill_pool(self) -> int:
        """No subprocesses to kill (the model runs in process): mark closed; returns 0."""
        self._closed = True
        return 0

    def close(self) -> None:
        """Mark the worker closed; idempotent."""
        with self._lock:
            self._closed = True
