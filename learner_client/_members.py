"""The actors of a fleet as the learner knows them: what the checks need, who owns which.

A :class:`FleetMember` is an actor as Describe reported it, reduced to what the fleet checks
(:func:`learner_client._settings.check_fleet`) need. Env collectors need env actors, LLM
collectors LLM actors within their ``max_new_tokens_cap``: checking the kind when the fleet
is admitted turns a mix-up into a ``ValueError`` naming the actors, instead of a refused
session later.

Several learner ranks can share one fleet. A data-parallel learner (DDP under ``torchrun``)
runs one ``GrpcCollector`` per rank, and :class:`Ranks` is a collector's place among them:
rank ``r`` of ``world_size`` *owns* the actors whose ``worker_id % world_size == r``. It
still describes and keeps a link to every *member* of the fleet (every address it was given
or DNS resolved), but opens collection sessions and sends replicated pushes only to the
actors it owns. The rule is a function of the worker_id alone, so it holds as actors join
and leave, with no coordination. How ranks agree on the versions they push:
:mod:`learner_client._pushes`.

One actor's saved state, as ``GrpcCollector.actor_state`` reads it, is decoded here too
(:func:`actor_state_of`, as strict as a weight push: no pickle, finite values). It holds
``models`` (``{model_id: {"version", "weights"}}``), the counters (``frames``, ``batches``,
``traj_counter``) and, on a TorchRL-env actor, ``env``: its env's ``state_dict()``
(``VecNorm``'s running statistics, ``ObservationNorm``'s ``loc``/``scale``...), nested by
the env's own module names (``worker0`` for the first env of a pool).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from common.actor_state import decode_state
from common.config import DEFAULT_MODEL_ID, as_int, same_device
from common.errors import UnknownWorkerError
from common.llm import LLMSettings

__all__ = [
    "FROM_ENV",
    "FleetMember",
    "Ranks",
    "actor_state_of",
    "check_devices",
    "check_kinds",
    "check_unique",
]


@dataclasses.dataclass(frozen=True)
class FleetMember:
    """What the fleet checks need to know about one actor.

    Attributes:
        address: ``host:port``.
        worker_id: The id the actor reported.
        num_envs: Its env pool size (LLM actors: chat slots).
        models: The model_ids it holds.
        kind: ``"env"``, ``"torchrl"`` (an env actor on a TorchRL env) or ``"llm"``.
        max_new_tokens_cap: An LLM actor's cap on new tokens per turn.
        device: Where its policy runs.
        env: The env id it collects from (an LLM actor's task).
        spaces: A digest of its observation and action spaces ("" when it reports none).
        epoch: Its epoch (random, new at each start: one process, one epoch; 0 if unknown).
    """

    address: str
    worker_id: int
    num_envs: int
    models: tuple[str, ...] = (DEFAULT_MODEL_ID,)
    kind: str = "env"
    max_new_tokens_cap: int = 0
    device: str = "cpu"
    env: str = ""
    spaces: str = ""
    epoch: int = 0


def check_one_env(members: Sequence[FleetMember], why: str) -> None:
    """Refuse actors whose spaces lay batches out otherwise, where ``why`` needs one layout.

    Spaces as Describe reports them (``FleetMember.spaces``): another observation or action
    shape, dtype or count. Names and bounds may differ.

    Raises:
        ValueError: Naming each actor unlike the first and what it serves.
    """
    first = members[0]
    other = [m for m in members if m.spaces != first.spaces]
    if other:
        detail = ", ".join(
            f"{m.address} (worker_id {m.worker_id}) serves {m.env!r}" for m in other[:8]
        )
        raise ValueError(
            f"{why} needs every actor's spaces alike (shapes, dtypes, action counts), like "
            f"{first.address}'s (worker_id {first.worker_id}, {first.env!r}), but {detail} "
            "with other spaces: start them with one env, or collect with cat_results='stack' "
            "and split_trajs=False (a lazy stack)"
        )


def check_unique(members: Sequence[FleetMember]) -> None:
    """Refuse two actors reporting one worker_id.

    Raises:
        ValueError: Naming each shared worker_id, its addresses and the fix.
    """
    by_id: dict[int, list[FleetMember]] = {}
    for member in members:
        by_id.setdefault(member.worker_id, []).append(member)
    duplicates = {wid: alike for wid, alike in by_id.items() if len(alike) > 1}
    if duplicates:
        detail = "; ".join(
            f"worker_id {wid} at {[m.address for m in alike]} ({_why_twice(alike)})"
            for wid, alike in sorted(duplicates.items())
        )
        raise ValueError(f"worker_ids must be unique across the fleet: {detail}")


def _why_twice(alike: Sequence[FleetMember]) -> str:
    """Why one worker_id answers at several addresses, and the fix (one epoch: one process)."""
    if len({m.epoch for m in alike}) == 1:
        return (
            "one actor reached at each address: list it once; a dns: name with both IPv4 "
            "and IPv6 records (a dual-stack Service) lists every actor twice: give it one "
            "IP family"
        )
    return (
        "several actors report it: start each with its own --worker-id, or wait until an "
        "old copy's address stops answering"
    )


def check_kinds(members: Sequence[FleetMember], llm: LLMSettings | None) -> None:
    """Env collectors need env actors; LLM collectors LLM actors within their token caps."""
    want = "env" if llm is None else "llm"
    # A TorchRL-env actor collects env batches too: an env collector takes it.
    kinds = ("env", "torchrl") if llm is None else ("llm",)
    wrong = [m for m in members if m.kind not in kinds]
    if wrong:
        detail = ", ".join(f"{m.address} (worker_id {m.worker_id}) is {m.kind!r}" for m in wrong)
        use = "GrpcCollector" if llm is None else "GrpcLLMCollector"
        raise ValueError(f"{use} needs {want} actors, but {detail}")
    if llm is None:
        return
    over = [m for m in members if llm.generation.max_new_tokens > m.max_new_tokens_cap]
    if over:
        detail = ", ".join(
            f"{m.address} (worker_id {m.worker_id}) caps it at {m.max_new_tokens_cap}" for m in over
        )
        raise ValueError(
            f"max_new_tokens={llm.generation.max_new_tokens} is above an actor's cap: {detail}"
        )


def check_devices(members: Sequence[FleetMember], policy_device: str, cudagraph: bool) -> None:
    """The actors run their policy on ``policy_device`` (if named); no CUDA graphs asked.

    The actors refuse such sessions themselves (FAILED_PRECONDITION); checking what
    Describe reported turns the mistake into an error at construction.

    Raises:
        ValueError: Naming each actor on another device, its device and the one asked;
            ``cudagraph`` (naming what does the job).
    """
    if policy_device:
        wrong = [m for m in members if not same_device(policy_device, m.device)]
        if wrong:
            detail = ", ".join(f"worker_id {m.worker_id} runs it on {m.device}" for m in wrong)
            raise ValueError(
                f"policy_device={policy_device!r}, but {detail}: start the actors with "
                f"--device {policy_device} (an actor never moves its policy)"
            )
    if cudagraph:  # on any device: the actors refuse such sessions too
        raise ValueError(
            "cudagraph_policy is not supported: actors do not capture their policy in CUDA "
            "graphs; compile_policy={'mode': 'reduce-overhead'} uses them on CUDA actors"
        )


# ------------------------------------------------------------------- ranks

#: The one value of ``rank`` that reads the rank and world size from torch.distributed.
FROM_ENV = "env"


@dataclasses.dataclass(frozen=True)
class Ranks:
    """A collector's place among the learner ranks that share one fleet.

    Attributes:
        rank: This collector's rank, in ``[0, world_size)``.
        world_size: Learner ranks sharing the fleet (1: a single learner owns every actor).

    Raises:
        TypeError: A value that is not an int.
        ValueError: ``world_size < 1`` or ``rank`` outside ``[0, world_size)``.
    """

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        for name in ("rank", "world_size"):
            value = as_int(getattr(self, name))
            if value is None:
                raise TypeError(f"{name} must be an int, got {getattr(self, name)!r:.80}")
            object.__setattr__(self, name, value)  # a numpy int as an int
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")

    @classmethod
    def given(cls, rank: int | str | None, world_size: int | None) -> Ranks:
        """The public ``rank`` and ``world_size`` arguments, checked.

        Both None: a single learner. ``rank="env"`` (world_size None) reads them from
        torch.distributed when it is initialised, else from ``RANK`` and ``WORLD_SIZE``
        (which ``torchrun`` sets).

        Raises:
            ValueError: One given without the other; ``"env"`` outside torchrun; a value
                out of range.
            TypeError: A value of the wrong type.
        """
        if rank is None and world_size is None:
            return cls()
        if rank == FROM_ENV:
            if world_size is not None:
                raise ValueError('rank="env" reads world_size too: leave world_size=None')
            return cls(*_from_environment())
        if rank is None or world_size is None:
            raise ValueError(
                f"pass rank and world_size together (got rank={rank!r}, "
                f'world_size={world_size!r}), or rank="env" under torchrun'
            )
        if isinstance(rank, str):
            raise TypeError(f'rank must be an int or "env", got {rank!r:.80}')
        ranks = cls(rank, world_size)
        ranks.warn_unlike_environment()
        return ranks

    def warn_unlike_environment(self) -> None:
        """Warn when torchrun (or torch.distributed) has this process at another rank.

        Ranks given by hand in a world of the same size should be the process's own: two
        processes given ``rank=0`` would collect from the same actors and push alone.
        """
        try:
            rank, world = _from_environment()
        except ValueError:
            return  # not under torchrun: ranks by hand are the only ones
        if world == self.world_size and rank != self.rank:
            warnings.warn(
                f"rank={self.rank} was given, but this process is rank {rank} of {world} "
                'under torch.distributed: pass rank="env" (or its own rank), else two '
                "processes act as one rank",
                UserWarning,
                stacklevel=4,
            )

    def unsharded_hint(self) -> str:
        """A hint for an actor busy with another learner, when the others may be ranks.

        This collector claims every actor (no ``rank``) while torchrun (or
        torch.distributed) runs several ranks, whose collectors claim them too. "" otherwise.
        """
        if self.world_size > 1:
            return ""
        try:
            world = _from_environment()[1]
        except ValueError:
            return ""
        if world <= 1:
            return ""
        return (
            f" (this collector claims every actor, and {world} learner ranks run: pass "
            'rank="env" so that each rank owns its share)'
        )

    def owns(self, worker_id: int) -> bool:
        """Whether this rank collects from and pushes to the actor ``worker_id``."""
        return worker_id % self.world_size == self.rank

    def check_owns_some(self, member_ids: Sequence[int]) -> None:
        """Refuse a fleet in which this rank owns no actor.

        Raises:
            ValueError: Naming the rule and the worker_ids of the fleet.
        """
        if self.world_size > 1 and not any(self.owns(w) for w in member_ids):
            raise ValueError(
                f"rank {self.rank} of {self.world_size} owns no actor: it owns the worker_ids "
                f"w with w % {self.world_size} == {self.rank}, and the fleet has worker_ids "
                f"{sorted(member_ids)}"
            )

    def warn_unowned(self, fleet_ids: Sequence[int]) -> None:
        """Warn when this rank owns only some actors of a fleet object it was given.

        A fleet started in this rank's process (``LocalFleet`` per rank) is reached by no
        other rank unless its addresses are passed on, so the actors the rule gives to
        other ranks would idle; per-rank fleets need ids this rank owns.
        """
        idle = [w for w in fleet_ids if not self.owns(w)]
        if self.world_size > 1 and idle:
            r, n = self.rank, self.world_size
            warnings.warn(
                f"rank {r} of {n} owns the actors with worker_id % {n} == {r}: its fleet's "
                f"actors {idle} idle unless other ranks are given their addresses. A fleet "
                f"per rank takes ids this rank owns: LocalFleet(k, ..., "
                f"worker_ids=[{r} + {n} * i for i in range(k)])",
                UserWarning,
                stacklevel=3,
            )

    def learner_id(self, learner_id: str) -> str:
        """The identity a rank opens sessions with: ``<learner_id>/rank<r>`` when sharded.

        Each rank needs its own identity on the actors (one's sessions are never another's
        to resume); an empty id stays empty (a unique one is drawn).
        """
        if self.world_size == 1 or not learner_id:
            return learner_id
        return f"{learner_id}/rank{self.rank}"


def _from_environment() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed, else from torchrun's variables."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None or not rank.isdigit() or not world.isdigit():
        raise ValueError(
            'rank="env" needs torch.distributed initialised or RANK and WORLD_SIZE set (as '
            f"torchrun sets them); got RANK={rank!r}, WORLD_SIZE={world!r}"
        )
    return int(rank), int(world)


# ------------------------------------------------------------ actor state


def actor_state_of(
    workers: Mapping[int, torch.Tensor], worker_id: int, fleet: Collection[int] = ()
) -> dict[str, Any]:
    """The decoded state of ``worker_id`` among ``workers`` (``state_dict()["workers"]``).

    ``fleet``: the worker_ids an unknown one is told of, when ``workers`` holds fewer.

    Raises:
        UnknownWorkerError: ``worker_id`` is not in ``workers``.
        WeightsError: The blob is not a well-formed actor-state file.
    """
    if worker_id not in workers:
        raise UnknownWorkerError(
            f"worker_id {worker_id!r} is not in the fleet {sorted(fleet or workers)}"
        )
    return decode_state(workers[worker_id].numpy().tobytes())
