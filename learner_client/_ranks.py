"""Several learner ranks sharing one fleet: which actors a rank owns.

A data-parallel learner (DDP under ``torchrun``) runs one ``GrpcCollector`` per rank.
:class:`Ranks` is a collector's place among them: rank ``r`` of ``world_size`` *owns* the
actors whose ``worker_id % world_size == r``. It still describes and keeps a link to every
*member* of the fleet (every address it was given or DNS resolved), but opens collection
sessions and sends replicated pushes only to the actors it owns. The rule is a function of
the worker_id alone, so it holds as actors join and leave, with no coordination.

How ranks agree on the versions they push: :mod:`learner_client._agreement`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import torch

__all__ = ["FROM_ENV", "Ranks"]

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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r:.80}")
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
        return cls(rank, world_size)

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
