"""The weight codec: state dicts to and from safetensors bytes, and their checks.

Weights (learner → actor pushes) and actor state snapshots travel as one
safetensors blob: an 8-byte little-endian header length ``N``, ``N`` bytes of
JSON (``{"__metadata__": {str: str}, key: {"dtype", "shape", "data_offsets"}}``),
then the raw little-endian tensor bytes. Safetensors because it carries only
dtypes, shapes and bytes — no code, no pickle — and is read with bounds checks;
the receiver binds it to an architecture it already has. Keys are the flat
dotted names of ``nn.Module.state_dict()`` (``"0.weight"``, ``"net.1.bias"``).
Blobs larger than a gRPC message are split by :func:`iter_blob_chunks` and put
back together by :class:`BlobAssembler` (size cap before allocation, overflow,
missing bytes and the announced CRC-32C and/or sha256 checked; both live in
``common._blobs``).
:func:`decode_weights` caps the blob and header sizes before parsing, checks
the header length against the blob, allows only known dtypes, validates the
offsets as safetensors does, returns views over the received buffer rather
than copies (``common._safetensors``) and refuses non-finite floats
(safetensors does not); :func:`load_into` additionally checks
keys, shapes and dtypes against the live module and copies only once every
check has passed. Sparse deltas (only the changed elements, on top of a version
the receiver holds) are encoded, checked and applied by :func:`encode_delta`,
:func:`decode_delta` and :func:`apply_delta` (``common._delta``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import torch
from tensordict import TensorDictBase
from torch import nn

from common._blobs import (
    CHECKSUMS,
    DEFAULT_MAX_WEIGHT_BYTES,
    BlobAssembler,
    checksums,
    crc32c,
    iter_blob_chunks,
    sha256_hex,
)
from common._delta import Delta, apply_delta, decode_delta, encode_delta
from common._safetensors import (
    DEFAULT_MAX_KEYS,
    DTYPES,
    METADATA_KEY,
    Expected,
    read_blob,
    write_blob,
)
from common.errors import WeightsError, WeightsTooLargeError

__all__ = [
    "CHECKSUMS",
    "Delta",
    "DEFAULT_MAX_KEYS",
    "DEFAULT_MAX_WEIGHT_BYTES",
    "MAX_POLICY_VERSION",
    "Expected",
    "BlobAssembler",
    "apply_delta",
    "check_policy_version",
    "check_compatible",
    "check_finite",
    "checksums",
    "crc32c",
    "decode_delta",
    "decode_weights",
    "encode_delta",
    "encode_weights",
    "iter_blob_chunks",
    "load_into",
    "sha256_hex",
    "to_state_dict",
]

# Safetensors' own reader refuses headers over 100 MB; we refuse them before it
# does, and before json.loads sees them.
_MAX_HEADER_BYTES = 100_000_000
_METADATA_KEY = METADATA_KEY
_DTYPES = DTYPES
_TORCH_DTYPES = frozenset(_DTYPES.values())

#: The largest policy version an actor accepts: every frame records its version as int64.
MAX_POLICY_VERSION = 2**63 - 1

WeightSource: TypeAlias = nn.Module | TensorDictBase | Mapping[str, torch.Tensor]


def to_state_dict(obj: WeightSource) -> dict[str, torch.Tensor]:
    """Normalise a module, TensorDict or mapping into one flat state dict.

    Keys are flat dotted strings, as in ``nn.Module.state_dict()`` (a module's
    parameters and persistent buffers; nested TensorDicts and nested mappings
    are joined with ``"."``). Values are detached, contiguous CPU tensors, and
    no two values share storage (tied weights are cloned), so the result can
    be serialised by safetensors as is.

    Args:
        obj: An ``nn.Module``, a ``TensorDictBase`` (e.g. ``TensorDict.from_module(m)``)
            or a mapping of string keys to tensors or to nested such mappings.

    Returns:
        A new ``dict`` from dotted key to tensor.

    Raises:
        TypeError: For any other ``obj``, a non-string key, a value that is not a
            tensor, or a tensor safetensors cannot hold (sparse, meta, unsupported dtype).
        WeightsError: Two keys flatten to the same name, or a key is reserved.
    """
    if isinstance(obj, nn.Module):
        items: Mapping[str, object] = obj.state_dict()
    elif isinstance(obj, TensorDictBase | Mapping):
        items = obj
    else:
        raise TypeError(
            f"weights must be an nn.Module, a TensorDict or a mapping of tensors, "
            f"got {type(obj).__name__}"
        )
    out: dict[str, torch.Tensor] = {}
    _flatten_into(out, items, prefix="")
    return _unshare(out)


def _flatten_into(out: dict[str, torch.Tensor], items: Mapping[str, object], prefix: str) -> None:
    for key, value in items.items():
        if not isinstance(key, str):
            raise TypeError(f"weight keys must be strings, got {key!r} ({type(key).__name__})")
        name = f"{prefix}{key}"
        if isinstance(value, TensorDictBase | Mapping):
            _flatten_into(out, value, prefix=f"{name}.")
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"weight {name!r} must be a torch.Tensor, got {type(value).__name__}")
        if name in out:
            raise WeightsError(f"weight key {name!r} appears twice after flattening nested keys")
        if name == _METADATA_KEY:
            raise WeightsError(f"weight key {name!r} is reserved by safetensors")
        out[name] = _normalise_tensor(name, value)


def _normalise_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    if value.layout != torch.strided:
        raise TypeError(f"weight {name!r} has layout {value.layout}; only dense tensors travel")
    if value.device.type == "meta":
        raise TypeError(f"weight {name!r} is on the meta device and has no values")
    if value.dtype not in _TORCH_DTYPES:
        raise TypeError(f"weight {name!r} has dtype {value.dtype}, which safetensors cannot hold")
    return value.detach().to("cpu").contiguous()


def _unshare(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors that share storage (tied weights); the first
    # key keeps the original and every later one gets its own copy.
    seen: set[int] = set()
    for name, tensor in state.items():
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() == 0 or ptr == 0:
            continue
        if ptr in seen:
            state[name] = tensor.clone()
        else:
            seen.add(ptr)
    return state


def encode_weights(obj: WeightSource, *, metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise weights once into safetensors bytes.

    The sender may send any values (NaN included); receivers check them.

    Args:
        obj: Anything :func:`to_state_dict` accepts.
        metadata: Optional string-to-string pairs stored in the header.

    Returns:
        The safetensors blob.

    Raises:
        TypeError: A non-tensor value, or metadata that is not ``str`` → ``str``.

    Example::

        blob = encode_weights(policy, metadata={"model_id": "policy"})
        state, meta = decode_weights(blob)
    """
    state = to_state_dict(obj)
    meta: dict[str, str] | None = None
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise TypeError(
                f"metadata must be a mapping of str to str, got {type(metadata).__name__}"
            )
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
        meta = dict(metadata)
    return write_blob(state, meta)


