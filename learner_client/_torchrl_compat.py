"""What keeps a TorchRL script's collector line working on a fleet: its arguments, its accessors.

A TorchRL script builds its collector with arguments that make sense where the envs and the
policy live in the learner's process (``Collector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``AsyncCollector``, ``RayCollector``). ``GrpcCollector`` accepts
every one of them by name, with TorchRL's default, and they are normalised here, at once,
into one internal form: the devices and compilation the actors are asked for
(:class:`ActorPlacement`, sent with each session: an actor on other devices, or without
CUDA graphs, refuses the session), the arguments that do nothing over gRPC (each with its
TorchRL default and the reason, warned about only where a user would otherwise be
surprised), TorchRL's multi-process spelling ``update_at_each_batch``, and the one feature
refused (complete-trajectory batches, ``trajs_per_batch``).

The script's env (``create_env_fn``), followed and checked against the batches, is
:mod:`learner_client._script_env`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

import torch
from tensordict.nn import InteractionType

from common.config import CompileSettings, check_device_name
from learner_client._script_env import ScriptEnv
from learner_client._shared_policy import SharedPolicy

T = TypeVar("T")

__all__ = [
    "ActorPlacement",
    "NOT_OFFERED",
    "NO_EFFECT",
    "NoEffect",
    "TorchRLAccessors",
    "TorchRLFixedFlags",
    "TorchRLOnly",
    "check_no_effect",
    "check_torchrl_only",
    "check_unsupported",
    "one_device",
    "refuse_attribute",
    "update_flag",
]

log = logging.getLogger("learner_client")


class NoEffect(NamedTuple):
    """One TorchRL argument that does nothing over gRPC.

    Attributes:
        default: TorchRL's default (any other value is accepted too).
        reason: What it does in TorchRL and why it does nothing here.
        warn: Warn when it is given a value other than the default (the user would
            otherwise expect something to happen).
    """

    default: object
    reason: str
    warn: bool = False


_ACTORS_OWN = "the actors build and run their own envs and policy"
#: TorchRL's arguments that do nothing over gRPC, by name (docs/collector.md lists them).
NO_EFFECT: dict[str, NoEffect] = {
    "policy_factory": NoEffect(None, f"{_ACTORS_OWN} (their --policy factory)", warn=True),
    "create_env_kwargs": NoEffect(None, "only passed to create_env_fn, for the spec check"),
    "backend": NoEffect(None, "the fleet is the backend"),
    "backend_options": NoEffect(None, "the fleet is the backend"),
    "num_collectors": NoEffect(None, "the fleet's actors are the workers"),
    "num_workers": NoEffect(None, "the fleet's actors are the workers"),
    "collector_class": NoEffect(None, "each actor collects as TorchRL's Collector"),
    "collector_kwargs": NoEffect(None, "each actor's own flags set its collection", warn=True),
    "num_workers_per_collector": NoEffect(1, "one actor is one worker"),
    "ray_init_config": NoEffect(None, "no Ray cluster is involved"),
    "remote_configs": NoEffect(None, "actors' resources are set where they run"),
    "use_env_creator": NoEffect(False, _ACTORS_OWN),
    "init_fn": NoEffect(None, "the actors are started by their own command line", warn=True),
    "num_threads": NoEffect(None, "the learner's torch threads are the script's to set"),
    "num_sub_threads": NoEffect(1, "each actor's --torch-threads sets its threads"),
    "worker_idx": NoEffect(None, "the actors report their own worker_id"),
    "interruptor": NoEffect(None, "rollouts are not cut short; see allow_partial_batches", True),
    "preemptive_threshold": NoEffect(None, "use allow_partial_batches and batch_timeout", True),
    "return_same_td": NoEffect(False, "every batch is a new TensorDict off the wire"),
    "use_buffers": NoEffect(None, "batches are received into preallocated slabs anyway"),
    "track_traj_ids": NoEffect(True, "trajectory ids are always tracked (fleet-unique)"),
    "track_policy_version": NoEffect(False, "every frame always carries its policy_version"),
    "trust_policy": NoEffect(None, "the policy is not wrapped on the learner"),
    "no_cuda_sync": NoEffect(False, "the learner issues no CUDA sync of its own"),
    "extend_buffer": NoEffect(True, "batches are stored with replay_buffer.extend()", True),
    "weight_updater": NoEffect(None, "weights travel as safetensors pushes", warn=True),
    "weight_sync_schemes": NoEffect(None, "weights travel as safetensors pushes", warn=True),
    "weight_recv_schemes": NoEffect(None, "weights travel as safetensors pushes", warn=True),
    "auto_register_policy_transforms": NoEffect(None, "an actor's env factory adds them"),
    "pre_collect_hook": NoEffect(None, "hooks would run in TorchRL's workers", warn=True),
    "post_collect_hook": NoEffect(None, "hooks would run in TorchRL's workers; use postproc", True),
    "compact_obs": NoEffect(False, "observations travel once anyway (folded batches)"),
}

#: Complete-trajectory batches, which rlfleet's actors do not collect (yet).
_UNSUPPORTED = ("trajs_per_batch", "trajs_per_write", "traj_format")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchRLOnly:
    """TorchRL's collector arguments that rlfleet takes by name but does not use.

    Every name of :data:`NO_EFFECT`, then the complete-trajectory arguments, which are refused
    (:func:`check_torchrl_only`). The collector passes each one by name, so a name missing
    here or there is a type error, not an argument silently left unchecked.
    """

    policy_factory: object
    create_env_kwargs: object
    backend: object
    backend_options: object
    num_collectors: object
    num_workers: object
    collector_class: object
    collector_kwargs: object
    num_workers_per_collector: object
    ray_init_config: object
    remote_configs: object
    use_env_creator: object
    init_fn: object
    num_threads: object
    num_sub_threads: object
    worker_idx: object
    interruptor: object
    preemptive_threshold: object
    return_same_td: object
    use_buffers: object
    track_traj_ids: object
    track_policy_version: object
    trust_policy: object
    no_cuda_sync: object
    extend_buffer: object
    weight_updater: object
    weight_sync_schemes: object
    weight_recv_schemes: object
    auto_register_policy_transforms: object
    pre_collect_hook: object
    post_collect_hook: object
    compact_obs: object
    trajs_per_batch: object
    trajs_per_write: object
    traj_format: object


def check_no_effect(values: Mapping[str, object], warned: Collection[str] = ()) -> None:
    """Accept TorchRL's arguments that do nothing here; warn where a user would be surprised.

    Args:
        values: Each argument's value, by name.
        warned: Names that warn too when given (None counts as not given), beyond those
            :data:`NO_EFFECT` marks.

    Raises:
        KeyError: A name not in :data:`NO_EFFECT` (a bug in the caller).
    """
    for name, value in values.items():
        entry = NO_EFFECT[name]
        warn = entry.warn or (name in warned and value is not None)
        if warn and not _is_default(value, entry.default):
            warnings.warn(
                f"GrpcCollector: {name}={value!r:.60} has no effect over gRPC ({entry.reason})",
                UserWarning,
                stacklevel=3,
            )


def _is_default(value: object, default: object) -> bool:
    if value is None or default is None:
        return value is default
    return type(value) is type(default) and value == default


def check_torchrl_only(
    arguments: TorchRLOnly, *, with_effect: Collection[str] = (), warned: Collection[str] = ()
) -> None:
    """Refuse complete-trajectory batches; accept the rest, warning where it should.

    Args:
        arguments: The arguments, by name.
        with_effect: Names that do act in this form of the collector (RayCollector's
            placement arguments when it places its own actors on Ray): not checked.
        warned: Names that warn when given in this form (:func:`check_no_effect`).

    Raises:
        ValueError: As :func:`check_unsupported`.
    """
    values = {f.name: getattr(arguments, f.name) for f in dataclasses.fields(arguments)}
    check_unsupported(values)
    check_no_effect({n: values[n] for n in NO_EFFECT if n not in with_effect}, warned)


def check_unsupported(values: Mapping[str, object]) -> None:
    """Refuse complete-trajectory batches (``trajs_per_batch`` and its companions).

    Raises:
        ValueError: One of them is not None, naming it.
    """
    for name in _UNSUPPORTED:
        if values.get(name) is not None:
            raise ValueError(
                f"{name}={values[name]!r:.60}: batches of complete trajectories are not "
                "collected over gRPC; use split_trajs=True on fixed-size batches"
            )


def update_flag(update_after_each_batch: object, update_at_each_batch: object) -> bool:
    """``update_after_each_batch``, also given by TorchRL's multi-process name.

    Raises:
        TypeError: Either is not a bool.
    """
    for name, value in (
        ("update_after_each_batch", update_after_each_batch),
        ("update_at_each_batch", update_at_each_batch),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r:.60}")
    return bool(update_after_each_batch or update_at_each_batch)


@dataclasses.dataclass(frozen=True)
class ActorPlacement:
    """Where the actors must run the policy and the envs, and in what form (sent per session).

    Attributes:
        policy_device: The device the policy must run on ("": the actor's own).
        env_device: The device the envs must step on ("": the actor's own).
        compile_policy: ``torch.compile`` options for the acting policy; None: eager.
        cudagraph_policy: Capture the policy in CUDA graphs.
    """

    policy_device: str = ""
    env_device: str = ""
    compile_policy: CompileSettings | None = None
    cudagraph_policy: bool = False

    @classmethod
    def from_torchrl(
        cls,
        *,
        policy_device: object = None,
        env_device: object = None,
        compile_policy: object = None,
        cudagraph_policy: object = None,
    ) -> ActorPlacement:
        """Normalise TorchRL's arguments (devices as ``torch.device``, str or int; flags or dicts).

        Raises:
            ValueError: A device torch does not know; a ``compile_policy`` option other than
                ``backend``, ``mode``, ``fullgraph``, ``dynamic``, or a value torch refuses.
            TypeError: A value of the wrong type.
        """
        return cls(
            policy_device=one_device("policy_device", policy_device, _device),
            env_device=one_device("env_device", env_device, _device),
            compile_policy=_compile(compile_policy),
            cudagraph_policy=_cudagraph(cudagraph_policy),
        )


def one_device(name: str, value: object, check: Callable[[str, object], T]) -> T:
    """A TorchRL device argument ``check``-ed, a per-worker list (``[d] * workers``) as its ``d``.

    Raises:
        ValueError: The list is empty or names two devices: a fleet's batches land on the
            learner's one device, and each actor keeps its own (``--device``).
    """
    if not isinstance(value, list | tuple):
        return check(name, value)
    devices = [check(f"{name}[{i}]", entry) for i, entry in enumerate(value)]
    if not devices or any(device != devices[0] for device in devices):
        raise ValueError(
            f"{name}={value!r:.80}: a per-worker list must name one device (an actor's own "
            "device is its --device)"
        )
    return devices[0]


def _device(name: str, value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | torch.device):
        raise TypeError(f"{name} must be a torch.device, a str or None, got {value!r:.60}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} is not a device torch knows: {value!r:.60}") from None
    return check_device_name(str(device), name)


def _compile(value: object) -> CompileSettings | None:
    if value is None or value is False:
        return None
    if value is True:
        return CompileSettings()
    if not isinstance(value, Mapping):
        raise TypeError(f"compile_policy must be a bool, a dict or None, got {value!r:.60}")
    allowed = {f.name for f in dataclasses.fields(CompileSettings)}
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ValueError(
            f"compile_policy options {unknown} cannot travel to the actors; "
            f"use {sorted(allowed)} (plain values)"
        )
    options = {k: "" if v is None and k in ("backend", "mode") else v for k, v in value.items()}
    return CompileSettings(**cast(dict[str, Any], options))


def _cudagraph(value: object) -> bool:
    if value is None or value is False:
        return False
    if value is True or isinstance(value, Mapping):
        return True
    raise TypeError(f"cudagraph_policy must be a bool, a dict or None, got {value!r:.60}")


class _Pushes(Protocol):  # learner_client._pushes.Pusher, whose module imports this one
    def unchanged_since_push(self, model_id: str) -> bool: ...


class _Batches(Protocol):  # learner_client._settings.BatchSettings
    @property
    def endless(self) -> bool: ...

    @property
    def total_frames(self) -> int | None: ...

    @property
    def frames_per_batch(self) -> int: ...

    @property
    def split_trajs(self) -> bool | None: ...

    @property
    def cat_results(self) -> str | int | None: ...

    @property
    def update_after_each_batch(self) -> bool: ...

    @property
    def max_weight_update_interval(self) -> int: ...

    def frames_per_actor(self, num_actors: int) -> int: ...


class _Rollouts(Protocol):  # learner_client._settings.RolloutSettings
    @property
    def model_id(self) -> str: ...

    @property
    def init_random_frames(self) -> int | None: ...

    @property
    def placement(self) -> ActorPlacement: ...

    @property
    def max_frames_per_traj(self) -> int | None: ...

    @property
    def reset_at_each_iter(self) -> bool: ...

    @property
    def set_truncated(self) -> bool: ...

    @property
    def exploration_type(self) -> Any: ...


class _Delivers(Protocol):  # learner_client._rounds.Placement
    @property
    def device(self) -> torch.device | None: ...


class _Holds(Protocol):
    """What :class:`TorchRLAccessors` reads of the collector it is part of."""

    replay_buffer: Any
    _env: ScriptEnv | None
    _create_env_fn: Any
    _shared: SharedPolicy | None

    @property  # read-only members: the collector's own types need only fit these
    def _pusher(self) -> _Pushes: ...

    @property
    def _batch(self) -> _Batches: ...

    @property
    def _rollout(self) -> _Rollouts: ...

    @property
    def _placement(self) -> _Delivers: ...

    @property
    def worker_ids(self) -> list[int]: ...

    @property
    def policy(self) -> torch.nn.Module | None: ...

    @property
    def policy_version(self) -> int: ...

    def update_policy_weights_(self) -> Any: ...

    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None: ...

    @property
    def env(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


_IN_ACTORS = "the envs and policies run in the actors' processes, which take gRPC calls only"
_PUSHES = "weights travel as update_policy_weights_'s pushes (docs/weights.md)"
_HOOKS = "hooks would run in TorchRL's workers; a fleet's batches go through postproc="
#: TorchRL arguments kept as attributes that change nothing over gRPC: read, they say so.
_NO_EFFECT_READ = (
    "interruptor",
    "trust_policy",
    "no_cuda_sync",
    "compact_obs",
    "collector_class",
    "collector_kwargs",
    "policy_factory",
    "num_threads",
    "num_sub_threads",
    "preemptive_threshold",
)

#: TorchRL collectors' public names a fleet's collector does not offer, and why (each one
#: read raises ``AttributeError`` saying so, not Python's bare "no attribute").
NOT_OFFERED: dict[str, str] = {
    "reset": f"{_IN_ACTORS}; reset_at_each_iter=True resets every env before each batch",
    "rollout": f"{_IN_ACTORS}; iterate the collector (next()) for a batch",
    "get_model": f"{_IN_ACTORS}; collector.policy is the module given as policy=",
    "local_policy": f"{_IN_ACTORS}; collector.policy is the module given as policy=",
    "fake_tensordict": "the batches' layout is the actors' (as for TorchRL's multi-process "
    "collectors, which raise too): read it off a first batch",
    "map_fn": f"{_IN_ACTORS}; actor_state(worker_id) reads one actor's state",
    "cascade_execute": f"{_IN_ACTORS}; actor_state(worker_id) reads one actor's state",
    "get_distant_attr": f"{_IN_ACTORS}; actor_state(worker_id) reads one actor's state",
    "enable_profile": f"{_IN_ACTORS}; profile an actor's process itself (py-spy, torch.profiler)",
    "disable_profile": f"{_IN_ACTORS}; profile an actor's process itself (py-spy, torch.profiler)",
    "profile_config": f"{_IN_ACTORS}; profile an actor's process itself (py-spy, torch.profiler)",
    "init_updater": _PUSHES,
    "weight_updater": _PUSHES,
    "receive_weights": _PUSHES,
    "register_scheme_receiver": _PUSHES,
    "get_cached_weights": _PUSHES,
    "pre_collect_hook": _HOOKS,
    "post_collect_hook": _HOOKS,
    "set_post_collect_hook": _HOOKS,
    "stop_remote_collectors": "shutdown() stops the sessions, and a fleet given to the collector",
    "verbose": "the learner logs to the 'learner_client' logger (logging's levels)",
    "worker_idx": "each actor's batches carry its worker_id at ('collector', 'worker_id')",
    "trajs_per_batch": "complete-trajectory batches are not collected (use split_trajs=True)",
    "trajs_per_write": "complete-trajectory batches are not collected (use split_trajs=True)",
    "traj_format": "complete-trajectory batches are not collected (use split_trajs=True)",
    # A built collector's instance attributes (``vars(collector)``):
    "n_env": "each actor steps its own env pool (its --num-envs); a batch is [envs, time] "
    "per actor",
    "policy_weights": f"{_PUSHES}; TensorDict.from_module(collector.policy) reads policy='s",
    "get_weights_fn": _PUSHES,
    "policy_version_tracker": "pushes set the versions: policy_version, get_policy_version(), "
    "and every frame carries its ('next', 'policy_version')",
    "frames_per_worker": "each actor collects until the collector ends its session: "
    "total_frames is the fleet's budget",
    "collected_frames": "stats()['frames'] counts the frames delivered",
    "create_env_kwargs": f"{NO_EFFECT['create_env_kwargs'].reason}; the actors' envs take "
    "their own --env-kwargs",
    **dict.fromkeys(
        (
            "compiled_policy",
            "compiled_policy_kwargs",
            "cudagraphed_policy",
            "cudagraphed_policy_kwargs",
        ),
        "the actors compile their own policy: compile_policy= and cudagraph_policy= are sent "
        "with each session (an actor that cannot refuses it)",
    ),
    **dict.fromkeys(
        ("pipes", "procs", "queue_out", "out_tensordicts", "running"),
        "the workers are the actors' processes, reached over gRPC: worker_states reads their "
        "links, is_running() the background collection",
    ),
    **{name: f"{NO_EFFECT[name].reason} (no effect)" for name in _NO_EFFECT_READ},
}


def refuse_attribute(obj: object, name: str, not_offered: Mapping[str, str]) -> Any:
    """Raise the ``AttributeError`` of ``name``, not found on ``obj`` (a ``__getattr__``'s).

    A property that raised ``AttributeError`` (``env`` without an env object given) raises
    its own again: Python calls ``__getattr__`` after it, which must not hide its message. A
    TorchRL name in ``not_offered`` says so and how a fleet does it; another gets Python's
    own message.
    """
    if isinstance(getattr(type(obj), name, None), property):
        return object.__getattribute__(obj, name)  # the property's own error (or value)
    kind = type(obj).__name__
    if name in not_offered:
        message = f"{kind} has no {name!r}, TorchRL's: {not_offered[name]}"
        raise AttributeError(message, name=name, obj=obj)
    raise AttributeError(f"{kind!r} object has no attribute {name!r}", name=name, obj=obj)


class TorchRLFixedFlags:
    """TorchRL collectors' flags whose value a fleet's collectors always have, read-only."""

    @property
    def reset_when_done(self) -> bool:
        """True: a finished trajectory's env (a dialog's chat slot) starts anew."""
        return True

    @property
    def track_traj_ids(self) -> bool:
        """True: every frame carries its fleet-unique ``("collector", "traj_ids")``."""
        return True

    @property
    def extend_buffer(self) -> bool:
        """True: a replay buffer given takes each batch with ``extend()``, as TorchRL's."""
        return True

    @property
    def local_init_rb(self) -> bool:
        """True: the replay buffer given is the learner's own, filled in its process."""
        return True

    @property
    def return_same_td(self) -> bool:
        """False: every batch is a new TensorDict (TorchRL's default)."""
        return False


class TorchRLAccessors(TorchRLFixedFlags):
    """TorchRL's accessors and version calls, for what a fleet's collector holds in the learner.

    TorchRL's ``Trainer`` reads ``collector.getattr_rb("write_count")``, its SAC and CQL
    trainers ``getattr_env("full_action_spec_unbatched")``, scripts ``collector.env``: the
    replay buffer, the ``policy=`` module and the env object given as ``create_env_fn`` are
    the learner's own here as there. What lives only in the actors (an env built by a
    constructor, a policy built by a factory) raises ``AttributeError`` saying so, as does
    every TorchRL name the collector does not offer (:data:`NOT_OFFERED`).
    """

    if not TYPE_CHECKING:  # else mypy would take any name read on a collector as valid

        def __getattr__(self, name: str) -> Any:
            """Only for names not found: a TorchRL name not offered says why."""
            return refuse_attribute(self, name, NOT_OFFERED)

    def get_policy_version(self: _Holds) -> int:
        """:attr:`policy_version`, as a method (TorchRL's remote-call form)."""
        return self.policy_version

    def increment_version(self: _Holds) -> int:
        """TorchRL's bump: push ``policy=`` or the last weights given if changed since, else not."""
        acting = self._rollout.model_id
        if self._shared is not None or not self._pusher.unchanged_since_push(acting):
            self.update_policy_weights_()
        return self.policy_version

    def iterator(self: _Holds) -> Iterator[Any]:
        """TorchRL's name for iterating the collector."""
        return iter(self)

    def async_shutdown(self: _Holds, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection, then :meth:`shutdown` (bounded, idempotent)."""
        self.shutdown(timeout, close_env)

    @property
    def total_frames(self: _Holds) -> int | float:
        """Frames after which iteration stops, as TorchRL's attribute (``inf``: endless)."""
        return math.inf if self._batch.endless else int(self._batch.total_frames or 0)

    @property
    def frames_per_batch(self: _Holds) -> int:
        """Frames per yielded batch (sync: over the whole fleet)."""
        return self._batch.frames_per_batch

    @property
    def init_random_frames(self: _Holds) -> int:
        """Random-action frames this collector asks of the fleet (0: none, as in TorchRL)."""
        return max(int(self._rollout.init_random_frames or 0), 0)

    @property
    def storing_device(self: _Holds) -> torch.device | None:
        """Where batches are delivered (``storing_device``, else ``device``; None: the host)."""
        return self._placement.device

    @property
    def device(self: _Holds) -> torch.device | None:
        """TorchRL's attribute: :attr:`storing_device` (the learner keeps no other device)."""
        return self._placement.device

    @property
    def policy_device(self: _Holds) -> torch.device | None:
        """The policy device the actors are asked for (None: each actor's own)."""
        name = self._rollout.placement.policy_device
        return torch.device(name) if name else None

    @property
    def env_device(self: _Holds) -> torch.device | None:
        """The env device the actors are asked for (None: each actor's own)."""
        name = self._rollout.placement.env_device
        return torch.device(name) if name else None

    @property
    def requested_frames_per_batch(self: _Holds) -> int:
        """TorchRL's name of ``frames_per_batch`` (rlfleet never rounds it up)."""
        return self._batch.frames_per_batch

    @property
    def num_workers(self: _Holds) -> int:
        """TorchRL's count of a collector's workers: here the actors it collects from."""
        return len(self.worker_ids)

    def frames_per_batch_worker(self: _Holds, *, worker_idx: int | None = None) -> int:
        """Frames each actor collects per batch (``MultiCollector``'s method).

        All of ``frames_per_batch`` (async), or its share of it (sync: split evenly, never
        rounded up); every actor has the same, whatever ``worker_idx``.
        """
        del worker_idx
        return self._batch.frames_per_actor(max(1, len(self.worker_ids)))

    def getattr_rb(self: _Holds, attr: str) -> Any:
        """``attr`` of the replay buffer (``write_count``, say)."""
        if self.replay_buffer is None:
            raise AttributeError(f"getattr_rb({attr!r}): the collector has no replay_buffer")
        return getattr(self.replay_buffer, attr)

    def getattr_policy(self: _Holds, attr: str) -> Any:
        """``attr`` of the learner's policy given as ``policy=``."""
        if self.policy is None:
            raise AttributeError(
                f"getattr_policy({attr!r}): the policies live in the actors; give the learner's "
                "module as policy= to read it here"
            )
        return getattr(self.policy, attr)

    @property
    def env(self: _Holds) -> Any:
        """The env object given as ``create_env_fn`` (the actors step their own copies)."""
        given = None if self._env is None else self._env.given
        if given is None:
            raise AttributeError(
                f"{type(self).__name__} has no 'env', TorchRL's: collector.env is the env object "
                "given as create_env_fn=; the envs of a fleet live in the actors (a "
                "constructor's env is built once, to check the batches)",
                name="env",
                obj=self,
            )
        return given

    def getattr_env(self: _Holds, attr: str) -> Any:
        """``attr`` of :attr:`env` (its specs, say)."""
        return getattr(self.env, attr)

    @property
    def create_env_fn(self: _Holds) -> Any:
        """The ``create_env_fn`` given (the actors build their own envs; it checks batches)."""
        if self._create_env_fn is None:
            raise AttributeError(
                f"{type(self).__name__} has no 'create_env_fn', TorchRL's: the actors build "
                "their own envs (their --env flags); give create_env_fn= to check the batches "
                "against it",
                name="create_env_fn",
                obj=self,
            )
        return self._create_env_fn

    @property
    def num_collectors(self: _Holds) -> int:
        """RayCollector's count of its remote collectors: here the actors (:attr:`num_workers`)."""
        return len(self.worker_ids)

    @property
    def split_trajs(self: _Holds) -> bool:
        """Batches split into zero-padded trajectories (``("collector", "mask")``)."""
        return bool(self._batch.split_trajs)

    @property
    def cat_results(self: _Holds) -> str | int | None:
        """How sync batches join: ``"stack"`` (``[workers, envs, time]``) or ``0`` (cat)."""
        return self._batch.cat_results

    @property
    def update_after_each_batch(self: _Holds) -> bool:
        """Push the last weights given before each collection (either TorchRL name given)."""
        return self._batch.update_after_each_batch

    @property
    def update_at_each_batch(self: _Holds) -> bool:
        """TorchRL's multi-process name of :attr:`update_after_each_batch`."""
        return self._batch.update_after_each_batch

    @property
    def max_weight_update_interval(self: _Holds) -> int:
        """Batches of a worker after which it is pushed to again (``-1``: off)."""
        return self._batch.max_weight_update_interval

    @property
    def max_frames_per_traj(self: _Holds) -> int:
        """Steps after which a trajectory is truncated, as given (``<= 0``: none; None reads 0)."""
        return int(self._rollout.max_frames_per_traj or 0)

    @property
    def reset_at_each_iter(self: _Holds) -> bool:
        """Every env is reset before each batch."""
        return bool(self._rollout.reset_at_each_iter)

    @property
    def set_truncated(self: _Holds) -> bool:
        """The last frame of each batch is marked truncated."""
        return self._rollout.set_truncated

    @property
    def exploration_type(self: _Holds) -> InteractionType:
        """How the actors' policies act, as tensordict's ``InteractionType`` (TorchRL's)."""
        return InteractionType[self._rollout.exploration_type.name]
