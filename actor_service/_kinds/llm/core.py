"""The LLM actor's collection core: chat slots + task + language model → batches of dialog turns.

:class:`LLMCore` has no gRPC in it and shares the env core's base (``CoreBase``:
``describe``, ``state_dict``/``load_state_dict``, ``close``) and surface
(``configure``, ``collect_batch``, ``set_seed``, ``models``), so the same server,
sessions, credits and pushes serve it. Its slots are chat slots. Its semantics are
TorchRL's ``LLMCollector``:

* steps mode: every slot runs one turn per step, ``T = frames_per_batch / num_envs``
  steps, batch ``[num_envs, T]``; a slot whose dialog ended starts a new one at the
  next step; dialogs in progress carry over to the next batch;
* ``yield_completed_trajectories``: whole dialogs, concatenated, ``[sum T_i]``, until at
  least ``frames_per_batch`` turns; ``yield_only_last_steps``: the last turn of each
  dialog, ``[n]``, until at least ``frames_per_batch`` rows (the dropped turns count in
  ``last_batch_frames``, as TorchRL 0.14.1 counts them toward the budget).

A turn of every active slot is decoded by the engine ``config.engine`` names: rlfleet's
decode loop (``LLMModels``) or vLLM (``VLLMModels``, ``actor_service._kinds.llm.vllm_models``); both
give the same :class:`common.llm.Generation`, so what follows holds for either.

Groups: slots ``[gG, (g+1)G)`` form block ``g``; slots of a block that start a dialog
together share one problem and one ``("collector", "group_id")``. In the trajectory
modes a block starts a group only when all its slots are idle, and a batch holds whole
groups only, so a group is never split.
"""

from __future__ import annotations

import collections
import random
import threading

import torch
from tensordict import TensorDict

from actor_service._config import ActorConfig
from actor_service._core._base import CoreBase
from actor_service._core._protocol import BatchRecorder
from actor_service._kinds.llm.models import LLMModels
from actor_service._kinds.llm.turns import Dialog, DialogEngine, PackedSize, Turn, pack_turns
from common.config import MAX_FRAMES_PER_BATCH, CollectSettings
from common.errors import PacketTooLargeError, SessionStateError
from common.llm import LLMSettings, build_task
from common.packets import DEFAULT_LIMITS
from common.traj_ids import TrajIds

__all__ = ["LLMCore"]


