"""What every collection core shares: lock, counters, trajectory ids, state, describe and close.

:class:`CoreBase` is the opening of every core: it checks the config, draws the
epoch, holds the lock that the collection thread takes, the frame and batch
counters, the fleet-unique trajectory ids (:class:`TrajIds`), the state dict of
GetState/LoadState (``actor_service._core._state``), ``describe`` and the close that
leaves every later call raising :class:`~common.errors.ClosedError`. A kind of
core (``env``, ``torchrl``, ``llm``) is one subclass in its own module that builds its models
and says how it configures, collects and seeds.
"""

from __future__ import annotations

import abc
import secrets
import threading
from typing import Any, ClassVar, Self

import gymnasium
import torch
from tensordict import TensorDict

import common
from actor_service._config import ActorConfig
from actor_service._core._identity import ActorIdentity, draw_epoch
from actor_service._core._placement import check_placement
from actor_service._core._protocol import BatchRecorder, CoreModels
from actor_service._core._state import core_counters, core_state
from common.config import CollectSettings, check_seed
from common.errors import ClosedError, SessionStateError
from common.packets.folding import FoldedBatch
from common.traj_ids import TrajIds

__all__ = ["CoreBase", "check_abandoned", "describe_models"]


def check_abandoned(abandon: threading.Event | None, done: int, steps: int) -> None:
    """Stop a batch whose session ended (``abandon`` set) after ``done`` of its ``steps``.

    Raises:
        SessionStateError: The batch was abandoned; nothing of it is kept.
    """
    if abandon is not None and abandon.is_set():
        raise SessionStateError(f"batch abandoned after {done} of {steps} steps: its session ended")


def describe_models(
    models: CoreModels,
) -> dict[str, tuple[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]]:
    """``ActorIdentity.models`` of a core's models: version and parameters by model id."""
    return {
        mid: (models.policy_version(mid), models.parameters_info(mid)) for mid in models.model_ids
    }