def decode_weights(
    blob: bytes | bytearray | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    max_keys: int = DEFAULT_MAX_KEYS,
    expected: Expected | None = None,
    allow_non_finite: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Parse a safetensors blob a peer sent, strictly.

    Never uses pickle or ``torch.load``. The size cap is checked before
    anything is parsed; then the header length is checked against the blob and
    against a header cap, the header's dtypes against an allow-list, the
    offsets against the shapes and the data (contiguous from 0, in bounds,
    non-overlapping, covering the data exactly), and every floating-point
    tensor for NaN/Inf (:func:`check_finite`) unless the caller runs that scan itself.

    Args:
        blob: The received bytes. The tensors returned share the memory of a
            writable ``blob`` (e.g. :meth:`BlobAssembler.finish`'s buffer), so
            it must not be modified afterwards; a read-only one is copied once.
        max_bytes: The largest blob accepted.
        max_keys: The most tensors accepted; the header may hold at most 1 KiB
            per tensor besides 1 MiB of metadata, and its tensor entries are
            counted in the raw bytes before the JSON is parsed.
        expected: ``{key: (shape, dtype)}`` the receiver holds; when given,
            any other key, a missing key or a foreign shape or dtype is refused
            before a tensor is built (and the header bound is ``len(expected)``).
        allow_non_finite: Skip the NaN/Inf scan (for a caller that validates the
            state before use, so the values are scanned once).

    Returns:
        ``(state, metadata)``: CPU tensors by dotted key, and the header metadata.

    Raises:
        WeightsTooLargeError: The blob or its header is over its cap.
        WeightsError: The blob is truncated, malformed or holds non-finite values.
        TypeError: ``blob`` is not bytes-like.
    """
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"weights blob must be bytes-like, got {type(blob).__name__}")
    view = memoryview(blob).cast("B")
    size = view.nbytes
    if size > max_bytes:
        raise WeightsTooLargeError(
            f"weights blob of {size} bytes exceeds the cap of {max_bytes} bytes"
        )
    state, metadata = read_blob(view, _MAX_HEADER_BYTES, max_keys=max_keys, expected=expected)
    if not allow_non_finite:
        check_finite(state)
    return state, metadata


def check_policy_version(version: object, what: str = "policy version") -> int:
    """Return ``version`` if it is an int in ``[0, MAX_POLICY_VERSION]``.

    A version is stored per frame as int64; one beyond it would be accepted
    once and then break every batch (and, at 2**64 - 1, make every later push
    stale), so it is refused before anything changes.

    Raises:
        WeightsError: ``version`` is not an int in range (INVALID_ARGUMENT).
    """
    if not isinstance(version, int) or isinstance(version, bool):
        raise WeightsError(f"{what} must be an int, got {version!r:.80}")
    if not 0 <= version <= MAX_POLICY_VERSION:
        raise WeightsError(f"{what} {version} is outside [0, {MAX_POLICY_VERSION}] (int64)")
    return version


def check_finite(state: Mapping[str, torch.Tensor]) -> None:
    """Refuse NaN and Inf in floating-point and complex tensors.

    Args:
        state: Tensors by key.

    Raises:
        WeightsError: Naming every key that holds a non-finite value.
    """
    bad = []
    for key, tensor in state.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        # isfinite is not implemented for the 1-byte float8 dtypes.
        values = tensor.float() if tensor.element_size() == 1 else tensor
        # NaN and Inf survive a sum, so a finite sum proves every element finite
        # at a fraction of isfinite's cost; a non-finite one may also be a
        # finite overflow, so only then is every element checked.
        if bool(torch.isfinite(values.sum())):
            continue
        if not bool(torch.isfinite(values).all()):
            bad.append(key)
    if bad:
        raise WeightsError(f"weights hold non-finite values (NaN/Inf) in keys {sorted(bad)}")


def check_compatible(
    state: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> None:
    """Check that ``state`` has exactly the keys, shapes and dtypes of ``reference``.

    Args:
        state: The incoming tensors by key.
        reference: What the target model holds (e.g. ``module.state_dict()``).

    Raises:
        WeightsError: Naming every missing key, every unexpected key, every
            shape mismatch (with both shapes) and every dtype mismatch (with
            both dtypes) at once.
        TypeError: A value of either mapping is not a tensor.
    """
    for name, mapping in (("weights", state), ("reference", reference)):
        for key, value in mapping.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{name} value {key!r} must be a torch.Tensor, got {type(value).__name__}"
                )
    problems = []
    missing = sorted(set(reference) - set(state))
    unexpected = sorted(set(state) - set(reference))
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    common_keys = sorted(set(state) & set(reference))
    shapes = [
        f"{k} (got {list(state[k].shape)}, expected {list(reference[k].shape)})"
        for k in common_keys
        if state[k].shape != reference[k].shape
    ]
    dtypes = [
        f"{k} (got {state[k].dtype}, expected {reference[k].dtype})"
        for k in common_keys
        if state[k].dtype != reference[k].dtype
    ]
    if shapes:
        problems.append(f"shape mismatch: {', '.join(shapes)}")
    if dtypes:
        problems.append(f"dtype mismatch: {', '.join(dtypes)}")
    if problems:
        raise WeightsError(f"weights do not fit the model: {'; '.join(problems)}")


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Apply ``state`` to a live module, all or nothing.

    Every check (keys, shapes, dtypes against ``module.state_dict()``, then
    finiteness) and every device move happens before the first copy, so a
    rejected state leaves the module untouched.

    Args:
        module: The module to update in place (parameters and buffers).
        state: Tensors by dotted key, e.g. from :func:`decode_weights`.

    Raises:
        WeightsError: The state does not fit the module or is not finite.
    """
    reference = module.state_dict()
    check_compatible(state, reference)
    check_finite(state)
    staged = {key: state[key].to(target.device) for key, target in reference.items()}
    with torch.no_grad():
        for key, target in reference.items():
            target.copy_(staged[key])
