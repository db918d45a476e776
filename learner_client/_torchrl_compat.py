"""What keeps a TorchRL script's collector line working on a fleet: its arguments and its env.

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

The script's env (``create_env_fn``) is followed too. The env it builds must match the
fleet's batches key by key. TorchRL's ``Collector(create_env_fn=env, ...)`` steps the
script's own env object, so a script may read that env's state afterwards:
``ppo_mujoco.py`` saves its ``VecNorm`` statistics with every checkpoint
(``get_vecnorm_state(train_env)``). On a fleet the actors step their own copies and the
script's env is never stepped, so :class:`ScriptEnv` loads an actor's env state (GetState's
``env``: the transforms' ``state_dict``) into the script's env after each batch, when that
env has state to follow (an empty ``state_dict()``: nothing is fetched), also an env that
never stepped (:mod:`learner_client._env_state`: a fresh ``VecNorm`` gets ``loc``/``scale``,
lazy buffers such as ``CatFrames``'s are made in the actor's shapes). The actor is the
first worker of the fleet, or the first ones when the script's env holds more envs than one
actor steps (each actor's envs in turn, as the batch lays them out); an actor's pool of one
env hands over that env's state (``worker0``). A state that does not fit the script's env
(another env, other envs) is not loaded at all, a UserWarning says so once and the env is
no longer followed; an actor that cannot be reached leaves the env as it was until the next
batch.

A batch also takes the layout of the script's env where the fleet can give it: TorchRL's
``Collector`` gives ``env.batch_size + [T]`` (``[T]`` for one unbatched env), a fleet
``[actors, envs, T]`` (each actor's part ``[envs, T]``), so a batch gets the script env's
``batch_size`` where the fleet steps as many envs: one actor with one env gives a
single-env script TorchRL's ``[T]``, two actors sharing a ``ParallelEnv``'s four envs give
its ``[4, T]``, in the batches and in the replay buffer alike. No torchrl import here: the
env is whatever the user's callable returns.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import torch
from tensordict import NonTensorStack, TensorDictBase

from common.config import CompileSettings, check_device_name
from common.env_state import dense_refusal, env_has_state
from common.env_weights import (
    ENV_MODEL_ID,
    env_parameters,
    parameters_module,
    trains_parameters,
)
from common.errors import RlfleetError, UnknownModelError
from common.gym_layout import batch_dtype, batch_shape
from learner_client._env_state import joined_state, load_env_state, pool_size
from learner_client._shared_policy import SharedPolicy

T = TypeVar("T")
#: How the collector pushes a followed module when it is due (``Pusher.push_shared``).
PushShared = Callable[[SharedPolicy | None, str], None]

__all__ = [
    "ActorPlacement",
    "NO_EFFECT",
    "NoEffect",
    "ScriptEnv",
    "TorchRLAccessors",
    "TorchRLOnly",
    "check_no_effect",
    "check_torchrl_only",
    "check_unsupported",
    "one_device",
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


#: A key's trailing shape and dtype in one step of an env.
KeySpec = tuple[tuple[int, ...], torch.dtype]


# ------------------------------------------------------------ the script's env


class EnvSignature(NamedTuple):
    """What ``create_env_fn``'s env says a batch holds.

    Attributes:
        keys: Each key's trailing shape and dtype in one step.
        batch_size: The env's ``batch_size`` for a TorchRL env; None for a gymnasium env
            (TorchRL's collectors take no such env).
    """

    keys: dict[Any, KeySpec]
    batch_size: tuple[int, ...] | None


def env_signature(
    create_env_fn: Callable[..., Any],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> EnvSignature:
    """The keys, trailing shapes and dtypes of one step of the env ``create_env_fn`` builds.

    ``create_env_kwargs`` may be a multi-worker collector's list (one per worker): the
    first worker's build the env, as the first of ``create_env_fn``'s list is the one read.
    A TorchRL env gives every leaf of its ``fake_tensordict()``; a gymnasium env its
    ``observation`` (actions are encoded by the actors). The env is closed afterwards,
    unless ``create_env_fn`` is a TorchRL env itself, as TorchRL's ``Collector`` also
    takes one: that env is the script's, read as it is (calling it would run
    ``EnvBase.forward``) and left open.

    Raises:
        TypeError: ``create_env_fn`` is not callable, or builds neither kind of env.
    """
    if is_env_object(create_env_fn):
        return _signature(create_env_fn)
    if not callable(create_env_fn):
        raise TypeError(f"create_env_fn must be callable, got {create_env_fn!r:.60}")
    kwargs = create_env_kwargs
    if isinstance(kwargs, list | tuple):  # a multi-worker collector's, one per worker
        kwargs = kwargs[0] if kwargs else None
    env = create_env_fn(**dict(cast("Mapping[str, Any] | None", kwargs) or {}))
    try:
        return _signature(env)
    finally:
        if is_env_object(env):  # a batched env never started is closed already to TorchRL
            env.close(raise_if_closed=False)
        elif callable(close := getattr(env, "close", None)):
            close()


def is_env_object(value: object) -> bool:
    """Whether ``value`` is a TorchRL env object (not a constructor: an env class is one)."""
    return not isinstance(value, type) and callable(getattr(value, "fake_tensordict", None))


def _signature(env: Any) -> EnvSignature:
    """:func:`env_signature` of an env built (or given) already."""
    fake = getattr(env, "fake_tensordict", None)
    if callable(fake):
        if refusal := dense_refusal(env, "create_env_fn's env"):
            raise ValueError(refusal)
        td = fake()
        size = tuple(getattr(env, "batch_size", ()))
        dims = len(size)
        keys = {
            key: (tuple(value.shape[dims:]), value.dtype)
            for key, value in td.items(include_nested=True, leaves_only=True)
            if not _private(key)
        }
        return EnvSignature(keys, size)
    space = getattr(env, "observation_space", None)
    if space is None or getattr(space, "dtype", None) is None:
        raise TypeError(
            f"create_env_fn returned a {type(env).__name__}: neither a TorchRL env "
            "nor a gymnasium env with a Box observation space"
        )
    layout = (batch_shape(space), batch_dtype(space))  # as a gymnasium actor batches it
    return EnvSignature({"observation": layout}, None)


def _private(key: object) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    return any(str(p).startswith("_") for p in parts) or parts[0] == "collector"


def check_env_signature(expected: Mapping[Any, KeySpec], batch: Any, worker: str) -> None:
    """Check a fleet batch against :func:`env_signature` of ``create_env_fn``'s env.

    Raises:
        ValueError: A key of the env missing from the batch, or with another trailing
            shape or dtype (naming the key, both specs and the actor).
    """
    keys = set(batch.keys(include_nested=True, leaves_only=True))
    for key, (shape, dtype) in expected.items():
        if key not in keys:
            raise ValueError(
                f"create_env_fn's env has {key!r}, which the batches of {worker} lack "
                f"(they hold {_observation_keys(keys)}): {_ANOTHER_ENV}"
            )
        value = batch.get(key)
        trailing = tuple(value.shape[value.dim() - len(shape) :]) if shape else ()
        if value.dtype != dtype or trailing != shape:
            raise ValueError(
                f"create_env_fn's env has {key!r} as {list(shape)} {dtype}, the batches of "
                f"{worker} as {list(trailing)} {value.dtype}: {_ANOTHER_ENV}"
            )


#: The end of :func:`check_env_signature`'s refusals: the two causes and their fixes.
_ANOTHER_ENV = (
    "the actors run another env, or host it another way: a gymnasium actor (the default "
    "kind) writes every observation as 'observation', where TorchRL's wrappers may name "
    "it otherwise (an RGB image 'pixels'); host the env as a TorchRL env for TorchRL's "
    'keys (kind="torchrl", an env factory returning e.g. GymWrapper(env))'
)


def _observation_keys(keys: set[Any]) -> str:
    """The root keys of a batch a message lists (not the bookkeeping ones)."""
    names = sorted({str(k if isinstance(k, str) else k[0]) for k in keys} - {"collector", "next"})
    return ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")


#: What reads one actor's decoded state (``GrpcCollector.actor_state``).
StateReader = Callable[[int], Mapping[str, Any]]


def _layout_message(size: tuple[int, ...], got: tuple[int, ...]) -> str:
    """The warning for a fleet stepping another number of envs than the script's env."""
    envs = math.prod(size)
    return (
        f"the fleet steps {math.prod(got[:-1])} envs per batch, batches {list(got)} "
        f"([actors, envs, time] when sync), where the script's env (create_env_fn) has "
        f"batch_size {list(size)}, so TorchRL's collector would give {[*size, got[-1]]}; "
        f"for TorchRL's layout give the fleet {envs} env{'s' * (envs != 1)} in all "
        f"(actors x num_envs, e.g. LocalFleet(1, num_envs={envs}, ...)), or keep this "
        f"layout and read the batches as [actors, envs, time]"
    )


