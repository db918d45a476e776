"""Multi-part pushes on the learner: one rank's part of an agreed version, and what each actor did.

When no learner process holds every parameter (FSDP2, tensor or pipeline parallel),
each rank calls ``update_policy_weights_(its_tensors, version=v, part=(rank, world_size))``.
The push takes the collector's one push path (``learner_client._pushes``: encode once,
stream to every target, ``delta=`` and ``dtype=`` as for a whole push) with the part in
its header; each actor stages the part and applies version ``v`` whole once every rank's
part arrived (``actor_service._serve._parts``). Per worker, the call returns a
:class:`PartResult`: the part was staged, or it completed the version. A refusal raises
``WeightPushError`` as any push does, listing the workers that took the part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from common.errors import SessionStateError
from common.weights import Part, PushOutcome
from learner_client._transport import PushReply
from learner_client._weight_args import WeightRequest
from learner_client._weights import EncodedWeights

__all__ = ["PartResult", "as_parts", "check_parts_accepted", "part_result"]


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What one actor did with this rank's part of a multi-part push.

    Attributes:
        outcome: ``PushOutcome.STAGED`` (checked and held: the version applies when its
            last part arrives, or expires after the actor's part deadline) or
            ``PushOutcome.COMPLETED`` (this part was the last: the version is in force).
        version: The version the part belongs to.
        version_in_force: The actor's version once it took the part: ``version`` when
            completed, the one before while the version stages.
        parts_staged: The parts of ``version`` the actor held once it took this one.

    Example::

        results = collector.update_policy_weights_(shard, version=step, part=(rank, world))
        done = [w for w, r in results.items() if r.outcome is PushOutcome.COMPLETED]
    """

    outcome: PushOutcome
    version: int
    version_in_force: int
    parts_staged: int


class _Members(Protocol):
    def accepts_parts(self, worker_id: int) -> bool: ...


def check_parts_accepted(fleet: _Members, targets: Sequence[int]) -> None:
    """Refuse a part push before anything is sent if a target cannot stage parts.

    Raises:
        SessionStateError: Naming the workers whose actors predate multi-part pushes
            (an older one would take a part for a whole subset push).
    """
    lacking = [w for w in targets if not fleet.accepts_parts(w)]
    if lacking:
        raise SessionStateError(
            f"worker_ids {lacking} take no multi-part pushes (their Describe gives no part "
            f"deadline): run an rlfleet-actor that does, or push whole weights"
        )


def as_parts(encoded: Mapping[int, EncodedWeights], part: Part | None) -> dict[int, EncodedWeights]:
    """Each worker's push as ``part`` (a delta's full fallback too); unchanged if None."""
    if part is None:
        return dict(encoded)
    return {wid: _as_part(enc, part) for wid, enc in encoded.items()}


def _as_part(enc: EncodedWeights, part: Part) -> EncodedWeights:
    full = enc.full
    if full is None:
        return dataclasses.replace(enc, part=part)
    return dataclasses.replace(enc, part=part, full=lambda: dataclasses.replace(full(), part=part))


def part_result(reply: PushReply, request: WeightRequest) -> int | PartResult:
    """A worker's entry in ``update_policy_weights_``'s result: a version, or a part's result."""
    if request.part is None or request.version is None:
        return reply.version
    return PartResult(reply.outcome, request.version, reply.version, reply.parts_staged)
