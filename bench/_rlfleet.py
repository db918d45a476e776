"""The rlfleet side of the benchmarks: a local actor fleet and collectors on it.

Actors are real ``python -m actor_service`` subprocesses started by
``LocalFleet``; the learner side is ``GrpcCollector`` in the benchmark's
process, exactly as a training script runs them on one machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from learner_client import GrpcCollector, LocalFleet

__all__ = ["GrpcCollector", "LocalFleet", "collector", "fleet"]


def fleet(
    num_actors: int,
    *,
    env: str = "CartPole-v1",
    env_factory: str = "",
    num_envs: int = 8,
    policy: str = "mlp",
    policy_kwargs: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    seed: int = 1,
) -> Any:
    """A ``LocalFleet`` of ``num_actors`` actors with one torch thread each (not started).

    ``env_factory`` (``"pkg.mod:fn"``) replaces ``env`` when given.
    """
    args = ["--torch-threads", "1", *extra_args]
    if env_factory:
        args += ["--env-factory", env_factory]
    return LocalFleet(
        num_actors,
        env,
        num_envs=num_envs,
        policy=policy,
        policy_kwargs=policy_kwargs,
        seed=seed,
        extra_args=args,
        start_timeout=180.0,
    )


def collector(addresses: Sequence[str], *, sync: bool, frames_per_batch: int, **kwargs: Any) -> Any:
    """An endless ``GrpcCollector`` on ``addresses`` with generous deadlines (a busy machine)."""
    kwargs.setdefault("connect_timeout", 60.0)
    kwargs.setdefault("call_timeout", 120.0)
    kwargs.setdefault("batch_timeout", 120.0)
    return GrpcCollector(
        list(addresses), frames_per_batch=frames_per_batch, total_frames=-1, sync=sync, **kwargs
    )
