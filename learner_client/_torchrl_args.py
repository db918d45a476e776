"""TorchRL's collector arguments that have no counterpart in rlfleet's own knobs.

A TorchRL script builds its collector with arguments that make sense where the
envs and the policy live in the learner's process (``Collector``,
``MultiSyncCollector``, ``MultiAsyncCollector``, ``AsyncCollector``, ``RayCollector``).
``GrpcCollector`` accepts every one of them by name, with TorchRL's default, and
normalises them here, at once, into one internal form:

* :class:`ActorPlacement`: ``policy_device``, ``env_device``, ``compile_policy`` and
  ``cudagraph_policy``, sent to the actors with each session (an actor on other
  devices, or without CUDA graphs, refuses the session: ``actor_service._core._placement``);
* :data:`NO_EFFECT`: the arguments that do nothing over gRPC, each with its TorchRL
  default and the reason, warned about only where a user would otherwise be surprised;
* :func:`update_flag`: ``update_at_each_batch``, TorchRL's multi-process name of
  ``update_after_each_batch``;
* :func:`check_unsupported`: complete-trajectory batches (``trajs_per_batch``), refused.

``create_env_fn`` is checked by :func:`env_signature`: the env it builds must match
the fleet's batches key by key. No torchrl import here: the env is whatever the
user's callable returns.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, cast

import torch

from common.config import CompileSettings, check_device_name

__all__ = [
    "NO_EFFECT",
    "NoEffect",
    "ActorPlacement",
    "check_no_effect",
    "check_torchrl_only",
    "check_unsupported",
    "update_flag",
]


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


def check_no_effect(values: Mapping[str, object]) -> None:
    """Accept TorchRL's arguments that do nothing here; warn where a user would be surprised.

    Raises:
        KeyError: A name not in :data:`NO_EFFECT` (a bug in the caller).
    """
    for name, value in values.items():
        entry = NO_EFFECT[name]
        if entry.warn and not _is_default(value, entry.default):
            warnings.warn(
                f"GrpcCollector: {name}={value!r:.60} has no effect over gRPC ({entry.reason})",
                UserWarning,
                stacklevel=3,
            )


def _is_default(value: object, default: object) -> bool:
    if value is None or default is None:
        return value is default
    return type(value) is type(default) and value == default


def check_torchrl_only(arguments: Mapping[str, object]) -> None:
    """Check the TorchRL-only arguments among ``arguments`` (all of a constructor's, by name).

    Raises:
        ValueError: As :func:`check_unsupported`.
    """
    check_unsupported(arguments)
    check_no_effect({name: arguments[name] for name in NO_EFFECT if name in arguments})


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

    #: The TorchRL arguments :meth:`from_torchrl` takes.
    TORCHRL_NAMES: ClassVar[tuple[str, ...]] = (
        "policy_device",
        "env_device",
        "compile_policy",
        "cudagraph_policy",
    )

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> ActorPlacement:
        """:meth:`from_torchrl` of the TorchRL arguments among ``arguments`` (by name)."""
        return cls.from_torchrl(**{k: arguments.get(k) for k in cls.TORCHRL_NAMES})

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
            policy_device=_device("policy_device", policy_device),
            env_device=_device("env_device", env_device),
            compile_policy=_compile(compile_policy),
            cudagraph_policy=_cudagraph(cudagraph_policy),
        )


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
    create_env_fn: Callable[..., Any], create_env_kwargs: Mapping[str, Any] | None
) -> EnvSignature:
    """The keys, trailing shapes and dtypes of one step of the env ``create_env_fn`` builds.

    A TorchRL env gives every leaf of its ``fake_tensordict()``; a gymnasium env its
    ``observation`` (actions are encoded by the actors). The env is closed afterwards,
    unless ``create_env_fn`` is a TorchRL env itself, as TorchRL's ``Collector`` also
    takes one: that env is the script's, read as it is (calling it would run
    ``EnvBase.forward``) and left open.

    Raises:
        TypeError: ``create_env_fn`` is not callable, or builds neither kind of env.
    """
    if callable(getattr(create_env_fn, "fake_tensordict", None)):
        return _signature(create_env_fn)
    if not callable(create_env_fn):
        raise TypeError(f"create_env_fn must be callable, got {create_env_fn!r:.60}")
    env = create_env_fn(**dict(create_env_kwargs or {}))
    try:
        return _signature(env)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def _signature(env: Any) -> EnvSignature:
    """:func:`env_signature` of an env built (or given) already."""
    fake = getattr(env, "fake_tensordict", None)
    if callable(fake):
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
    return EnvSignature({"observation": (tuple(space.shape), _torch_dtype(space.dtype))}, None)


def _private(key: object) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    return any(str(p).startswith("_") for p in parts) or parts[0] == "collector"


def _torch_dtype(dtype: Any) -> torch.dtype:
    import numpy as np

    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


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
                f"create_env_fn's env has {key!r}, which the batches of {worker} lack: "
                "the actors run another env"
            )
        value = batch.get(key)
        trailing = tuple(value.shape[value.dim() - len(shape) :]) if shape else ()
        if value.dtype != dtype or trailing != shape:
            raise ValueError(
                f"create_env_fn's env has {key!r} as {list(shape)} {dtype}, the batches of "
                f"{worker} as {list(trailing)} {value.dtype}: the actors run another env"
            )