class LLMCore(CoreBase):
    """Chat slots, a task and a causal LM → batches of dialog turns (see the module docstring).

    Args:
        config: The actor's settings (``kind="llm"``, ``task``, the ``policy`` model spec).
        metrics: Accepted like every core's; an LLM core counts no batches into it.

    Attributes:
        num_slots: Number of chat slots (``config.num_envs``).
        models: The :class:`LLMModels` (pushes go through it).
        frames: Dialog turns collected so far (dropped ones included).
        dropped_dialogs: Dialogs abandoned in progress (``reset_at_each_iter``, reseeding).
        last_batch_frames: Turns the last batch accounts for.

    The rest (``worker_id``, ``epoch``, ``batches``, ...) is :class:`CoreBase`'s.

    Raises:
        ValueError: A bad setting, task or model spec.
    """

    kind = "llm"
    models: LLMModels

    def __init__(self, config: ActorConfig, metrics: BatchRecorder | None = None) -> None:
        super().__init__(config, metrics)
        self.env_id = config.task
        self.backend = "llm"
        self.dropped_dialogs = self.last_batch_frames = 0
        self._llm = LLMSettings()
        self._abandon: threading.Event | None = None
        self.models = _build_models(config, self.device, self._first_seed)
        if config.engine == "vllm":
            self.backend = "vllm"
        self.policy = self.models.spec
        task = build_task(config.task, **config.task_kwargs)
        self.engine = DialogEngine(self.models, task, config.task)
        self._groups = TrajIds(config.worker_id, self.epoch)
        self._slots: list[Dialog | None] = [None] * self.num_slots
        self._partial: list[list[Turn]] = [[] for _ in range(self.num_slots)]
        self._ready: collections.deque[list[list[Turn]]] = collections.deque()
        self._stepped = False  # the batch of steps under way ran a turn (lost if it fails)
        self.set_seed(self._first_seed)

    def start_anew(self) -> None:
        """Dialogs under way go on: a group is never cut (a change of settings restarts them)."""

    def configure(self, settings: CollectSettings) -> None:
        """Validate settings against this actor; a change of LLM settings restarts the dialogs.

        Raises:
            ValueError: No LLM settings, a turn count the slots cannot split, a group
                size that does not divide the slots, generation settings beyond this
                actor's caps or vocabulary, a learner's vocabulary smaller than the ids
                this actor's model draws from.
        """
        self._check_settings_type(settings)
        self._check_settings(settings)
        llm = settings.llm
        assert llm is not None  # checked
        with self._lock:
            if llm != self._llm:
                self._restart()
            self._settings, self._llm = settings, llm
            self.models.plan_generation(llm.generation.max_new_tokens)

    def _check_settings(self, settings: CollectSettings) -> None:
        llm = settings.llm
        if llm is None:
            raise ValueError("this is an LLM actor: open the session with LLM settings")
        if settings.frames_per_batch > MAX_FRAMES_PER_BATCH:
            raise ValueError(
                f"dialog_turns_per_batch={settings.frames_per_batch} is above the "
                f"{MAX_FRAMES_PER_BATCH} dialog turns a batch may hold"
            )
        if not llm.trajectories and settings.frames_per_batch % self.num_slots:
            raise ValueError(
                f"dialog_turns_per_batch={settings.frames_per_batch} is not a multiple of "
                f"num_envs={self.num_slots}"
            )
        if self.num_slots % llm.group_size:
            raise ValueError(
                f"group_size={llm.group_size} does not divide num_envs={self.num_slots}"
            )
        self._check_generation(llm)
        if llm.vocab_size and self.models.token_ids > llm.vocab_size:
            raise ValueError(
                f"this actor's model draws from {self.models.token_ids} token ids, more than "
                f"the learner's vocab_size={llm.vocab_size}: its token ids would index past the "
                "learner's embedding (do the learner and this actor load the same model?)"
            )
        self.models.policy_version(settings.model_id)

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
        self.models.check_generation(generation)

    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict:
        """Collect one batch of dialog turns (blocking).

        Args:
            abandon: Set from another thread to give the batch up before its next turn.

        A batch that fails restarts every dialog under way, as an env actor resets its envs
        after a failed batch: a turn may have advanced some dialogs of its step and not
        others, and a batch of steps given up takes the turns it stepped with it. Only
        trajectories given up (abandoned) go on: their turns are held for the next batch.

        Raises:
            SessionStateError: Not configured, or abandoned.
            ClosedError: The core is closed.
            EnvError: The task raised.
        """
        self._abandon = abandon
        with self._lock:
            settings = self._configured()
            if settings.reset_at_each_iter:
                self._restart()
            try:
                turns, frames, shape = self._collect_turns(settings.frames_per_batch)
            except BaseException as exc:
                held = self._llm.trajectories or not self._stepped  # no turn lost with it
                if not (held and isinstance(exc, SessionStateError)):
                    self._restart()
                raise
            self.frames += frames
            self.batches += 1
            self.last_batch_frames = frames
            return pack_turns(
                turns, shape, self.engine.pad_id, token_versions=self._llm.token_versions
            )

    def _collect_turns(self, frames_per_batch: int) -> tuple[list[Turn], int, tuple[int, ...]]:
        """A batch's turns, the dialog turns it counts and its shape (under the lock)."""
        if self._llm.trajectories:
            turns, frames = self._trajectories(frames_per_batch)
            return turns, frames, (len(turns),)
        turns = self._steps(frames_per_batch // self.num_slots)
        return turns, len(turns), (self.num_slots, len(turns) // self.num_slots)

    def _check_abandon(self) -> None:
        if self._abandon is not None and self._abandon.is_set():
            raise SessionStateError("the batch was abandoned")

    def _max_turns(self) -> int:
        return self._llm.max_turns or self.engine.task.max_turns

    def _check_size(self, size: PackedSize, turns: list[Turn]) -> None:
        """Count ``turns`` into this batch's ``size``; refuse a batch past the packet cap.

        Raises:
            PacketTooLargeError: The batch would not fit the packet cap learners decode
                (every dialog restarts: what was held is dropped).
        """
        size.add(turns)
        cap = DEFAULT_LIMITS.max_packet_bytes
        if size.nbytes > cap:
            self._restart()
            raise PacketTooLargeError(
                f"a batch of dialog_turns_per_batch={self._configured().frames_per_batch} "
                f"holds more than the {cap}-byte packet cap allows ({size.rows} turns so "
                f"far, about {size.nbytes} bytes): ask for fewer dialog turns per batch"
            )

    def _steps(self, steps: int) -> list[Turn]:
        grid: list[list[Turn]] = [[] for _ in range(self.num_slots)]
        size = PackedSize()
        self._stepped = False
        for _ in range(steps):
            self._check_abandon()
            self._stepped = True
            self._refill(whole_blocks=False)
            dialogs = [d for d in self._slots if d is not None]
            turns = self.engine.run(dialogs, self._llm.generation, self._max_turns(), self._gen)
            self._check_size(size, turns)
            for slot, turn in enumerate(turns):
                grid[slot].append(turn)
                if turn.done:
                    self._slots[slot] = None
        return [turn for row in grid for turn in row]

    def _trajectories(self, wanted: int) -> tuple[list[Turn], int]:
        last_only = self._llm.yield_only_last_steps
        size = PackedSize()  # every turn held, as the dialogs of this batch are
        while sum(self._rows(group, last_only) for group in self._ready) < wanted:
            self._check_abandon()
            self._refill(whole_blocks=True)
            active = [s for s, d in enumerate(self._slots) if d is not None]
            dialogs = [self._slots[s] for s in active]
            turns = self.engine.run(dialogs, self._llm.generation, self._max_turns(), self._gen)  # type: ignore[arg-type]
            self._check_size(size, turns)
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
        for start in range(0, self.num_slots, size):
            block = range(start, start + size)
            if any(self._slots[s] is not None or not self._partial[s] for s in block):
                continue
            self._ready.append([self._partial[s] for s in block])
            for s in block:
                self._partial[s] = []

    def _refill(self, *, whole_blocks: bool) -> None:
        """Start dialogs in idle slots; a block's slots starting together share a problem."""
        size = self._llm.group_size
        for start in range(0, self.num_slots, size):
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
        self._slots = [None] * self.num_slots
        self._partial = [[] for _ in range(self.num_slots)]
        self._ready.clear()

    def _seed(self, seed: int, static_seed: bool) -> int:
        """Seed problem sampling and token sampling; every dialog restarts.

        Returns the seed for the next actor: ``seed + 1``, or ``seed`` when ``static_seed``.
        """
        self._rng = random.Random(seed)
        # On the model's device: tokens are drawn where the logits are.
        self._gen = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        self._restart()
        return seed if static_seed else (seed + 1) % 2**64

    def _restored(self) -> None:
        """Dialogs in progress restart after a restore."""
        self._restart()

    def _release(self) -> None:
        """Shut the engine down (vLLM's; the decode loop holds nothing more)."""
        self.models.close()


def _build_models(config: ActorConfig, device: torch.device, seed: int) -> LLMModels:
    """The model of ``config.engine``: our decode loop's, or one served by vLLM."""
    spec = config.models[0]
    if config.engine != "vllm":
        return LLMModels(spec.path, spec.kwargs, device, config.lora, decode=config.decode)
    from actor_service._kinds.llm.vllm_engine import VLLMOptions
    from actor_service._kinds.llm.vllm_models import VLLMModels

    options = VLLMOptions(
        config.gpu_memory_utilization, config.max_model_len, config.enable_prefix_caching
    )
    return VLLMModels(spec.path, spec.kwargs, device, options, seed, config.lora)
