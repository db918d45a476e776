"""Test harness for the TorchRL-env actor: a fleet's batches beside TorchRL ``Collector``'s.

:func:`fleet_batches` runs a real actor server on loopback and a real learner
(``GrpcCollector``); :func:`torchrl_batches` runs TorchRL 0.14.1's ``Collector`` on the
same env factory, policy factory and seed; :func:`assert_equal_batches` holds them
equal in keys, nesting, dtypes, shapes, names and values. Only what rlfleet adds may
differ: ``("collector", "traj_ids")`` are unique across the fleet (their boundaries
must be TorchRL's) and the learner adds ``("collector", "worker_id")``.

Factories are named ``module:function`` or, for ``rlfleet_test_torchrl``, by function
name alone; the policy ``"random"`` is the actor's random policy (TorchRL's ``None``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs import EnvBase, SerialEnv
from torchrl.envs.llm.transforms import PolicyVersion

from actor_service import ActorConfig, ModelSpec, create_server
from actor_service._core._settings import EnvPoolSettings
from learner_client import GrpcCollector

TRAJ_IDS = ("collector", "traj_ids")
RLFLEET_ONLY = {TRAJ_IDS, ("collector", "worker_id")}


def factory_path(name: str) -> str:
    """``name`` as an actor loads it: ``module:function`` (``rlfleet_test_torchrl`` by default)."""
    return name if name == "random" or ":" in name else f"rlfleet_test_torchrl:{name}"


def load(name: str) -> Callable[..., Any]:
    """The factory ``name`` names (see :func:`factory_path`)."""
    module, _, function = factory_path(name).partition(":")
    return getattr(importlib.import_module(module), function)


def torchrl_config(
    env: str = "cartpole",
    policy: str = "greedy_policy",
    policy_kwargs: dict[str, Any] | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
    env_backend: str = "sync",
    **overrides: Any,
) -> ActorConfig:
    """A TorchRL-env actor of 2 envs, seed 0, on port 0."""
    pool = EnvPoolSettings(
        env_factory=factory_path(env), env_kwargs=env_kwargs or {}, env_backend=env_backend
    )
    base: dict[str, Any] = {
        "kind": "torchrl",
        "port": 0,
        "env_pool": pool,
        "num_envs": 2,
        "seed": 0,
        "grace_period": 2.0,
        "models": (ModelSpec(factory=factory_path(policy), kwargs=policy_kwargs or {}),),
    }
    return ActorConfig(**(base | overrides))


@contextlib.contextmanager
def greedy_cartpole_actor() -> Iterator[str]:
    """A real actor of :func:`torchrl_config`'s CartPole and greedy policy, by its address."""
    with create_server(torchrl_config("cartpole", "greedy_policy")).run_in_thread() as handle:
        yield f"127.0.0.1:{handle.port}"


def greedy_cartpole_policy() -> Any:
    """The learner's copy of that actor's policy (the same factory, the same seed)."""
    return load("greedy_policy")(load("cartpole")())


def fleet_batches(
    config: ActorConfig, batches: int, frames_per_batch: int = 60, **settings: Any
) -> list[TensorDict]:
    """``batches`` batches of one actor started from ``config``, through a ``GrpcCollector``."""
    with create_server(config).run_in_thread() as actor:
        address = f"127.0.0.1:{actor.port}"
        with GrpcCollector([address], frames_per_batch=frames_per_batch, **settings) as collector:
            return [collector.next() for _ in range(batches)]


def torchrl_batches(
    env: str,
    policy: str,
    batches: int,
    frames_per_batch: int = 60,
    num_envs: int | None = 2,
    reset_after_seed: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    policy_kwargs: dict[str, Any] | None = None,
    **settings: Any,
) -> list[TensorDict]:
    """TorchRL's ``Collector`` on ``SerialEnv(num_envs, env)`` (the env itself for None).

    ``reset_after_seed``: reset the envs once torch is seeded, as the actor does, for envs
    whose reset draws from torch's generator (the collector's own reset came before).
    """
    make = functools.partial(load(env), **(env_kwargs or {}))
    # The policy's env first: building an env may draw from global generators (VMAS does).
    module = None if policy == "random" else load(policy)(make(), **(policy_kwargs or {}))
    pool: EnvBase = make() if num_envs is None else SerialEnv(num_envs, make)
    pool.set_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's advisories (InitTracker), not ours
        collector = Collector(
            pool,
            module,
            frames_per_batch=frames_per_batch,
            track_policy_version=PolicyVersion(),
            **settings,
        )
    # The actor seeds torch once its envs are seeded; TorchRL's Collector may call the
    # policy while it is built (OU noise draws then), so torch is seeded after that.
    torch.manual_seed(0)
    if reset_after_seed:
        collector.reset()
    try:
        iterator = iter(collector)
        return [next(iterator) for _ in range(batches)]
    finally:
        collector.shutdown()


def leaves(batch: TensorDict) -> dict[Any, torch.Tensor]:
    """Every leaf of ``batch`` by its nested key."""
    return dict(batch.items(include_nested=True, leaves_only=True))


def assert_equal_batches(ours: TensorDict, theirs: TensorDict, *, split: bool = False) -> None:
    """Equal keys, nesting, dtypes, shapes, names and values, but for what rlfleet adds."""
    mine, reference = leaves(ours), leaves(theirs)
    assert set(mine) - set(reference) == {("collector", "worker_id")}
    assert set(reference) <= set(mine)
    assert ours.batch_size == theirs.batch_size
    # The learner names the last dim "time" on every batch (learner_client/_rounds.py),
    # split ones included; TorchRL's split_trajectories leaves it unnamed once it splits.
    assert ours.names == (theirs.names if not split else [None, "time"])
    for key, value in reference.items():
        assert (mine[key].dtype, mine[key].shape) == (value.dtype, value.shape), key
        if key not in RLFLEET_ONLY:
            assert torch.equal(mine[key], value), key
    # Split batches pad with id 0, which may be one of TorchRL's ids: compare inside the mask.
    valid = ours.get(("collector", "mask"))[:, 1:] if split else True
    ids, their_ids = ours.get(TRAJ_IDS), theirs.get(TRAJ_IDS)
    ends, their_ends = ids[:, 1:] != ids[:, :-1], their_ids[:, 1:] != their_ids[:, :-1]
    assert torch.equal(ends & valid, their_ends & valid)


def any_done(batches: list[TensorDict]) -> bool:
    """Whether any done key under ``"next"`` (nested ones included) is set in ``batches``."""
    return any(
        bool(value.any())
        for batch in batches
        for key, value in batch["next"].items(True, True)
        if (key if isinstance(key, str) else key[-1]) == "done"
    )


def assert_strings_follow_steps(nt: list[str], next_nt: list[str]) -> None:
    """``TestCollectorsNonTensor``'s check: each string follows the step it names."""
    for i, value in enumerate(nt[1:]):
        if value == "a string! - 1":
            assert nt[i] == "reset!"
        elif value.startswith("a string!"):
            assert next_nt[i] == value
            assert int(nt[i].split(" - ")[-1]) + 1 == int(value.split(" - ")[-1])
        elif value == "reset!":
            assert next_nt[i + 1] == "a string! - 1", i
