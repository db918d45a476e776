"""A fleet restored from a checkpoint: every entry checked, then loaded by all actors or none.

``GrpcCollector.load_state_dict`` hands each listed actor the state blob it saved
(``LoadState``, a rollback of its versions allowed). What the learner can check it checks
before any actor is touched: the counters, the versions (each naming a model some actor
holds), the worker_ids, and each blob itself (decoded here as the actor will decode it).
What only an actor can check (its env pool's size, its model's shapes) may still refuse one
blob after others were loaded: the actors that took theirs are then given back the state
they held before the load (fetched first), and the refusal is raised. So a refused
checkpoint leaves the fleet as it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import torch

from common.actor_state import decode_state
from common.config import check_model_id
from common.weights import check_policy_version
from learner_client._description import ActorDescription
from learner_client._link import ActorLink
from learner_client._transport import ActorChannel

__all__ = [
    "check_models",
    "check_state",
    "check_versions",
    "load_states",
    "state_blobs",
    "state_weights",
]

log = logging.getLogger(__name__)


_KEYS = frozenset({"frames", "batches", "policy_version", "workers"})


def check_state(state_dict: object) -> Mapping[str, Any]:
    """A state_dict given to ``load_state_dict``: a mapping holding every key it restores.

    Raises:
        TypeError: Not a mapping (a list of per-actor states is TorchRL's RayCollector's).
        ValueError: Naming the keys it lacks.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"load_state_dict takes the dict state_dict() returned, got {type(state_dict).__name__}"
        )
    missing = _KEYS - set(state_dict)
    if missing:
        raise ValueError(f"state_dict lacks keys {sorted(missing)}")
    return state_dict


def state_blobs(workers: object) -> dict[int, bytes]:
    """A state_dict's ``workers`` entry as blobs by worker_id, each decoded once here.

    Raises:
        TypeError: Not a mapping of worker_ids, or a value that is not a CPU uint8 tensor
            or bytes.
        ValueError: A key that is not a worker_id.
        WeightsError: A blob that is not an actor state (truncated, damaged, not finite).
    """
    if not isinstance(workers, Mapping):
        raise TypeError(
            "state_dict['workers'] must map worker_ids to actor states (as state_dict() "
            f"returns), got {type(workers).__name__}"
        )
    blobs = {_worker_id(w): _as_bytes(value) for w, value in workers.items()}
    for blob in blobs.values():
        decode_state(blob, max_bytes=len(blob))
    return blobs


def state_weights(blob: bytes) -> dict[str, tuple[int, dict[str, torch.Tensor]]]:
    """The weights an actor state gives its models: ``{model_id: (version, {key: tensor})}``.

    Only models it holds a pushed version of (above 0): what the actor should hold from the
    load on, and be given again if it restarts (it comes back with its initial weights).
    """
    models = decode_state(blob, max_bytes=len(blob)).get("models")
    if not isinstance(models, dict):
        return {}
    return {
        str(model_id): (model["version"], model["weights"])
        for model_id, model in models.items()
        if isinstance(model, dict)
        and isinstance(model.get("version"), int)
        and model["version"] > 0
        and isinstance(model.get("weights"), dict)
    }


def check_versions(versions: object) -> dict[str, int]:
    """A state_dict's ``policy_version``: ``{model_id: version}``, each version in int64.

    Raises:
        ValueError: Naming the entry that is not a model id and a version.
    """
    if not isinstance(versions, Mapping):
        raise ValueError(f"policy_version must map model ids to versions, got {versions!r:.80}")
    for mid, version in versions.items():
        check_model_id(mid)
        check_policy_version(version, f"policy_version[{mid!r}]")
    return dict(versions)


def check_models(versions: Mapping[str, int], held: set[str]) -> None:
    """Refuse a checkpoint's versions of models no actor of the fleet holds.

    Raises:
        ValueError: Naming them and the fleet's models (a checkpoint of another fleet?).
    """
    unknown = sorted(set(versions) - held)
    if unknown:
        raise ValueError(
            f"state_dict's policy_version names models no actor holds: {unknown} (the "
            f"fleet's models: {sorted(held)}); is it another fleet's checkpoint?"
        )


async def load_states(
    links: Mapping[int, ActorLink[ActorChannel]], blobs: Mapping[int, bytes], timeout: float
) -> list[ActorDescription]:
    """Load every blob into its actor, or none; return the actors' descriptions after.

    Raises:
        RlfleetError: The first actor's refusal, once the others are back where they were.
    """
    channels = {w: links[w].channel for w in blobs}
    before = await asyncio.gather(*(c.get_state(timeout) for c in channels.values()))
    results = await asyncio.gather(
        *(channels[w].load_state(blob, timeout, allow_rollback=True) for w, blob in blobs.items()),
        return_exceptions=True,
    )
    refusals = [r for r in results if isinstance(r, BaseException)]
    if refusals:
        took = [w for w, r in zip(blobs, results, strict=True) if not isinstance(r, BaseException)]
        previous = dict(zip(blobs, before, strict=True))
        undone = await asyncio.gather(
            *(channels[w].load_state(previous[w], timeout, allow_rollback=True) for w in took),
            return_exceptions=True,
        )
        for w, outcome in zip(took, undone, strict=True):
            if isinstance(outcome, BaseException):
                log.error("worker_id %d keeps the refused checkpoint's state: %s", w, outcome)
        raise refusals[0]
    return list(await asyncio.gather(*(c.describe(timeout) for c in channels.values())))


def _worker_id(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    raise ValueError(f"state_dict['workers'] is keyed by worker_id ints, got {key!r:.40}")


def _as_bytes(value: Any) -> bytes:
    if (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.uint8
        and value.device.type == "cpu"
    ):
        return value.contiguous().numpy().tobytes()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"an actor state must be a CPU uint8 tensor or bytes, got {value!r:.60}")
