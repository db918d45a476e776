"""A collection core's state dict (GetState / LoadState): its layout and its counters.

:func:`core_state` builds the nested dict every core's ``state_dict()`` starts from,
:func:`core_counters` checks the counters of one a peer sent back, and
:func:`encode_state` writes a core's state as the actor-state file of
:mod:`common.actor_state` (whose :func:`decode_state` and :func:`state_to_blob` are
re-exported here).
"""

from __future__ import annotations

from typing import Any, Protocol

from common.actor_state import STATE_FORMAT, decode_state, state_to_blob
from common.errors import WeightsError
from common.weights import check_policy_version

__all__ = [
    "MAX_RESTORED_COUNT",
    "STATE_FORMAT",
    "StateHolder",
    "core_counters",
    "core_state",
    "decode_state",
    "encode_state",
    "state_to_blob",
]

# Only the low 32 bits of the trajectory counter make an id (``TrajIds``).
_TRAJ_COUNTER_MASK = 0xFFFF_FFFF

#: The largest frames or batches count a restored state may carry: the actor counts on
#: from it, and its metrics (float64 counters) stay exact up to 2**53, decades of frames.
MAX_RESTORED_COUNT = 2**53


def core_state(models: dict[str, Any], frames: int, batches: int, traj_counter: int) -> dict:
    """A collection core's state dict, env or LLM: its models' state and its counters.

    Layout: ``{"models": {model_id: {"version": int, "weights": {key: tensor}}},
    "frames": int, "batches": int, "traj_counter": int}``.
    """
    return {"models": models, "frames": frames, "batches": batches, "traj_counter": traj_counter}


def core_counters(state: object, sections: frozenset[str] = frozenset()) -> dict[str, int]:
    """The counters of a :func:`core_state` a peer sent back, checked before anything is applied.

    Args:
        state: The state.
        sections: The keys this kind of core adds to :func:`core_state`'s (a TorchRL env's
            ``"env"``); any other key is refused, not ignored (a state of another kind of
            actor would be restored in part).

    Returns:
        ``{"frames", "batches", "traj_counter"}``; the trajectory counter keeps the 32 bits
        an id uses, so it never overflows int64.

    Raises:
        WeightsError: Not a dict, an unknown key, a counter that is not an int in the
            int64 range (the range of policy versions), or frames or batches above
            :data:`MAX_RESTORED_COUNT` (counting on would leave int64).
    """
    if not isinstance(state, dict):
        raise WeightsError(f"actor state must be a dict, got {type(state).__name__}")
    known = {"models", "frames", "batches", "traj_counter", *sections}
    unknown = sorted(str(key)[:64] for key in state if key not in known)
    if unknown:
        raise WeightsError(
            f"actor state keys {unknown[:5]} are not this actor's (it holds {sorted(known)}): "
            "a state of another kind of actor?"
        )
    counters = {
        key: check_policy_version(state.get(key), f"actor state {key!r}")
        for key in ("frames", "batches", "traj_counter")
    }
    for key in ("frames", "batches"):
        if counters[key] > MAX_RESTORED_COUNT:
            raise WeightsError(
                f"actor state {key!r} {counters[key]} is above {MAX_RESTORED_COUNT} (2**53): "
                "an actor counts on from it"
            )
    counters["traj_counter"] &= _TRAJ_COUNTER_MASK
    return counters


class StateHolder(Protocol):
    """What :func:`encode_state` reads: a collection core's whole state."""

    def state_dict(self) -> dict[str, Any]:
        """The state ``GetState`` sends (see :func:`core_state`)."""
        ...


def encode_state(core: StateHolder) -> bytes:
    """Serialise ``core.state_dict()`` (runs on the collection thread)."""
    return state_to_blob(core.state_dict())
