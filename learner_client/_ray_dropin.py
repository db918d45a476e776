"""TorchRL ``RayCollector``'s own arguments, read as a fleet to place: the drop-in form.

A script written for ``RayCollector(create_env_fn=[...], policy=..., num_collectors=N,
ray_init_config=..., remote_configs=..., ...)`` keeps its line with ``GrpcCollector`` in its
place and no addresses: :func:`ray_fleet_of` reads what those arguments say about the actors
into one :class:`~learner_client._ray_fleet.RayFleet` of the callable form (the script's
callables shipped by Ray, one ``torchrl``-kind actor per collector), which the collector then
owns like any fleet given to it: started at construction, stopped at ``shutdown()`` or,
as RayCollector stops its own, when iteration reaches ``total_frames``.

RayCollector's rules are kept: ``create_env_fn``, ``collector_kwargs`` and
``remote_configs`` are each one value for every collector or a list of one per collector
(``num_collectors`` long when given, else, or when 0, as long as the lists);
``remote_configs`` defaults to RayCollector's ``{"num_cpus": 1, "num_gpus": 0.2 (with CUDA),
"memory": 2 GiB}``, and ``ray_init_config`` goes to ``ray.init`` (none: a running cluster
Ray finds by itself, or a local one). Each remote collector steps
``num_workers_per_collector`` copies of its env: an actor with as many envs, in-process (a
``SerialEnv``) for TorchRL's ``Collector`` and in subprocesses (a ``ParallelEnv``) for
``MultiSyncCollector`` / ``MultiAsyncCollector`` (``"single"``, ``"sync"``, ``"async"``
alike). RayCollector overwrites the keys of ``collector_kwargs`` that its own arguments set
(devices, frames, rollout knobs), so they do nothing here either; any other key has no
effect and warns once, naming it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase
from torch import nn

from learner_client._local_fleet import check_int
from learner_client._ray_fleet import RayFleet, check_ray_args
from learner_client._ray_runtime import import_ray

__all__ = ["RAY_ARGUMENTS", "RAY_WARNED", "RayPlacement", "ray_fleet_of"]

#: TorchRL's arguments that place the actors in the drop-in form (no effect otherwise).
RAY_ARGUMENTS = frozenset(
    {
        "num_collectors",
        "collector_class",
        "collector_kwargs",
        "num_workers_per_collector",
        "ray_init_config",
        "remote_configs",
        "create_env_kwargs",
        "policy_factory",
    }
)
#: RayCollector's arguments that warn in the drop-in form when given (no effect there).
RAY_WARNED = frozenset({"trust_policy", "use_env_creator", "no_cuda_sync"})
#: RayCollector's ``remote_configs`` when none are given (``DEFAULT_REMOTE_CLASS_CONFIG``).
_GIB = 1024**3
#: The keys of ``collector_kwargs`` RayCollector overwrites with its own arguments (not
#: ``trust_policy`` nor ``no_cuda_sync``: a value given there is the one its collectors take).
_OVERWRITTEN = frozenset(
    {
        "device",
        "storing_device",
        "env_device",
        "policy_device",
        "frames_per_batch",
        "max_frames_per_traj",
        "init_random_frames",
        "reset_at_each_iter",
        "exploration_type",
        "split_trajs",
        "policy_factory",
        "worker_idx",
    }
)
#: The arguments above that a collector keeps as attributes (``vars()`` of a RayCollector).
_ACTING = ("policy_factory", "collector_class", "collector_kwargs")
#: ``collector_class`` by name: whether its envs run in subprocesses (a ``ParallelEnv``).
_PARALLEL = {"single": False, "sync": True, "async": True}
_SERIAL_CLASSES = ("Collector", "SyncDataCollector")
_PARALLEL_CLASSES = ("MultiSyncCollector", "MultiAsyncCollector", "MultiCollector")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayPlacement:
    """RayCollector's arguments that say which actors to place and where (all by name)."""

    create_env_fn: Any
    create_env_kwargs: Mapping[str, Any] | None
    policy: Any
    policy_factory: Any
    num_collectors: int | None
    collector_class: Any
    collector_kwargs: Any
    num_workers_per_collector: int
    ray_init_config: Mapping[str, Any] | None
    remote_configs: Any

    def acting(self) -> dict[str, Any]:
        """TorchRL's arguments kept as attributes that act in this form, as given.

        With actors given they change nothing and read as such (``AttributeError``); here
        they place the actors and build their policies, so they read back.
        """
        return {name: getattr(self, name) for name in _ACTING}


def ray_fleet_of(placement: RayPlacement) -> RayFleet:
    """The fleet RayCollector's arguments describe (not started: the collector starts it).

    Raises:
        ImportError: Ray is not installed (naming ``rlfleet[ray]``).
        ValueError: Lists of another length than ``num_collectors`` or than each other, or
            empty; ``num_collectors`` below 0 (0: as long as the lists, as RayCollector reads
            it) or ``num_workers_per_collector`` below 1.
        TypeError: No ``create_env_fn`` (and no actors given to the collector); a policy
            module that is not a ``TensorDictModuleBase``; an unknown ``collector_class``;
            a ``num_collectors`` or ``num_workers_per_collector`` that is not an int.
    """
    if placement.create_env_fn is None:
        raise TypeError(
            "GrpcCollector needs the actors (their addresses or a fleet), or RayCollector's "
            "create_env_fn (with policy, num_collectors, ...) to place its own on Ray"
        )
    check_ray_args(placement.ray_init_config, None, None)
    env_fns, kwargs, configs = _per_collector(placement)  # checked before Ray is needed
    import_ray()
    _warn_collector_kwargs(kwargs)
    policy = placement.policy  # with policy_factory too: refused by RayFleet, as TorchRL's
    if placement.policy_factory is None:
        policy = _shipped_policy(policy)
    parallel = _parallel(placement.collector_class)
    return RayFleet(
        len(env_fns),
        num_envs=check_int("num_workers_per_collector", placement.num_workers_per_collector, 1),
        policy=policy,
        env_kwargs=placement.create_env_kwargs,
        create_env_fn=env_fns,
        policy_factory=placement.policy_factory,
        extra_args=["--env-backend", "async" if parallel else "sync"],
        ray_init_config=placement.ray_init_config,
        remote_configs=configs,
    )


