"""What the serving layer uses of a collection core, of its models, and what a core counts into.

:class:`CollectionCore` is the whole surface the runtime, servicer and ``Collect``
stream use of a core, whatever it collects from: an env pool or LLM chat slots
(``CoreBase`` and its subclasses are the real ones). :class:`CoreModels` is what
they use of its models (pushes, versions, describe). :class:`BatchRecorder` is what
a core counts its batches into (the actor's metrics), so no core depends on the
serving layer above it. The words are neutral: *slots* run trajectories side by
side, ``force_close`` ends a core whose collection thread is stuck.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
from tensordict import TensorDict

from actor_service._core._identity import ActorIdentity
from actor_service._core._swap import StagedParts, Swap
from common.config import CollectSettings, CompileSettings
from common.packets.folding import FoldedBatch
from common.weights import Delta, PushForm

__all__ = ["BatchRecorder", "CollectionCore", "CoreModels"]


class CoreModels(Protocol):
    """What the serving layer and the cores' base use of a core's models.

    ``ModelRegistry`` (env actors) and ``LLMModels`` (LLM actors) are the real ones.
    """

    #: ``(r, alpha)`` of the LoRA adapter the models are wrapped in; None without one.
    adapter: tuple[int, int] | None

    @property
    def model_ids(self) -> tuple[str, ...]: ...
    def policy_version(self, model_id: str) -> int: ...
    def parameters_info(self, model_id: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]: ...
    def load_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> int: ...
    def swap_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> Swap: ...
    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap: ...
    def validate(
        self, model_id: str, state: object, form: PushForm | None = None
    ) -> dict[str, torch.Tensor]: ...
    def stage_delta(self, model_id: str, delta: Delta) -> tuple[dict[str, torch.Tensor], Delta]: ...
    def swap_parts(self, model_id: str, version: int, parts: StagedParts) -> Swap: ...
    def use_compiled(self, model_id: str, settings: CompileSettings | None) -> None: ...
    def check_compilable(self, model_id: str, settings: CompileSettings | None) -> None: ...
    def state_dict(self) -> dict[str, dict]: ...
    def load_state_dict(
        self, state: object, *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]: ...


class BatchRecorder(Protocol):
    """Where a core counts its batches (``ActorMetrics``)."""

    def record_batch(self, frames: int, step_seconds: np.ndarray, seconds: float) -> None:
        """Count one batch: its frames, ``[steps, 2]`` forward/step seconds, its whole time."""
        ...


class CollectionCore(Protocol):
    """What the serving layer uses of a collection core.

    One thread collects (``configure``, ``collect_batch``, ``set_seed``,
    ``load_state_dict``, ``close``); others may call ``describe`` and push weights
    through ``models`` at any time; ``force_close`` may come from any thread.

    Attributes:
        epoch: Random 63-bit, nonzero, drawn at each start.
        num_slots: Trajectories run side by side (envs of the pool, chat slots).
        frames: Frames collected so far.
    """

    epoch: int
    num_slots: int
    frames: int

    @property
    def models(self) -> CoreModels: ...

    def describe(self) -> ActorIdentity: ...
    def check(self, settings: CollectSettings) -> None: ...
    def place(self, settings: CollectSettings) -> None: ...
    def configure(self, settings: CollectSettings) -> None: ...
    def start_anew(self) -> None: ...
    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict | FoldedBatch: ...
    def set_seed(self, seed: int, static_seed: bool = False) -> int: ...
    def state_dict(self) -> dict[str, Any]: ...
    def state_tensors(self) -> int: ...
    def load_state_dict(
        self, state: dict[str, Any], *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]: ...
    def force_close(self) -> int: ...
    def close(self) -> None: ...