class _Pushes(Protocol):  # learner_client._pushes.Pusher, whose module imports this one
    def unchanged_since_push(self) -> bool: ...


class _Batches(Protocol):  # learner_client._settings.BatchSettings
    @property
    def frames_per_batch(self) -> int: ...

    def frames_per_actor(self, num_actors: int) -> int: ...


class _Holds(Protocol):
    """What :class:`TorchRLAccessors` reads of the collector it is part of."""

    replay_buffer: Any
    _env: ScriptEnv | None
    _shared: SharedPolicy | None
    _pusher: _Pushes

    _batch: _Batches

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


class TorchRLAccessors:
    """TorchRL's accessors and version calls, for what a fleet's collector holds in the learner.

    TorchRL's ``Trainer`` reads ``collector.getattr_rb("write_count")``, its SAC and CQL
    trainers ``getattr_env("full_action_spec_unbatched")``, scripts ``collector.env``: the
    replay buffer, the ``policy=`` module and the env object given as ``create_env_fn`` are
    the learner's own here as there. What lives only in the actors (an env built by a
    constructor, a policy built by a factory) raises ``AttributeError`` saying so.
    """

    def get_policy_version(self: _Holds) -> int:
        """:attr:`policy_version`, as a method (TorchRL's remote-call form)."""
        return self.policy_version

    def increment_version(self: _Holds) -> int:
        """TorchRL's bump: push ``policy=`` or the last weights given if changed since, else not."""
        if self._shared is not None or not self._pusher.unchanged_since_push():
            self.update_policy_weights_()
        return self.policy_version

    def iterator(self: _Holds) -> Iterator[Any]:
        """TorchRL's name for iterating the collector."""
        return iter(self)

    def async_shutdown(self: _Holds, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection, then :meth:`shutdown` (bounded, idempotent)."""
        self.shutdown(timeout, close_env)

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
                "collector.env is the env object given as create_env_fn=; the envs of a fleet "
                "live in the actors (a constructor's env is built once, to check the batches)"
            )
        return given

    def getattr_env(self: _Holds, attr: str) -> Any:
        """``attr`` of :attr:`env` (its specs, say)."""
        return getattr(self.env, attr)


class ScriptEnv:
    """The env of ``create_env_fn``: its signature, and the script's env if it is one.

    Args:
        create_env_fn: TorchRL's argument: an env constructor, or a TorchRL env itself.
        create_env_kwargs: Keyword arguments of the constructor.
        per_actor: Shape each actor's part as a worker's batch, each worker stepping the
            env (``RayCollector``'s drop-in form, and a multi-worker collector's list of
            constructors): the env dimension of ``[..., envs, T]`` becomes the env's
            ``batch_size`` where the actor steps as many envs, the actors' dimension (sync)
            stays, as ``MultiSyncCollector`` stacks its workers; never warns.
    """

    @classmethod
    def of(cls, create_env_fn: Any, create_env_kwargs: Any, *, on_ray: bool) -> ScriptEnv | None:
        """The ``ScriptEnv`` of a collector's ``create_env_fn`` (None when not given).

        A list (``MultiSyncCollector``'s and ``RayCollector``'s, one constructor per worker)
        is read through its first, each actor's part shaped as one worker's batch.
        """
        per_worker = isinstance(create_env_fn, list | tuple)
        env_fn = (create_env_fn[0] if create_env_fn else None) if per_worker else create_env_fn
        if env_fn is None:
            return None
        return cls(env_fn, create_env_kwargs, per_actor=on_ray or per_worker)

    def __init__(
        self,
        create_env_fn: Callable[..., Any],
        create_env_kwargs: Mapping[str, Any] | None,
        *,
        per_actor: bool = False,
    ) -> None:
        self._per_actor = per_actor
        signature = env_signature(create_env_fn, create_env_kwargs)
        self._signature: dict[Any, Any] | None = signature.keys
        self._batch_size = signature.batch_size
        self._warned = False  # about a fleet stepping another number of envs
        own = is_env_object(create_env_fn)
        #: The env object the script gave (a TorchRL env), or None for a constructor.
        self.given = create_env_fn if own else None
        self._env = create_env_fn if own and env_has_state(create_env_fn) else None
        #: The script's env's own weights, pushed to the actors' envs whenever they changed,
        #: when the script trains some of them (``common.env_weights``); None otherwise.
        self.weights = _trained_weights(create_env_fn) if own else None

    def push_weights(self, push_shared: PushShared) -> None:
        """Push the env's weights to the actors' envs if they changed (docs/collector.md).

        Raises:
            UnknownModelError: The actors' envs hold no weights to take them.
        """
        try:
            push_shared(self.weights, ENV_MODEL_ID)
        except UnknownModelError as exc:
            raise UnknownModelError(
                f"create_env_fn's env holds weights the script trains (an RNDTransform's "
                f"networks, say), which the actors' envs must step with: {exc}. Run the actors "
                f"with --kind torchrl, env_backend 'sync', and an env factory that builds the "
                f"same transforms (docs/collector.md, 'An env with weights')"
            ) from exc

    @property
    def followed(self) -> bool:
        """Whether the script's env follows an actor's env state after each batch."""
        return self._env is not None

    def shaped(self, batch: Any) -> Any:
        """``batch`` (``[actors, envs, T]`` or ``[envs, T]``) as ``env.batch_size + [T]``.

        Only where the envs are as many as the script's env steps; otherwise unchanged.
        """
        size = self._batch_size
        if self._per_actor:
            return self._per_actor_shaped(batch)
        lead = tuple(batch.batch_size[:-1])
        if size is not None and math.prod(lead) != math.prod(size) and not self._warned:
            self._warned = True
            warnings.warn(_layout_message(size, tuple(batch.batch_size)), UserWarning, stacklevel=4)
        if size is None or lead == size or math.prod(lead) != math.prod(size):
            return batch
        if not size:
            return batch[(0,) * len(lead)]
        return _reshape(batch, (*size, batch.batch_size[-1]))

    def _per_actor_shaped(self, batch: Any) -> Any:
        """``[..., envs, T]`` as ``[..., *env.batch_size, T]`` where the envs are as many."""
        size, shape = self._batch_size, tuple(batch.batch_size)
        if size is None or len(shape) < 2 or shape[-2] != math.prod(size) or shape[-2:-1] == size:
            return batch
        outer = shape[:-2]
        if not size and not outer:
            return batch[0]
        return _reshape(batch, (*outer, *size, shape[-1]))

    def after_batch(self, batch: Any, workers: list[int], read_state: StateReader) -> None:
        """Check the first batch; load an actor's env state into the script's env.

        Raises:
            ValueError: The first batch lacks a key of the env, or has it in another
                shape or dtype (:func:`check_env_signature`).
        """
        if self._signature is not None:
            check_env_signature(self._signature, batch, f"actors {workers}")
            self._signature = None
        self.follow(workers, read_state)

    def follow(self, workers: list[int], read_state: StateReader) -> None:
        """Load the actors' env state into the script's env; stop following if it does not fit.

        After each batch and after a restore. Once it does not fit, a UserWarning says so
        and the env is left as it was.
        """
        if self._env is None or not workers:
            return
        states = self._read_states(workers, read_state)
        if not states:
            return
        try:
            load_env_state(self._env, joined_state(states, self._env))
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            message = (
                f"create_env_fn's env no longer follows the env state of worker_ids "
                f"{workers[: len(states)]}, which does not fit it: {str(exc).splitlines()[0]}"
            )
            log.warning("%s", message)
            warnings.warn(message, UserWarning, stacklevel=5)
            self._env = None

    def _read_states(self, workers: list[int], read_state: StateReader) -> list[Any]:
        """The env states of the first actors, as many as hold the script's env's envs."""
        wanted = math.prod(self._batch_size or ())  # the script's envs; 1 when unbatched
        states: list[Any] = []
        for worker_id in workers:
            try:
                state = read_state(worker_id).get("env")
            except RlfleetError as exc:
                log.warning("the env state of worker_id %d could not be read: %s", worker_id, exc)
                return []
            if not state:
                return []
            states.append(state)
            if sum(pool_size(s) or wanted for s in states) >= wanted:
                break
        return states


def _trained_weights(env: Any) -> SharedPolicy | None:
    """``env``'s weights as a followed module, when the script trains some of them."""
    if not isinstance(env, torch.nn.Module) or not trains_parameters(env):
        return None
    return SharedPolicy(parameters_module(env_parameters(env)), follow=True)


def _reshape(batch: Any, size: tuple[int, ...]) -> Any:
    """``batch.reshape(*size)``, its text (``NonTensorStack``) keys included.

    tensordict's reshape leaves a ``NonTensorStack`` in its old shape when the reshape only
    drops a unit dimension (``[2, 1, T]`` to ``[2, T]``); those are rebuilt, row for row. It
    also drops the dims' names: the last (``"time"``) is named again.
    """
    shaped = batch.reshape(*size)
    if (last := batch.names[-1]) is not None:
        shaped.names = [None] * (len(size) - 1) + [last]

    def leaf(cls: type) -> bool:
        return issubclass(cls, NonTensorStack) or not issubclass(cls, TensorDictBase)

    for key, value in list(shaped.items(True, True, is_leaf=leaf)):
        if isinstance(value, NonTensorStack) and tuple(value.batch_size) != size:
            items = value.tolist()
            for _ in range(value.batch_dims - 1):
                items = [item for row in items for item in row]
            for width in reversed(size[1:]):
                items = [items[i : i + width] for i in range(0, len(items), width)]
            shaped.set(key, NonTensorStack.from_list(items))
    return shaped