def _shipped_policy(policy: Any) -> TensorDictModuleBase | None:
    """The policy shipped to the actors; None: they act with their own (random) one.

    A callable without weights (TorchRL's ``RandomPolicy(spec)``, a function) is taken as
    ``GrpcCollector`` takes it from any fleet (``SharedPolicy.of`` warns): the actors act
    with their own policy, a random one here.
    """
    if policy is None or isinstance(policy, TensorDictModuleBase):
        return policy
    if callable(policy) and not isinstance(policy, nn.Module):
        return None
    raise TypeError(
        f"policy is a {type(policy).__name__}: the actors placed on Ray act with a "
        "tensordict.nn.TensorDictModuleBase; wrap it: TensorDictModule(module, "
        "in_keys=['observation'], out_keys=['action'])"
    )


def _per_collector(
    placement: RayPlacement,
) -> tuple[list[Callable[..., Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``create_env_fn``, ``collector_kwargs`` and ``remote_configs``, one per collector."""
    configs = placement.remote_configs
    values = {
        "create_env_fn": placement.create_env_fn,
        "collector_kwargs": placement.collector_kwargs or {},
        "remote_configs": _default_remote_config() if configs is None else configs,
    }
    given = placement.num_collectors
    count = None if given is None else check_int("num_collectors", given, 0) or None
    lengths = {name: len(v) for name, v in values.items() if isinstance(v, list | tuple)}
    if count is not None:  # 0 reads as None, as RayCollector's ``if num_collectors:``
        wrong = {name: n for name, n in lengths.items() if n != count}
        if wrong:
            raise ValueError(f"num_collectors is {count}, but these lists are not: {wrong}")
    elif len(set(lengths.values())) > 1:
        raise ValueError(
            f"create_env_fn, collector_kwargs and remote_configs are lists of different "
            f"lengths: {lengths}"
        )
    else:
        count = next(iter(lengths.values()), 1)
    if count < 1:
        raise ValueError("create_env_fn, collector_kwargs and remote_configs are empty lists")
    listed = {
        name: list(v) if isinstance(v, list | tuple) else [v] * count for name, v in values.items()
    }
    return (
        listed["create_env_fn"],
        _dicts("collector_kwargs", listed["collector_kwargs"]),
        _dicts("remote_configs", listed["remote_configs"]),
    )


def _dicts(name: str, items: list[Any]) -> list[dict[str, Any]]:
    """Copies of ``items``, each a mapping; TypeError naming ``name`` otherwise."""
    for item in items:
        if not isinstance(item, Mapping):
            raise TypeError(
                f"{name} must be a dict or a list of one dict per collector; it holds a "
                f"{type(item).__name__}: {item!r:.60}"
            )
    return [dict(item) for item in items]


def _default_remote_config() -> dict[str, Any]:
    """RayCollector's ``DEFAULT_REMOTE_CLASS_CONFIG`` (its ``None`` left out, as Ray's default)."""
    config: dict[str, Any] = {"num_cpus": 1, "memory": 2 * _GIB}
    if torch.cuda.is_available():
        config["num_gpus"] = 0.2
    return config


def _parallel(collector_class: Any) -> bool:
    """Whether a remote collector of ``collector_class`` steps its envs in subprocesses."""
    if collector_class is None:
        return False
    if isinstance(collector_class, str):
        if collector_class not in _PARALLEL:
            raise TypeError(
                f"collector_class {collector_class!r} is none of {sorted(_PARALLEL)} "
                "nor a TorchRL collector class"
            )
        return _PARALLEL[collector_class]
    names = [cls.__name__ for cls in getattr(collector_class, "__mro__", ())]
    for name in names:  # the nearest TorchRL collector class it derives from
        if name in _PARALLEL_CLASSES:
            return True
        if name in _SERIAL_CLASSES:
            return False
    raise TypeError(
        f"collector_class must be a TorchRL collector class (Collector, MultiSyncCollector, "
        f"MultiAsyncCollector or a subclass) or one of {sorted(_PARALLEL)}, "
        f"got {collector_class!r:.60}"
    )


def _warn_collector_kwargs(kwargs: Sequence[Mapping[str, Any]]) -> None:
    """Warn once per key of ``collector_kwargs`` that has no effect on the actors."""
    keys = sorted({str(key) for one in kwargs for key in one} - _OVERWRITTEN)
    for key in keys:
        warnings.warn(
            f"GrpcCollector: collector_kwargs[{key!r}] has no effect on the actors placed on "
            "Ray (each steps its envs as TorchRL's Collector; the fleet's own settings rule)",
            UserWarning,
            stacklevel=4,
        )
