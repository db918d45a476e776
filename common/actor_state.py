"""The actor-state file of GetState / LoadState: a core's state dict as one safetensors blob.

A collection core's ``state_dict()`` is a nested dict of tensors and plain values
(counters, versions, seeds, RNG states, a TorchRL env's transform state). It travels
through :mod:`common.weights` as one safetensors file, never pickled:

* every tensor is stored under its path joined with ``/``; model weights end
  up as ``models/<model_id>/<name>`` because that is where the core keeps them;
  numpy arrays are stored as tensors too;
* the rest of the tree goes into the safetensors metadata as JSON under
  ``rlfleet.state``, with ``{"$tensor": path}``, ``{"$ndarray": path}`` and
  ``{"$tuple": [...]}`` markers where tensors, arrays and tuples were, and
  ``rlfleet.format = "actor-state/1"`` names the layout.

Decoding is as strict as weight decoding (size cap, dtype allow-list, finite
floats) and additionally checks that the skeleton and the tensors match one
to one, so a malformed file fails before anyone sees it. Actors write and read
these files; a learner reads them too (``GrpcCollector.actor_state``).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from common.errors import WeightsError
from common.weights import (
    DEFAULT_MAX_KEYS,
    DEFAULT_MAX_WEIGHT_BYTES,
    decode_weights,
    encode_weights,
)

__all__ = ["STATE_FORMAT", "decode_state", "state_to_blob"]

#: The value of the ``rlfleet.format`` metadata entry.
STATE_FORMAT = "actor-state/1"
_FORMAT_KEY = "rlfleet.format"
_TREE_KEY = "rlfleet.state"
_MAX_DEPTH = 32


def state_to_blob(state: dict[str, Any]) -> bytes:
    """Serialise a nested state dict into an actor-state safetensors blob.

    Raises:
        TypeError: A value is neither a tensor, an array nor JSON-representable.
    """
    tensors: dict[str, torch.Tensor] = {}
    tree = _split(state, (), tensors)
    metadata = {_FORMAT_KEY: STATE_FORMAT, _TREE_KEY: json.dumps(tree, allow_nan=False)}
    return bytes(encode_weights(tensors, metadata=metadata))  # CPU tensors: bytes already


def _split(value: Any, path: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor | np.ndarray):
        name = "/".join(path)
        if isinstance(value, np.ndarray):
            tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
            return {"$ndarray": name}
        tensors[name] = value
        return {"$tensor": name}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or "/" in key or key.startswith("$"):
                raise TypeError(f"state key {key!r} at {'/'.join(path)!r} is not storable")
            out[key] = _split(item, (*path, key), tensors)
        return out
    if isinstance(value, list | tuple):
        items = [_split(item, (*path, str(i)), tensors) for i, item in enumerate(value)]
        return {"$tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"state value at {'/'.join(path)!r} has unstorable type {type(value).__name__}")


def decode_state(
    blob: bytes | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> dict[str, Any]:
    """Parse an actor-state blob a peer sent back into the core's nested dict.

    ``max_keys`` bounds the tensors it may hold (checked before its header is parsed).

    Raises:
        WeightsTooLargeError: Over ``max_bytes``.
        WeightsError: Not an actor-state file, malformed, or not finite.
    """
    tensors, metadata = decode_weights(blob, max_bytes=max_bytes, max_keys=max_keys)
    if metadata.get(_FORMAT_KEY) != STATE_FORMAT:
        raise WeightsError(
            f"not an actor state file: {_FORMAT_KEY}={metadata.get(_FORMAT_KEY)!r}, "
            f"expected {STATE_FORMAT!r}"
        )
    try:
        tree = json.loads(metadata.get(_TREE_KEY, ""))
    except (ValueError, RecursionError) as exc:
        raise WeightsError(f"actor state metadata is not valid JSON: {exc}") from None
    used: set[str] = set()
    try:
        state = _join(tree, tensors, used, 0)
    except WeightsError:
        raise
    except (TypeError, ValueError, RecursionError) as exc:  # e.g. a bfloat16 "$ndarray"
        raise WeightsError(f"actor state is malformed: {exc}") from None
    if not isinstance(state, dict):
        raise WeightsError("actor state must be a JSON object at the top")
    unused = sorted(set(tensors) - used)
    if unused:
        raise WeightsError(f"actor state holds tensors its metadata does not name: {unused[:10]}")
    return state


def _join(node: Any, tensors: dict[str, torch.Tensor], used: set[str], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise WeightsError(f"actor state is nested deeper than {_MAX_DEPTH}")
    if isinstance(node, list):
        return [_join(item, tensors, used, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1 and next(iter(node)) in ("$tensor", "$ndarray", "$tuple"):
        marker, ref = next(iter(node.items()))
        if marker == "$tuple":
            if not isinstance(ref, list):
                raise WeightsError("actor state $tuple marker must hold a list")
            return tuple(_join(item, tensors, used, depth + 1) for item in ref)
        if not isinstance(ref, str) or ref not in tensors or ref in used:
            raise WeightsError(f"actor state names a missing or repeated tensor {ref!r:.80}")
        used.add(ref)
        return tensors[ref].numpy() if marker == "$ndarray" else tensors[ref]
    return {key: _join(item, tensors, used, depth + 1) for key, item in node.items()}