class CoreBase(abc.ABC):
    """The shared part of every collection core (see the module docstring).

    A subclass sets :attr:`models`, :attr:`env_id` and :attr:`backend` in its
    constructor (after this one) and implements ``configure``, ``collect_batch``
    and ``_seed``; it may override ``_restored`` (after ``load_state_dict``),
    ``_release`` (what ``close`` frees) and ``_release_now`` (what ``force_close``
    kills).

    Thread-compatible: one thread collects; others may call ``describe`` and push
    weights through ``models``; ``force_close`` may come from any thread.

    Args:
        config: The actor's settings.
        metrics: Where the core counts its batches; None counts nothing.

    Attributes:
        kind: The ``ActorConfig.kind`` the subclass serves.
        config: The actor's settings.
        worker_id: The actor's id in the fleet.
        epoch: Random 63-bit, nonzero, drawn from the OS at each start.
        num_slots: Trajectories run side by side (``config.num_envs``).
        device: Where the models run.
        frames: Frames collected so far (restored by ``load_state_dict``).
        batches: Batches collected so far.
        env_id: What the core collects from (``ActorIdentity.env_id``).
        backend: How its slots run (``ActorIdentity.backend``).
        policy: The model spec ``describe`` reports (empty unless the kind reports one).
        observation_space: The single-slot observation space, or None.
        action_space: The single-slot action space, or None.
        state_sections: The keys the kind adds to the base state (``load_state_dict``
            refuses others).

    Raises:
        TypeError: ``config`` is not an ``ActorConfig``.
    """

    kind: ClassVar[str]
    state_sections: ClassVar[frozenset[str]] = frozenset()
    models: CoreModels
    env_id: str
    backend: str
    policy: str = ""
    observation_space: gymnasium.Space | None = None
    action_space: gymnasium.Space | None = None

    def __init__(self, config: ActorConfig, metrics: BatchRecorder | None = None) -> None:
        if not isinstance(config, ActorConfig):
            raise TypeError(f"config must be an ActorConfig, got {type(config).__name__}")
        self.config = config
        self._metrics = metrics
        self.worker_id = config.worker_id
        self.epoch = draw_epoch()
        self.num_slots = config.num_envs
        self.device = torch.device(config.device)
        self.frames = self.batches = 0
        self._settings: CollectSettings | None = None
        self._closed = False
        self._lock = threading.RLock()
        self._traj = TrajIds(config.worker_id, self.epoch)
        #: The seed the subclass seeds itself with once built (``config.seed`` or random).
        self._first_seed = config.seed if config.seed is not None else secrets.randbits(32)
        torch.set_num_threads(config.torch_threads)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def describe(self) -> ActorIdentity:
        """A snapshot of what this actor is (safe from any thread)."""
        return ActorIdentity(
            worker_id=self.worker_id,
            epoch=self.epoch,
            env_id=self.env_id,
            observation_space=self.observation_space,
            action_space=self.action_space,
            models=describe_models(self.models),
            num_slots=self.num_slots,
            backend=self.backend,
            device=str(self.device),
            software_version=common.__version__,
            kind=self.kind,
            policy=self.policy,
        )

    @property
    def env_device(self) -> str:
        """Where the envs step: gymnasium envs, and the TorchRL envs hosted so far, on the CPU."""
        return "cpu"

    def check(self, settings: CollectSettings) -> None:
        """Refuse settings this actor cannot serve (as :meth:`place`, :meth:`configure`).

        It changes nothing, and is safe beside a running batch (it reads what is fixed at
        start): a session's settings are checked before the session may end another (a
        take-over).

        Raises:
            PlacementError, UnknownModelError, ValueError, TypeError: As :meth:`place` and
                :meth:`configure` raise them.
        """
        self._check_settings_type(settings)
        self._check_placement(settings)
        self._check_settings(settings)

    def place(self, settings: CollectSettings) -> None:
        """Refuse a session asking for other devices or CUDA graphs; compile its policy or not.

        Called on the collection thread before :meth:`configure`.

        Raises:
            PlacementError: As :func:`~actor_service._core._placement.check_placement`, or a
                compiled policy asked of a model that cannot be compiled.
            UnknownModelError: ``settings.model_id`` is not registered.
        """
        self._check_placement(settings)
        self.models.use_compiled(settings.model_id, settings.compile_policy)

    def _check_placement(self, settings: CollectSettings) -> None:
        check_placement(
            settings,
            worker_id=self.worker_id,
            policy_device=self.device,
            env_device=self.env_device,
        )
        self.models.check_compilable(settings.model_id, settings.compile_policy)

    @abc.abstractmethod
    def configure(self, settings: CollectSettings) -> None:
        """Validate (:meth:`_check_settings`) and apply collection settings for the next batches."""

    @abc.abstractmethod
    def _check_settings(self, settings: CollectSettings) -> None:
        """Refuse ``settings`` this kind cannot collect with; change nothing (any thread)."""

    @abc.abstractmethod
    def start_anew(self) -> None:
        """A new collector's session begins (not a resumed one): trajectories start anew.

        Envs in the middle of a trajectory are reset before its first batch, as a new
        TorchRL collector resets its env; envs just reset (seeded) are left as they are.
        """

    @abc.abstractmethod
    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict | FoldedBatch:
        """Collect one batch (blocking); ``abandon`` set from another thread gives it up."""

    @staticmethod
    def _check_settings_type(settings: object) -> None:
        if not isinstance(settings, CollectSettings):
            raise TypeError(f"settings must be a CollectSettings, got {type(settings).__name__}")

    def _configured(self) -> CollectSettings:
        """The settings in force, once the core is open and configured (call under the lock).

        Raises:
            ClosedError: The core is closed.
            SessionStateError: ``configure`` was never called.
        """
        self._check_open()
        if self._settings is None:
            raise SessionStateError("configure() the core before collect_batch()")
        return self._settings

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"actor {self.worker_id}'s {self.kind} collection core is closed")

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the core between two batches; how each kind seeds and chains: ``_seed``.

        Args:
            seed: A non-negative int below 2**64.
            static_seed: Give every slot ``seed`` as is.

        Returns:
            The seed for the next actor.

        Raises:
            ValueError: ``seed`` is not an int in ``[0, 2**64)``.
            ClosedError: The core is closed.
        """
        check_seed(seed)
        with self._lock:
            self._check_open()
            return self._seed(seed, static_seed)

    @abc.abstractmethod
    def _seed(self, seed: int, static_seed: bool) -> int:
        """Seed the slots (under the lock, the core open); return the next actor's seed."""

    def state_dict(self) -> dict[str, Any]:
        """Weights, versions and counters: ``models``, ``frames``, ``batches``, ``traj_counter``."""
        with self._lock:
            return core_state(
                self.models.state_dict(), self.frames, self.batches, self._traj.counter
            )

    def state_tensors(self) -> int:
        """How many tensors :meth:`state_dict` holds: every model's weights (and a kind's own).

        A state a peer loads holds no more than these and a few plain values' worth.
        """
        models = self.models
        return sum(len(models.parameters_info(m)) for m in models.model_ids)

    def load_state_dict(
        self, state: dict[str, Any], *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore a :meth:`state_dict`, all or nothing; trajectories in flight get new ids.

        Every part (counters in int64 range, every model's version and weights)
        is validated before any is applied.

        Args:
            state: What :meth:`state_dict` returned (possibly from another actor).
            allow_rollback: Accept policy versions older than those in force.

        Returns:
            ``{model_id: (old_version, new_version)}``.

        Raises:
            WeightsError: A malformed state, a number out of range or weights that do not fit.
            UnknownModelError: The state names a model this actor lacks.
            StaleVersionError: A version would go back and ``allow_rollback`` is false.
            ClosedError: The core is closed.
        """
        counters = core_counters(state, self.state_sections)
        with self._lock:
            self._check_open()
            changes = self.models.load_state_dict(
                state.get("models"), allow_rollback=allow_rollback
            )
            self.frames, self.batches = counters["frames"], counters["batches"]
            # Never back: ids this epoch already gave stay given (a checkpoint of this life).
            self._traj.counter = max(self._traj.counter, counters["traj_counter"])
            self._restored()
            return changes

    def _restored(self) -> None:  # noqa: B027  # an optional hook, empty by default
        """After a restore, under the lock: give the trajectories in flight new ids."""

    def force_close(self) -> int:
        """End the core now, without the lock; returns how many child processes it killed.

        For a shutdown whose collection thread is stuck (a hung env step): :meth:`close`
        would wait for it. The core is unusable afterwards.
        """
        self._closed = True
        return self._release_now()

    def _release_now(self) -> int:
        """What ``force_close`` kills (SIGKILL, no lock); how many processes lived."""
        return 0

    def close(self) -> None:
        """Release what the core holds (env subprocesses, ...); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    def _release(self) -> None:  # noqa: B027  # an optional hook, empty by default
        """What ``close`` frees, under the lock."""
