"""Multi-part pushes: one version of a model sent as parts by several learner ranks.

When no learner process holds every parameter (sharded training: FSDP2, tensor or
pipeline parallel), each rank pushes the tensors it holds as one *part* of an agreed
version: ``part=(index, count)``. The actor checks each part as it checks a push,
stages it, and applies the version whole, under the model's lock, when its ``count``
parts arrived; until then the previous version stays in force.

:class:`Part` is the one rule of what a part is, for the learner's arguments and the
actor's reading of ``WeightsHeader.part`` alike; :class:`PushOutcome` is what an
actor did with a push (``PushWeightsResponse.outcome``).
"""

from __future__ import annotations

import dataclasses
import enum

from common.errors import WeightsError

__all__ = ["MAX_PARTS", "Part", "PushOutcome"]

#: The most parts one version may be split into (learner ranks pushing one model).
MAX_PARTS = 4096


class PushOutcome(enum.Enum):
    """What an actor did with one push.

    Attributes:
        APPLIED: A whole push (not a part): its version is in force.
        STAGED: A part, checked and staged; its version applies when its last part arrives.
        COMPLETED: The last part of its version, which is now in force, whole.
    """

    APPLIED = "applied"
    STAGED = "staged"
    COMPLETED = "completed"


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of a multi-part push: ``index`` of ``count``.

    Attributes:
        index: This part's index, in ``[0, count)``.
        count: How many parts the version has, ``1..MAX_PARTS``; every part of it agrees.

    Raises:
        WeightsError: A count outside ``1..MAX_PARTS`` or an index outside
            ``[0, count)`` (a ``ValueError``; INVALID_ARGUMENT on the wire).
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        for name in ("index", "count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise WeightsError(f"part {name} must be an int, got {value!r:.80}")
        if not 1 <= self.count <= MAX_PARTS:
            raise WeightsError(f"part count {self.count} is outside 1..{MAX_PARTS}")
        if not 0 <= self.index < self.count:
            raise WeightsError(f"part index {self.index} is outside [0, {self.count})")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
