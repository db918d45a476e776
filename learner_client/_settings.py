"""The learner's settings, grouped in frozen dataclasses, and the checks run at construction.

``GrpcCollector`` takes TorchRL's flat keyword arguments and turns them at once
into three groups, each validating and normalising its own fields in
``__post_init__``: :class:`BatchSettings` (how batches are assembled and
delivered), :class:`RolloutSettings` (what each actor session is asked to do,
sent as :class:`common.config.CollectSettings`) and :class:`ConnectionSettings`
(channels, deadlines, credits). Fleet-dependent checks (divisibility by the
number of actors and by each actor's env pool) live here too, so the rules a
user meets are in one place.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import secrets
import socket
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from tensordict import TensorDictBase

from common.config import (
    LEARNER_ID_METADATA,
    MAX_FRAMES_PER_BATCH,
    MAX_LEARNER_ID,
    TAKE_OVER_METADATA,
    CollectSettings,
    ExplorationType,
    as_int,
    check_actor_address,
    check_learner_id,
    check_model_id,
    check_no_env_settings,
    check_token,
    positive_timeout,
)
from common.errors import UnknownModelError
from common.llm import LLMSettings
from common.weights import CHECKSUMS
from learner_client._errors import EndlessCollectorError
from learner_client._members import FleetMember, check_kinds, check_one_env, check_unique
from learner_client._torchrl_compat import ActorPlacement

__all__ = [
    "DEFAULT_FULL_PUSH_EVERY",
    "MAX_STREAMS",
    "BatchSettings",
    "ConnectionSettings",
    "Postproc",
    "ReplayBufferLike",
    "RolloutSettings",
    "WeightPushSettings",
    "check_addresses",
    "check_fleet",
    "check_hooks",
    "normalize_cat_results",
    "normalize_exploration_type",
    "positive_int",
    "positive_timeout",
]


#: What TorchRL reads as false in ``RL_WARNINGS`` (its ``strtobool``).
_FALSE_WORDS = frozenset({"0", "false", "f", "n", "no", "off"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSettings:
    """How the learner assembles and delivers batches (validated and normalised at creation).

    No field has a default: ``GrpcCollector``'s signature is their one home.

    Attributes:
        frames_per_batch: Frames per yielded batch (sync: in total over the fleet).
        total_frames: Frames after which iteration stops; ``-1`` (or None) iterates forever.
        sync: One batch from every actor per iteration (True) or first ready, first served
            (False; None, TorchRL's ``Collector`` default, means False as there).
        prefetch: Batches each actor may collect ahead of the request. None means
            TorchRL's behaviour: 0 in sync mode (an actor collects a batch only when it is
            requested, so every batch after an update runs the new weights) and 1 in async
            mode (one batch ahead per actor). Sync collection with ``prefetch=N`` is
            off-policy by up to N batches; async needs at least 1.
        cat_results: ``"stack"`` (or None: ``[workers, envs, time]``) or ``0`` (concatenate
            on dim 0).
        allow_partial_batches: Sync only: proceed without actors that miss ``batch_timeout``.
        batch_timeout: Seconds a sync batch (or a stalled stream) may take.
        split_trajs: Batches hold zero-padded trajectories (sync rows are padded and
            concatenated); None (TorchRL's default) means False.
        update_after_each_batch: Push the last weights given after every batch.
        max_weight_update_interval: Push to a worker once more than this many of its batches
            were delivered since its last update; ``-1`` disables.
        llm: LLM actors' settings: batches are their padded form, checked and merged on
            dim 0 (with whole dialogs, any turn count per actor). None for env actors.

    Raises:
        ValueError: A value out of range (the message names it and the value).
        TypeError: A value of the wrong type.
    """

    frames_per_batch: int
    total_frames: int | None
    sync: bool | None
    cat_results: str | int | None
    allow_partial_batches: bool
    batch_timeout: float
    split_trajs: bool | None
    update_after_each_batch: bool
    max_weight_update_interval: int
    prefetch: int | None
    llm: LLMSettings | None

    def __post_init__(self) -> None:
        if self.llm is not None and not isinstance(self.llm, LLMSettings):
            raise TypeError(f"llm must be an LLMSettings or None, got {self.llm!r}")
        for name in ("sync", "split_trajs"):
            _set(self, name, _optional_flag(name, getattr(self, name)))
        for name in ("allow_partial_batches", "update_after_each_batch"):
            _flag(name, getattr(self, name))
        interval = as_int(self.max_weight_update_interval)
        if interval is None or interval < -1:
            raise ValueError(
                f"max_weight_update_interval must be an int >= -1, "
                f"got {self.max_weight_update_interval!r}"
            )
        _set(self, "max_weight_update_interval", interval)
        per_batch, total = self.count_names
        _set(self, "frames_per_batch", positive_int(per_batch, self.frames_per_batch))
        _set(self, "total_frames", _frames(total, self.total_frames, endless=True))
        self._warn_rounded_up()
        _set(self, "cat_results", normalize_cat_results(self.cat_results))
        _set(self, "batch_timeout", positive_timeout("batch_timeout", self.batch_timeout))
        _set(self, "prefetch", self._check_prefetch())

    def _warn_rounded_up(self) -> None:
        """TorchRL's warning when whole batches overshoot the budget (``RL_WARNINGS=0``: none)."""
        per_batch, total = self.count_names
        budget, size = _int(self.total_frames), self.frames_per_batch
        remainder = budget % size if budget > 0 else 0
        if remainder and os.environ.get("RL_WARNINGS", "1").lower() not in _FALSE_WORDS:
            warnings.warn(
                f"{total} ({budget}) is not exactly divisible by {per_batch} ({size}). This "
                f"means {size - remainder} additional frames will be collected. To silence this "
                "message, set the environment variable RL_WARNINGS to False.",
                UserWarning,
                stacklevel=5,
            )

    def _check_prefetch(self) -> int:
        if self.prefetch is None:
            return 0 if self.sync else 1
        prefetch = as_int(self.prefetch)
        if prefetch is None or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 or None, got {self.prefetch!r}")
        if not self.sync and prefetch == 0:
            raise ValueError(
                "prefetch=0 needs sync=True: async collection keeps at least one batch "
                "ahead per actor (TorchRL's MultiAsyncCollector does too)"
            )
        if self.sync and prefetch and self.auto_update_interval is not None:
            raise ValueError(
                f"prefetch={prefetch} collects rounds ahead of the automatic weight pushes "
                "(update_after_each_batch / max_weight_update_interval) that run before each "
                "round: use one or the other"
            )
        return prefetch

    @property
    def on_demand(self) -> bool:
        """Sync rounds collected only when requested: one credit per actor per round."""
        return bool(self.sync) and (self.prefetch == 0 or self.auto_update_interval is not None)

    @property
    def window(self) -> int:
        """Most batches per actor in flight or buffered (before the actor's own cap)."""
        return max(1, _int(self.prefetch))

    @property
    def endless(self) -> bool:
        """Whether iteration never stops on its own."""
        return _int(self.total_frames) < 0

    @property
    def auto_update_interval(self) -> int | None:
        """Batches a worker may deliver before an automatic push; None when off."""
        if self.update_after_each_batch:
            return 0
        if self.max_weight_update_interval >= 0:
            return self.max_weight_update_interval
        return None

    @property
    def count_names(self) -> tuple[str, str]:
        """The batch size's and the budget's names as the user gave them, for messages."""
        if self.llm is not None:
            return "dialog_turns_per_batch", "total_dialog_turns"
        return "frames_per_batch", "total_frames"

    def num_batches(self) -> int:
        """``ceil(total_frames / frames_per_batch)``, as TorchRL's ``__len__``.

        Raises:
            EndlessCollectorError: The collector is endless (``total_frames=-1``), so it has
                no length (a ``TypeError`` and a ``RuntimeError``, as TorchRL raises).
        """
        if self.endless:
            raise EndlessCollectorError(
                f"an endless collector ({self.count_names[1]}=-1) has no length"
            )
        return self.batches_for(_int(self.total_frames))

    def batches_for(self, frames: int) -> int:
        """The whole batches that hold ``frames`` (``>= 0``): their exact integer ceil.

        A float ceil is off by one past 2**53 frames, within the int64 counts accepted.
        """
        return -(-frames // self.frames_per_batch)

    def frames_per_actor(self, num_actors: int) -> int:
        """Frames each actor collects per batch: the total split evenly (sync) or all of it."""
        return self.frames_per_batch // num_actors if self.sync else self.frames_per_batch


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """What every actor session is asked to do (TorchRL's rollout knobs), validated at creation.

    No field has a default: ``GrpcCollector``'s signature is their one home.

    Attributes:
        max_frames_per_traj: Steps after which a trajectory is truncated; ``<= 0`` (or None)
            means none.
        init_random_frames: Random-action frames over the whole fleet (split across actors).
        reset_at_each_iter: Reset every env before each batch.
        reset_when_done: Must be True, as in TorchRL.
        split_trajs: Split batches into zero-padded trajectories.
        exploration_type: Interaction type while the policy acts: an ``ExplorationType``,
            tensordict's ``InteractionType`` or a name (normalised to ``ExplorationType``).
        set_truncated: Mark the last frame of each batch truncated.
        model_id: The model that acts.
        llm: LLM actors: what each session collects (sent with the settings).
        placement: The devices and the policy form the actors must offer (TorchRL's
            ``policy_device``, ``env_device``, ``compile_policy``, ``cudagraph_policy``).

    Raises:
        ValueError: A value out of range.
        TypeError: A value of the wrong type.
    """

    max_frames_per_traj: int | None
    init_random_frames: int | None
    reset_at_each_iter: bool
    reset_when_done: bool
    split_trajs: bool | None
    exploration_type: Any
    set_truncated: bool
    model_id: str
    llm: LLMSettings | None
    placement: ActorPlacement = dataclasses.field(default_factory=ActorPlacement)

    def __post_init__(self) -> None:
        check_model_id(self.model_id)
        if not _flag("reset_when_done", self.reset_when_done):
            raise ValueError("reset_when_done=False is not supported (TorchRL deprecated it too)")
        for name in ("max_frames_per_traj", "init_random_frames"):
            _set(self, name, _frames(name, getattr(self, name), endless=False))
        _set(self, "split_trajs", _optional_flag("split_trajs", self.split_trajs))
        # TorchRL's RayCollector example passes reset_at_each_iter=-False (the int 0).
        _set(self, "reset_at_each_iter", _int_flag("reset_at_each_iter", self.reset_at_each_iter))
        _flag("set_truncated", self.set_truncated)
        _set(self, "exploration_type", normalize_exploration_type(self.exploration_type))
        if self.llm is not None:
            check_no_env_settings({**vars(self), **vars(self.placement)})

    def for_actor(
        self, frames_per_batch: int, num_actors: int, *, taken: int = 0
    ) -> CollectSettings:
        """The settings one actor's session is opened with.

        Sessions get no frame budget: the learner decides when to stop.

        Args:
            frames_per_batch: Frames per batch from this actor.
            num_actors: Actors sharing ``init_random_frames``.
            taken: Frames that already count against ``init_random_frames``
                (:func:`random_frames_taken`).

        Returns:
            The session settings.
        """
        random_frames = max(0, _int(self.init_random_frames) - taken)
        return CollectSettings(
            frames_per_batch=frames_per_batch,
            max_frames_per_traj=_int(self.max_frames_per_traj),
            init_random_frames=-(-random_frames // max(num_actors, 1)),  # exact, as ints
            reset_at_each_iter=self.reset_at_each_iter,
            reset_when_done=self.reset_when_done,
            split_trajs=bool(self.split_trajs),
            exploration_type=self.exploration_type,
            set_truncated=self.set_truncated,
            total_frames=-1,
            model_id=self.model_id,
            llm=self.llm,
            fold_observations=True,  # what a GrpcCollector asks (docs/wire.md)
            **vars(self.placement),  # policy_device, env_device, compile_policy, cudagraph_policy
        )

    def for_grown_fleet(
        self, frames_per_batch: int, num_actors: int, *, sync: bool, taken: int
    ) -> CollectSettings:
        """The settings of the sessions opened when actors join while collecting.

        Sync restarts every session and drops the shares of the old split: the random
        frames not ``taken`` yet (:func:`random_frames_taken`) are split over the grown
        fleet (each session counts its share from its restart). Async opens the joiners'
        sessions only, and the running ones' shares already cover ``init_random_frames``:
        a joiner takes none.
        """
        if not sync:
            return dataclasses.replace(self, init_random_frames=0).for_actor(
                frames_per_batch, num_actors
            )
        return self.for_actor(frames_per_batch, num_actors, taken=taken)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectionSettings:
    """Channels, deadlines and flow control, validated at creation.

    No field has a default: ``GrpcCollector``'s signature is their one home.

    Attributes:
        connect_timeout: Seconds to reach an actor (Describe) at construction.
        call_timeout: Deadline of every unary call and weight push.
        channel_credentials: ``grpc.ssl_channel_credentials(...)`` for TLS; None for plaintext.
        token: Bearer token sent on every call; None for none.
        learner_id: This learner's identity on the actors: a reconnect resumes only a
            session opened under the same id. Empty (the default) draws one no other
            learner shares (host, pid and a random tag); reuse an id to resume after a
            deliberate restart.
        take_over: End another learner's active session on each actor instead of
            waiting for it to end (an operator's choice; the actors log it).
        shared_memory_batches: Ask actors proven to share this host for batches through
            shared-memory segments.

    Raises:
        ValueError: A value out of range.
        TypeError: A value of the wrong type.
    """

    connect_timeout: float
    call_timeout: float
    channel_credentials: Any
    token: str | None
    learner_id: str
    take_over: bool
    shared_memory_batches: bool

    def __post_init__(self) -> None:
        check_token(self.token)
        if self.learner_id == "":
            _set(self, "learner_id", new_learner_id())
        check_learner_id(self.learner_id, MAX_LEARNER_ID)
        for name in ("take_over", "shared_memory_batches"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("connect_timeout", "call_timeout"):
            _set(self, name, positive_timeout(name, getattr(self, name)))

    def metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The call metadata: this learner's id, ``take_over``, the bearer token when one is set.

        The id lets an actor refuse a push, state load or reseed of a learner whose session
        it does not serve (another learner's is in force), as it refuses its ``open``.
        """
        metadata: list[tuple[str, str | bytes]] = [(LEARNER_ID_METADATA, self.learner_id.encode())]
        if self.take_over:
            metadata.append((TAKE_OVER_METADATA, "1"))
        if self.token:
            metadata.append(("authorization", f"Bearer {self.token}"))
        return tuple(metadata)


def new_learner_id() -> str:
    """A learner identity no other collector shares: ``<host>-<pid>-<random hex>``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is a positive integer (:func:`as_int`), else raise.

    Raises:
        TypeError: Not an integer.
        ValueError: Not positive.
    """
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if number <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return number


#: Seconds each phase of a collector's shutdown may take when none is given.
DEFAULT_SHUTDOWN_TIMEOUT = 10.0


def shutdown_limit(timeout: object) -> float:
    """``shutdown(timeout=)`` checked: the default for None, else a positive timeout.

    Raises:
        TypeError, ValueError: As :func:`positive_timeout` (before anything is closed).
    """
    return DEFAULT_SHUTDOWN_TIMEOUT if timeout is None else positive_timeout("timeout", timeout)


def normalize_exploration_type(value: object) -> ExplorationType:
    """Accept our ExplorationType, tensordict's InteractionType (or TorchRL's alias) or a name.

    Raises:
        ValueError: A name or member with no counterpart on the wire (e.g. ``MEDIAN``).
        TypeError: Anything else.
    """
    if isinstance(value, ExplorationType):
        return value
    if isinstance(value, enum.Enum):
        name = value.name
    elif isinstance(value, str):
        name = value.upper()
    else:
        raise TypeError(
            f"exploration_type must be an ExplorationType, an InteractionType or a name, "
            f"got {value!r}"
        )
    try:
        return ExplorationType[name]
    except KeyError:
        known = [m.name for m in ExplorationType]
        raise ValueError(
            f"exploration_type {value!r} is not supported; use one of {known}"
        ) from None


def normalize_cat_results(value: object) -> str | int:
    """``None``/``"stack"`` → ``"stack"``; ``0`` → ``0`` (concatenate on the first dim).

    Raises:
        ValueError: Any other value.
    """
    if value is None or value == "stack":
        return "stack"
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return 0
    raise ValueError(f"cat_results must be None, 'stack' or 0, got {value!r}")


def _nearest_multiples(name: str, value: int, step: int, most: int) -> str:
    """The valid values of ``name`` nearest ``value`` (multiples of ``step`` up to ``most``)."""
    lower, upper = value // step * step, (value // step + 1) * step
    near = [v for v in (lower, upper) if 0 < v <= most]
    if not near:
        return f"no {name} up to {most} suits this fleet (multiples of {step})"
    return f"use {name}={' or '.join(map(str, near))} (multiples of {step} suit this fleet)"


def _step(settings: BatchSettings, members: Sequence[FleetMember]) -> int:
    """What frames per batch must be a multiple of (the actors' envs, times the actors if sync).

    Whole LLM dialogs take any turn count per actor, so only the sync split counts for them.
    """
    whole = settings.llm is not None and settings.llm.trajectories
    step = 1 if whole else math.lcm(*{m.num_envs for m in members})
    return step * (len(members) if settings.sync else 1)


def _split_advice(settings: BatchSettings, members: Sequence[FleetMember]) -> str:
    """What to give ``check_fleet`` when a share is not a multiple of an actor's envs."""
    count, sizes = len(members), {m.num_envs for m in members}
    if settings.sync and settings.cat_results == 0 and len(sizes) > 1:
        return "cat_results=0 also needs actors of one num_envs (the same time steps from each)"
    step = _step(settings, members)
    most = MAX_FRAMES_PER_BATCH * (count if settings.sync else 1)
    return _nearest_multiples(settings.count_names[0], settings.frames_per_batch, step, most)


def check_split(settings: BatchSettings, count: int, step: int) -> None:
    """Refuse (sync) a ``frames_per_batch`` that ``count`` actors cannot share evenly.

    :func:`check_fleet` checks it against the actors met; a collector checks it before it
    starts a fleet of ``count`` actors, as RayCollector does before it places its own.

    Raises:
        ValueError: Sync, and ``frames_per_batch`` not divisible by ``count`` (naming the
            nearest multiples of ``step`` that suit).
    """
    fpb, name = settings.frames_per_batch, settings.count_names[0]
    if settings.sync and fpb % count:
        most = MAX_FRAMES_PER_BATCH * count
        raise ValueError(
            f"sync collection splits {name}={fpb} evenly over {count} actors, but {fpb} is not "
            f"divisible by {count}; {_nearest_multiples(name, fpb, step, most)}"
        )


def check_fleet(settings: BatchSettings, members: Sequence[FleetMember], model_id: str) -> None:
    """Check the fleet against the batch settings, as TorchRL checks its workers.

    Raises:
        ValueError: No actors; two actors with one worker_id; (sync) ``frames_per_batch``
            not divisible by the number of actors or a share not a multiple of an actor's
            ``num_envs``; (async) ``frames_per_batch`` not a multiple of an actor's ``num_envs``;
            (sync, ``cat_results=0`` or ``split_trajs``) actors of other envs.
        UnknownModelError: An actor lacks the acting model ``model_id``.
    """
    if not members:
        raise ValueError("GrpcCollector needs at least one actor address")
    lacking = [m for m in members if model_id not in m.models]
    if lacking:
        detail = ", ".join(
            f"{m.address} (worker_id {m.worker_id}) has {sorted(m.models)}" for m in lacking
        )
        raise UnknownModelError(f"the acting model_id {model_id!r} is missing: {detail}")
    check_unique(members)
    check_kinds(members, settings.llm)
    fpb, count = settings.frames_per_batch, len(members)
    name = settings.count_names[0]
    check_split(settings, count, _step(settings, members))
    share = settings.frames_per_actor(count)
    if share > MAX_FRAMES_PER_BATCH:  # the actors refuse it: say so before any session
        raise ValueError(
            f"{name}={fpb} gives each actor a share of {share} a batch, above the "
            f"{MAX_FRAMES_PER_BATCH} an actor collects in one"
        )
    if settings.llm is not None and settings.llm.trajectories:  # whole dialogs: any turn count
        return
    bad = [m for m in members if share % m.num_envs]
    if bad:
        detail = ", ".join(
            f"{m.address} (worker_id {m.worker_id}, num_envs {m.num_envs})" for m in bad
        )
        what = f"the per-actor share {share} of {name}={fpb}" if settings.sync else f"{name}={fpb}"
        raise ValueError(
            f"{what} is not a multiple of the env pool size of {detail}; "
            f"{_split_advice(settings, members)}"
        )
    laid_out = settings.cat_results == 0 or settings.split_trajs  # LLM batches: one layout
    if settings.sync and laid_out and settings.llm is None:
        check_one_env(members, "cat_results=0" if settings.cat_results == 0 else "split_trajs")
    steps = {share // m.num_envs for m in members}
    if settings.sync and settings.cat_results == 0 and len(steps) > 1 and not settings.split_trajs:
        raise ValueError(
            f"cat_results=0 needs the same time steps from every actor, but the env pool sizes "
            f"{sorted({m.num_envs for m in members})} give {sorted(steps)} steps per batch"
        )


#: What ``postproc`` is: applied to every batch before it is yielded or stored.
Postproc = Callable[[TensorDictBase], TensorDictBase]


class ReplayBufferLike(Protocol):
    """What the collector needs of a ``replay_buffer``: an ``extend()`` taking each batch."""

    def extend(self, data: TensorDictBase, /) -> object:
        """Store ``data`` (one actor's batch)."""
        ...


def check_hooks(
    postproc: object, replay_buffer: object, set_truncated: object = False
) -> tuple[Postproc | None, ReplayBufferLike | None]:
    """Return ``(postproc, replay_buffer)`` once each is None or usable.

    Warns as TorchRL's multi-worker collectors do when the buffer's ``SliceSampler`` finds
    trajectories by their end alone and ``set_truncated`` is False (see
    :func:`_warn_slicing_by_ends`).

    Raises:
        TypeError: ``postproc`` is not callable, or ``replay_buffer`` has no ``extend()``.
    """
    if postproc is not None and not callable(postproc):
        raise TypeError(f"postproc must be callable, got {postproc!r}")
    if replay_buffer is not None and not callable(getattr(replay_buffer, "extend", None)):
        raise TypeError(f"replay_buffer must have an extend() method, got {replay_buffer!r}")
    if not set_truncated:
        _warn_slicing_by_ends(getattr(replay_buffer, "_sampler", None))
    return cast("Postproc | None", postproc), cast("ReplayBufferLike | None", replay_buffer)


def _warn_slicing_by_ends(sampler: object) -> None:
    """Warn when ``sampler`` is a ``SliceSampler`` that finds trajectories by ``end_key``.

    Each actor's part is stored on its own, so the frames after one actor's part may be
    another actor's, with no done between: a slice can run from one actor's trajectory into
    another's. ``("collector", "traj_ids")`` is unique across the fleet, so a sampler that
    reads it (given as ``traj_key``, or found by a sampler given neither key) never does.
    """
    if not any(cls.__name__ == "SliceSampler" for cls in type(sampler).__mro__):
        return
    if getattr(sampler, "traj_key", None) is not None or getattr(sampler, "_traj_key_auto", False):
        return
    warnings.warn(
        "A SliceSampler finding trajectories by end_key is fed by a fleet with set_truncated "
        "False. Adjacent frames in the replay buffer may come from different actors and "
        "different episodes, causing SliceSampler to sample slices "
        "that cross trajectory boundaries. Pass traj_key=('collector', 'traj_ids') to the "
        "SliceSampler (unique across the fleet), or set_truncated=True to mark batch "
        "boundaries (note: this introduces artificial truncations).",
        UserWarning,
        stacklevel=4,
    )


def random_frames_taken(replay_buffer: object, frames: int) -> int:
    """The frames that count against ``init_random_frames`` when sessions open.

    TorchRL judges random frames as it collects, against the replay buffer's writes when
    one is given (:func:`frames_written`), else against its frame counter: a run resumed
    past ``init_random_frames`` takes no random actions again, whether the buffer or
    ``load_state_dict`` was loaded before or after the collector was built.

    Args:
        replay_buffer: The collector's replay buffer, or None.
        frames: The collector's frame counter (``load_state_dict`` restores it).
    """
    written = None if replay_buffer is None else frames_written(replay_buffer)
    return frames if written is None else max(0, written)


def frames_written(replay_buffer: object) -> int | None:
    """The frames a replay buffer was given: its ``write_count`` times the frames of a row.

    ``write_count`` counts rows of the storage's first dim: a ``LazyTensorStorage`` extended
    with an actor's ``[envs, time]`` part counts ``envs`` rows of ``time`` frames each (the
    storage's tensordict is ``[max_size, time]``). A buffer whose rows cannot be read (not
    a tensor storage, nothing stored yet) counts a frame per write.
    """
    written = as_int(getattr(replay_buffer, "write_count", 0))
    rows = getattr(getattr(replay_buffer, "storage", None), "_storage", None)
    if written is None or not isinstance(rows, TensorDictBase) or rows.batch_dims < 1:
        return written
    return written * math.prod(rows.batch_size[1:])


def check_addresses(actors: object) -> list[str]:
    """The actor addresses as a list of ``host:port`` strings.

    Raises:
        ValueError: No addresses, a malformed one, or one listed twice.
        TypeError: Not a list of strings.
    """
    if isinstance(actors, str) or not isinstance(actors, Sequence):
        raise TypeError(f"actors must be a list of 'host:port' strings, got {actors!r}")
    if not actors:
        raise ValueError("GrpcCollector needs at least one actor address, got []")
    seen: list[str] = []
    for address in actors:
        if not isinstance(address, str):
            raise TypeError(f"actor addresses must be strings, got {address!r}")
        check_actor_address(address)
        if address in seen:
            raise ValueError(f"actor address {address!r} is listed twice")
        seen.append(address)
    return seen


def _set(settings: object, name: str, value: object) -> None:
    """Store a normalised value on a frozen dataclass, from its ``__post_init__``."""
    object.__setattr__(settings, name, value)


def _int(value: int | None) -> int:
    """A frame count normalised by ``__post_init__`` (None stands for -1 before that)."""
    return -1 if value is None else value


# Frame counts travel as int64 (the settings' proto fields).
_MAX_FRAMES = 2**63 - 1


def _frames(name: str, value: object, *, endless: bool) -> int:
    """A frame count as TorchRL reads it: any count <= 0 means none (None: 0, -1 if ``endless``).

    Integers of every kind and whole floats are counts, as TorchRL reads them (``int()``);
    with ``endless``, -1 (or None, or ``inf``) is endless and another count <= 0 refused.
    """
    scalar = getattr(value, "ndim", 0) == 0  # an array of counts compares as an array
    if value is None or (endless and scalar and value == math.inf):  # TorchRL's endless float
        return -1 if endless else 0
    count = as_int(value, whole_floats=True)
    if count is None:
        raise TypeError(f"{name} must be an int or None, got {value!r}")
    if count > _MAX_FRAMES:
        raise ValueError(f"{name} must be at most 2**63 - 1, got {value!r}")
    if endless and count == -1:
        return -1
    if endless and count <= 0:
        raise ValueError(f"{name} must be positive, or -1 for endless, got {value!r}")
    return count  # as given (TorchRL's attributes read it back): any count <= 0 means none


def _optional_flag(name: str, value: object) -> bool:
    """A flag where None (a TorchRL default) means False."""
    return False if value is None else _flag(name, value)


def _int_flag(name: str, value: object) -> bool:
    """A flag also given as the int 0 or 1 (TorchRL reads it by truth), as a bool."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return _flag(name, value)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


#: Consecutive delta pushes a worker gets before the next full one.
DEFAULT_FULL_PUSH_EVERY = 10
#: The most parallel streams one push may be striped over.
MAX_STREAMS = 16


@dataclasses.dataclass(frozen=True)
class WeightPushSettings:
    """How weight pushes travel.

    Attributes:
        checksum: ``"crc32c"`` (hardware CRC-32C, ~10 GB/s; the default) or ``"sha256"``
            (a cryptographic digest, ~2 GB/s, for operators who want one). The actor
            verifies whichever the push carries.
        full_push_every: With ``delta=True``, a worker gets a full push after this many
            consecutive deltas, which bounds the cost of any drift or lost snapshot.
        shared_memory: Push to actors proven to share this host through a shared-memory
            segment under ``/dev/shm`` (written once per push, read by each of them)
            instead of the bytes over gRPC; False sends every actor the bytes
            (``docs/weights.md``).
        relay: Send a blob that several remote actors get (8 MiB or more, no TLS) once,
            to the first of a chain of them, each forwarding it to the next as it arrives
            (``docs/weights.md``, "How a push travels"); False sends each actor the bytes.
        relay_stall_seconds: How long an actor of a chain waits for new bytes from its
            relay before it gives them up and the learner sends it the bytes itself.
        streams: Stripe a full push of at least ``streams x 8 MiB`` to an actor reached
            over the network over up to this many parallel streams, each a connection of
            its own, as the parts of its version (``docs/weights.md``); 1 (the default)
            sends each push as one stream. For fast links that one connection cannot fill.

    Example::

        GrpcCollector(actors, frames_per_batch=256,
                      weight_push=WeightPushSettings(checksum="sha256", full_push_every=4))
    """

    checksum: str = "crc32c"
    full_push_every: int = DEFAULT_FULL_PUSH_EVERY
    shared_memory: bool = True
    relay: bool = True
    relay_stall_seconds: float = 5.0
    streams: int = 1

    def __post_init__(self) -> None:
        if self.checksum not in CHECKSUMS:
            raise ValueError(f"checksum must be one of {CHECKSUMS}, got {self.checksum!r}")
        every = self.full_push_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"full_push_every must be an int >= 1, got {every!r}")
        if not isinstance(self.shared_memory, bool):
            raise ValueError(f"shared_memory must be a bool, got {self.shared_memory!r}")
        if not isinstance(self.relay, bool):
            raise ValueError(f"relay must be a bool, got {self.relay!r}")
        stall = self.relay_stall_seconds
        if isinstance(stall, bool) or not isinstance(stall, int | float) or not 0.1 <= stall <= 600:
            raise ValueError(f"relay_stall_seconds must be in [0.1, 600], got {stall!r}")
        streams = self.streams
        is_int = isinstance(streams, int) and not isinstance(streams, bool)
        if not is_int or not 1 <= streams <= MAX_STREAMS:
            raise ValueError(f"streams must be an int in [1, {MAX_STREAMS}], got {streams!r}")
