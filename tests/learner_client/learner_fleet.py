"""Helpers of the GrpcCollector tests: actor subprocesses, CartPole policies, thread snapshots,
settings at the collector's defaults, the LLM collector tests' tiny fleet.

Import them as ``from learner_fleet import ...`` (a unique module name: ``conftest``
is ambiguous across test directories). The fixtures live in ``conftest.py``, which imports
this module before any test module: the actor tests' factories are importable from then on.
``FLEET_ARGS`` describes the shared fleet: three CartPole actors (2 envs each)
started through the ``rlfleet-actor`` command line; worker_ids 0 and 2 hold the
default MLP policy plus a ``critic`` model, worker_id 1 holds a narrower MLP (a
different architecture, so a push of the others' weights is rejected there).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import os
import pathlib
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import gymnasium
import torch
from helpers import ActorProcess, start_actor
from torch import nn

from common.policies import make_policy
from learner_client import GrpcCollector, GrpcLLMCollector, LocalFleet
from learner_client._settings import BatchSettings, ConnectionSettings, RolloutSettings

#: The actor tests' folder, whose env and policy factories (``rlfleet_test_torchrl``,
#: ``rlfleet_test_envs``) these tests' actors build and their learners import: it is on
#: this process's path once this module is imported, and ``ACTOR_ENV`` puts it on an actor's.
ACTOR_TESTS = pathlib.Path(__file__).resolve().parents[1] / "actor_service"
#: The environment of an actor that imports those factories.
ACTOR_ENV = {"PYTHONPATH": os.pathsep.join([str(ACTOR_TESTS), os.environ.get("PYTHONPATH", "")])}
if str(ACTOR_TESTS) not in sys.path:
    sys.path.insert(0, str(ACTOR_TESTS))

FLEET_ARGS = [
    ["--worker-id", "0", "--num-envs", "2", "--seed", "10", "--model", "critic=mlp"],
    ["--worker-id", "1", "--num-envs", "2", "--seed", "11", "--policy-kwargs", '{"hidden": [16]}'],
    ["--worker-id", "2", "--num-envs", "2", "--seed", "12", "--model", "critic=mlp"],
]


def start_actors(
    args: Sequence[Sequence[str]], env: Mapping[str, str] | None = None
) -> list[ActorProcess]:
    """Start several actors at once (each takes seconds to import torch).

    Args:
        args: The command-line flags of each actor.
        env: Extra environment variables of every actor.
    """
    with concurrent.futures.ThreadPoolExecutor(len(args)) as pool:
        futures = [pool.submit(start_actor, list(a), env=env) for a in args]
        actors, errors = [], []
        for future in futures:
            try:
                actors.append(future.result())
            except BaseException as exc:
                errors.append(exc)
    if errors:
        for actor in actors:
            actor.close()
        raise errors[0]
    return actors


def cartpole_policy(action: int | None = None, hidden: Sequence[int] = (64, 64)) -> nn.Module:
    """The actors' MLP policy for CartPole; with ``action`` set it always picks that action."""
    env = gymnasium.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space, hidden=tuple(hidden))
    env.close()
    if action is not None:
        with torch.no_grad():
            for param in policy.parameters():
                param.zero_()
            last = [m for m in policy.modules() if isinstance(m, nn.Linear)][-1]
            last.bias[action] = 5.0
    return policy


def live_threads() -> set[threading.Thread]:
    """Live threads, minus the stdout readers of actor subprocesses started by the tests.

    gRPC starts one process-wide poller thread on its first ``grpc.aio`` call; take a
    baseline after a collector has run once.
    """
    return {t for t in threading.enumerate() if "_pump" not in t.name}


S = TypeVar("S")

#: ``GrpcCollector``'s parameters: the one home of the defaults its settings are built with.
_COLLECTOR_PARAMETERS = inspect.signature(GrpcCollector.__init__).parameters


class StuckBuffer:
    """A user's buffer whose ``extend`` blocks until released (a slow disk, a lock)."""

    def __init__(self) -> None:
        from torchrl.data import LazyTensorStorage, ReplayBuffer  # the tests' extra, not conftest's

        self.inner = ReplayBuffer(storage=LazyTensorStorage(10_000))
        self.entered, self.release = threading.Event(), threading.Event()

    def extend(self, data: Any) -> Any:
        """Wait for ``release`` (30 s at most), then store ``data``."""
        self.entered.set()
        self.release.wait(30)
        return self.inner.extend(data)


def _collector_settings(cls: type[S], **given: Any) -> S:
    """``cls`` (``BatchSettings``, ``RolloutSettings``, ``ConnectionSettings``) as
    ``GrpcCollector`` builds it: every field not ``given`` at the collector's default."""
    defaults = {
        field.name: _COLLECTOR_PARAMETERS[field.name].default
        for field in dataclasses.fields(cls)  # type: ignore[arg-type]
        if field.name in _COLLECTOR_PARAMETERS and field.name not in given
    }
    return cls(**{k: v for k, v in defaults.items() if v is not inspect.Parameter.empty}, **given)


def batch_settings(**given: Any) -> BatchSettings:
    """A ``BatchSettings`` at ``GrpcCollector``'s defaults but for ``given``."""
    return _collector_settings(BatchSettings, **given)


def rollout_settings(**given: Any) -> RolloutSettings:
    """A ``RolloutSettings`` at ``GrpcCollector``'s defaults but for ``given``."""
    return _collector_settings(RolloutSettings, **given)


def connection_settings(**given: Any) -> ConnectionSettings:
    """A ``ConnectionSettings`` at ``GrpcCollector``'s defaults but for ``given``."""
    return _collector_settings(ConnectionSettings, **given)


#: The tiny offline language model of the LLM collector tests' actors.
TINY_LLM = {"hidden": 32, "layers": 1, "seed": 0}


def tiny_llm_fleet(actors: int, slots: int = 4, **task_kwargs: Any) -> LocalFleet:
    """``actors`` LLM actors of ``slots`` chat slots on the ``arith`` task, the tiny model."""
    return LocalFleet(
        actors,
        kind="llm",
        task="arith",
        task_kwargs=task_kwargs,
        policy="rlfleet:tiny-qwen2",
        policy_kwargs=TINY_LLM,
        num_envs=slots,
        seed=0,
        grace_period=1.0,
    )


def tiny_llm_collector(fleet: LocalFleet, **kw: Any) -> GrpcLLMCollector:
    """A ``GrpcLLMCollector`` on ``fleet``: three new tokens a turn, a 60 s batch timeout."""
    kw.setdefault("generation", {"max_new_tokens": 3})
    kw.setdefault("batch_timeout", 60.0)
    return GrpcLLMCollector(fleet.addresses, **kw)
