"""TorchRL anchors: the env constructions and policies the benchmarks run in TorchRL's collectors.

Env constructors are module-level functions (TorchRL starts its workers with
``spawn``, so they must pickle by reference). For CartPole the candidate env
layouts per worker are:

- ``"gym"``: ``GymEnv("CartPole-v1", num_envs=N)`` (gymnasium's AsyncVectorEnv,
  one subprocess per env);
- ``"gym_sync"``: ``GymWrapper(gymnasium.vector.SyncVectorEnv(N))`` (one batched
  env stepped in the worker);
- ``"serial"``: ``SerialEnv(N, GymEnv("CartPole-v1"))``;
- ``"parallel"``: ``ParallelEnv(N, GymEnv("CartPole-v1"))`` (one subprocess per env).

The benchmarks try them and keep the fastest, so TorchRL is measured at its
best on this machine. This module imports torchrl: only bench scripts use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import EnvBase, GymEnv, GymWrapper, ParallelEnv, SerialEnv

__all__ = [
    "CARTPOLE_LAYOUTS",
    "cartpole_env",
    "make_collector",
    "pixel_env",
]

CARTPOLE_LAYOUTS = ("gym_sync", "serial", "gym", "parallel")


def _single_cartpole() -> EnvBase:
    return GymEnv("CartPole-v1")


def _make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def _sync_vector(fns: list[Callable[[], gymnasium.Env]]) -> gymnasium.vector.SyncVectorEnv:
    # TorchRL refuses gymnasium's default NEXT_STEP autoreset; with DISABLED it resets itself.
    return gymnasium.vector.SyncVectorEnv(
        fns, autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED
    )


def _cartpole(layout: str, num_envs: int) -> EnvBase:
    if layout == "gym":
        return GymEnv("CartPole-v1", num_envs=num_envs)
    if layout == "gym_sync":
        return GymWrapper(_sync_vector([_make_cartpole] * num_envs))
    if layout == "serial":
        return SerialEnv(num_envs, _single_cartpole)
    if layout == "parallel":
        return ParallelEnv(num_envs, _single_cartpole)
    raise ValueError(f"unknown CartPole layout {layout!r}; use one of {CARTPOLE_LAYOUTS}")


def cartpole_env(layout: str, num_envs: int) -> Callable[[], EnvBase]:
    """A picklable constructor of ``num_envs`` CartPole-v1 envs in the given layout."""
    if layout not in CARTPOLE_LAYOUTS:
        raise ValueError(f"unknown CartPole layout {layout!r}; use one of {CARTPOLE_LAYOUTS}")
    return functools.partial(_cartpole, layout, num_envs)


def _pixels(num_envs: int, fresh: bool) -> EnvBase:
    from bench.envs import make_fresh_pixel_env, make_pixel_env

    make = make_fresh_pixel_env if fresh else make_pixel_env
    return GymWrapper(_sync_vector([make] * num_envs))


def pixel_env(num_envs: int, fresh: bool = False) -> Callable[[], EnvBase]:
    """A picklable constructor of ``num_envs`` synthetic pixel envs, batched in one worker.

    ``fresh``: every frame is new random data (:func:`bench.envs.make_fresh_pixel_env`).
    """
    return functools.partial(_pixels, num_envs, fresh)


def make_collector(
    sync: bool,
    env_fn: Callable[[], EnvBase],
    policy: Any,
    *,
    workers: int,
    frames_per_batch: int,
    **kwargs: Any,
) -> MultiSyncCollector | MultiAsyncCollector:
    """A TorchRL multi-process collector with ``workers`` workers, endless.

    ``frames_per_batch`` means what it means in TorchRL: the total over the
    workers (sync) or per batch of one worker (async), as in rlfleet.
    """
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    return cls(
        [env_fn] * workers,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=-1,
        num_sub_threads=1,
        num_threads=1,
        **kwargs,
    )
