"""The weight codec: state dicts to and from safetensors bytes, and their checks.

Weights (learner → actor pushes) and actor state snapshots travel as one
safetensors blob: an 8-byte little-endian header length ``N``, ``N`` bytes of
JSON (``{"__metadata__": {str: str}, key: {"dtype", "shape", "data_offsets"}}``),
then the raw little-endian tensor bytes. Safetensors because it carries only
dtypes, shapes and bytes — no code, no pickle — and is read with bounds checks;
the receiver binds it to an architecture it already has. Keys are the flat
dotted names of ``nn.Module.state_dict()`` (``"0.weight"``, ``"net.1.bias"``).
Tied tensors travel once and are named as aliases in the header
(``common.weights._aliases``); the header also declares a subset push or a wire dtype
(``common.weights._push_form``).
Blobs larger than a gRPC message are split by :func:`iter_blob_chunks` and put
back together by :class:`BlobAssembler` (size cap before allocation, overflow,
missing bytes and the announced CRC-32C and/or sha256 checked; both live in
``common.weights._blobs``).
:func:`decode_weights` caps the blob and header sizes before parsing, checks
the header length against the blob, allows only known dtypes, validates the
offsets as safetensors does, returns views over the received buffer rather
than copies (``common.weights._safetensors``) and refuses non-finite floats
(safetensors does not); :func:`stage_state` checks
keys, shapes, dtypes and ties against the live model and casts, and
:func:`apply_staged` copies only once every check has passed
(``common.weights._fit``). Sparse deltas (only the changed elements, on top of a
version the receiver holds) are encoded, checked and applied by
:func:`encode_delta`, :func:`decode_delta` and :func:`apply_delta` (``common.weights._delta``).
A push may be one :class:`Part` of a version that several learner ranks send together
(``common.weights._parts``); :func:`split_blob` cuts one whole blob into such parts, views
of its bytes, for a push striped over parallel streams (``common.weights._split``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import torch
from tensordict import TensorDictBase
from torch import nn

from common.config import MAX_POLICY_VERSION
from common.errors import WeightsError, WeightsTooLargeError
from common.weights._aliases import ALIASES_KEY, decode_aliases, encode_aliases, expand_aliases
from common.weights._aliases import split_aliases as _split_aliases
from common.weights._blobs import (
    CHECKSUMS,
    DEFAULT_MAX_WEIGHT_BYTES,
    BlobAssembler,
    check_blob_size,
    check_digests,
    checksums,
    crc32c,
    default_max_weight_bytes,
    iter_blob_chunks,
    sha256_hex,
)
from common.weights._delta import Delta, apply_delta, decode_delta, encode_delta
from common.weights._fit import (
    apply_staged,
    check_compatible,
    check_finite,
    check_ties,
    check_writable,
    load_into,
    stage_state,
    state_nbytes,
)
from common.weights._parts import MAX_PARTS, Part, PushOutcome
from common.weights._push_form import WIRE_DTYPES, PushForm, adapter_metadata, check_fit
from common.weights._safetensors import (
    DEFAULT_MAX_KEYS,
    DTYPES,
    MAX_HEADER_BYTES,
    METADATA_KEY,
    Expected,
    HeaderCheck,
    read_blob,
    write_blob,
)
from common.weights._split import BlobPart, split_blob

__all__ = [
    "CHECKSUMS",
    "Delta",
    "DEFAULT_MAX_KEYS",
    "DEFAULT_MAX_WEIGHT_BYTES",
    "MAX_PARTS",
    "WIRE_DTYPES",
    "Expected",
    "BlobAssembler",
    "check_blob_size",
    "check_digests",
    "BlobPart",
    "apply_delta",
    "Part",
    "PushForm",
    "adapter_metadata",
    "PushOutcome",
    "apply_staged",
    "check_policy_version",
    "check_compatible",
    "check_finite",
    "check_ties",
    "check_writable",
    "checksums",
    "crc32c",
    "decode_delta",
    "decode_weights",
    "encode_delta",
    "default_max_weight_bytes",
    "eager_names",
    "encode_weights",
    "iter_blob_chunks",
    "load_into",
    "sha256_hex",
    "split_blob",
    "stage_state",
    "state_nbytes",
    "to_state_dict",
    "wire_state",
]

_METADATA_KEY = METADATA_KEY
_DTYPES = DTYPES
_TORCH_DTYPES = frozenset(_DTYPES.values())

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
        WeightsError: Two keys flatten to the same name, a key is reserved or is not
            UTF-8 text.
    """
    out = {name: _normalise_tensor(name, value) for name, value in _flat(obj).items()}
    return _unshare(out)


def wire_state(
    obj: WeightSource, *, dtype: torch.dtype | None = None, only_trainable: bool = False
) -> dict[str, torch.Tensor]:
    """A private snapshot of the tensors a push of ``obj`` in this form carries.

    The same keys and values :func:`encode_weights` would send with ``dtype`` and
    ``only_trainable`` (floating tensors cast to the wire dtype), as contiguous CPU
    tensors sharing no memory with ``obj`` or with each other, so training may go on
    changing ``obj`` in place; keys ``obj`` ties (one tensor) stay tied, one copy under
    all of them, so a push of the snapshot carries it once. What a learner diffs a
    sparse delta against.

    Raises:
        TypeError, ValueError: As :func:`encode_weights`.
    """
    PushForm(wire_dtype=dtype)  # raises ValueError for a dtype weights cannot travel in
    flat = _trainable(obj) if only_trainable else _flat(obj)  # type: ignore[arg-type]
    unique, aliases = _split_aliases(flat)
    out: dict[str, torch.Tensor] = {}
    for name, value in unique.items():
        tensor = _normalise_tensor(name, value, dtype)
        shares = tensor.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
        out[name] = tensor.clone() if shares else tensor
    _unshare(out)
    return {name: out[aliases.get(name, name)] for name in flat}


def _flat(obj: WeightSource) -> dict[str, torch.Tensor]:
    """The tensors of ``obj`` by dotted key, as they are (not moved, not copied)."""
    if isinstance(obj, nn.Module):
        items: Mapping[str, object] = _uncompiled_state_dict(obj)
    elif isinstance(obj, TensorDictBase | Mapping):
        items = obj
    else:
        raise TypeError(
            f"weights must be an nn.Module, a TensorDict or a mapping of tensors, "
            f"got {type(obj).__name__}"
        )
    out: dict[str, torch.Tensor] = {}
    _flatten_into(out, items, prefix="")
    return out


def _uncompiled_state_dict(
    module: nn.Module, state: Mapping[str, object] | None = None
) -> dict[str, object]:
    """``module.state_dict()`` (or some of its entries, ``state``) under :func:`eager_names`."""
    state = module.state_dict() if state is None else state
    names = eager_names(module, state)
    return {names[key]: value for key, value in state.items()}


def eager_names(module: nn.Module, keys: Iterable[str]) -> dict[str, str]:
    """``{key: its name in the module as built}`` for state-dict ``keys`` of ``module``.

    A compiled module (torch's ``OptimizedModule``) names its weights ``_orig_mod.<key>``;
    pushes and actors name them as the module was built, as does the learner's own state
    dict once torch's wrapper is taken off, wherever the module was compiled.
    """
    compiled = [
        f"{name}." if name else ""
        for name, sub in module.named_modules()
        if type(sub).__name__ == "OptimizedModule" and hasattr(sub, "_orig_mod")
    ]
    renamed: dict[str, str] = {}
    for key in keys:
        name = key
        for prefix in sorted(compiled, key=len, reverse=True):
            if name.startswith(f"{prefix}_orig_mod."):
                name = prefix + name[len(prefix) + len("_orig_mod.") :]
        renamed[key] = name
    return renamed


def _flatten_into(out: dict[str, torch.Tensor], items: Mapping[str, object], prefix: str) -> None:
    for key, value in items.items():
        if not isinstance(key, str):
            raise TypeError(f"weight keys must be strings, got {key!r} ({type(key).__name__})")
        name = f"{prefix}{key}"
        if not _is_utf8(key):
            raise WeightsError(
                f"weight key {name!r} is not UTF-8 text (the safetensors header is JSON): "
                f"rename it, e.g. with key.encode('utf-8', 'replace').decode()"
            )
        if isinstance(value, TensorDictBase | Mapping):
            _flatten_into(out, value, prefix=f"{name}.")
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"weight {name!r} must be a torch.Tensor, got {type(value).__name__}")
        if nn.parameter.is_lazy(value):
            raise TypeError(
                f"weight {name!r} is a lazy module's uninitialised parameter: run the module "
                f"once on an input (e.g. an env's reset()) before its weights are pushed"
            )
        if name in out:
            raise WeightsError(f"weight key {name!r} appears twice after flattening nested keys")
        if name in (_METADATA_KEY, ALIASES_KEY):
            raise WeightsError(f"weight key {name!r} is reserved")
        out[name] = value


def _is_utf8(key: str) -> bool:
    """Whether ``key`` encodes as UTF-8 (a lone surrogate, from ``os.fsdecode``, does not)."""
    try:
        key.encode()
    except UnicodeEncodeError:
        return False
    return True


def _normalise_tensor(
    name: str, value: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    if value.layout != torch.strided:
        raise TypeError(f"weight {name!r} has layout {value.layout}; only dense tensors travel")
    if value.device.type == "meta":
        raise TypeError(f"weight {name!r} is on the meta device and has no values")
    if value.dtype not in _TORCH_DTYPES:
        raise TypeError(f"weight {name!r} has dtype {value.dtype}, which safetensors cannot hold")
    value = value.detach()
    if dtype is not None and value.is_floating_point():
        value = value.to(dtype)  # on the source device: less to move
    return value.contiguous()  # a device tensor is copied to the host once, into the blob


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


def _checked_metadata(metadata: object) -> dict[str, str]:
    """A copy of the caller's header metadata, which must map ``str`` to ``str``."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of str to str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {value!r}")
    return dict(metadata)


def _trainable(module: nn.Module) -> dict[str, torch.Tensor]:
    """The state-dict entries of ``module``'s parameters that require grad."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"only_trainable needs an nn.Module (whose parameters say requires_grad), "
            f"got {type(module).__name__}"
        )
    names = {n for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
    state = _uncompiled_state_dict(
        module, {k: v for k, v in module.state_dict().items() if k in names}
    )
    if not state:
        raise ValueError(
            f"only_trainable: {type(module).__name__} has no parameter with requires_grad"
        )
    return _flat(state)


def encode_weights(
    obj: WeightSource,
    *,
    metadata: Mapping[str, str] | None = None,
    dtype: torch.dtype | None = None,
    only_trainable: bool = False,
    subset: bool = False,
    allocate: Callable[[int], torch.Tensor] | None = None,
) -> bytes | memoryview:
    """Serialise weights once into safetensors bytes.

    Tied tensors (several keys, one tensor) travel once: the header's metadata
    names the other keys as aliases (``common.weights._aliases``), and the decoder gives
    them the same tensor again. The sender may send any values (NaN included);
    receivers check them.

    Args:
        obj: Anything :func:`to_state_dict` accepts.
        metadata: Optional string-to-string pairs stored in the header.
        dtype: A wire dtype (:data:`WIRE_DTYPES`): floating-point tensors are cast to
            it once, here; integer and bool tensors travel as they are. The header
            declares it, so the receiver casts back into its own dtypes.
        only_trainable: Send only ``obj``'s parameters with ``requires_grad`` (an
            ``nn.Module``; e.g. a LoRA adapter), as a subset push.
        subset: Declare the blob a subset of the receiver's keys (the others keep
            their values); implied by ``only_trainable``.
        allocate: Where the blob is written: a ``uint8`` host buffer of the size asked
            (reused by the caller; page-locked for a model on an accelerator); each
            tensor is copied once, into its place in the blob. None: CPU tensors are
            joined into fresh ``bytes``.

    Returns:
        The safetensors blob.

    Raises:
        TypeError: A non-tensor value, metadata that is not ``str`` → ``str``, or
            ``only_trainable`` with something other than a module.
        ValueError: A ``dtype`` weights cannot travel in, or ``only_trainable`` on a
            module without trainable parameters.

    Example::

        blob = encode_weights(policy, metadata={"model_id": "policy"}, dtype=torch.bfloat16)
        state, meta = decode_weights(blob)
    """
    form = PushForm(subset=bool(subset or only_trainable), wire_dtype=dtype)
    flat = _trainable(obj) if only_trainable else _flat(obj)  # type: ignore[arg-type]
    unique, aliases = _split_aliases(flat)
    state = {name: _normalise_tensor(name, value, dtype) for name, value in unique.items()}
    meta = _checked_metadata(metadata)
    meta.update(form.metadata())
    if aliases:
        meta[ALIASES_KEY] = encode_aliases(aliases)
    return write_blob(_unshare(state), meta or None, allocate)


def decode_weights(
    blob: bytes | bytearray | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_WEIGHT_BYTES,
    max_keys: int = DEFAULT_MAX_KEYS,
    expected: Expected | None = None,
    allow_non_finite: bool = False,
    subset: bool = False,
    adapter: tuple[int, int] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Parse a safetensors blob a peer sent, strictly.

    Never uses pickle or ``torch.load``. The size cap is checked before
    anything is parsed; then the header length is checked against the blob and
    against a header cap, the header's dtypes against an allow-list, the
    offsets against the shapes and the data (contiguous from 0, in bounds,
    non-overlapping, covering the data exactly), the alias map and the declared
    form (:class:`PushForm`), and every floating-point tensor for NaN/Inf
    (:func:`check_finite`) unless the caller runs that scan itself.

    Args:
        blob: The received bytes. The tensors returned share the memory of a
            writable ``blob`` (e.g. :meth:`BlobAssembler.finish`'s buffer), so
            it must not be modified afterwards; a read-only one is copied once.
        max_bytes: The largest blob accepted.
        max_keys: The most tensors (and aliases) accepted; the header may hold at
            most 1 KiB per tensor besides 1 MiB of metadata, and its tensor entries
            are counted in the raw bytes before the JSON is parsed.
        expected: ``{key: (shape, dtype)}`` the receiver holds; when given, an
            unknown key, a missing key (unless the blob declares a subset) or a
            shape or dtype that does not fit (:func:`common.weights._push_form.fit_problems`)
            is refused before a tensor is built (and the header bound is ``len(expected)``).
        allow_non_finite: Skip the NaN/Inf scan (for a caller that validates the
            state before use, so the values are scanned once).
        subset: Check the blob against ``expected`` as a subset whatever it declares
            (a :class:`Part` of a multi-part push holds some of the keys by nature).
        adapter: ``(r, alpha)`` of the receiver's LoRA adapter; a blob declaring another
            is refused (:meth:`PushForm.check_adapter`) before its shapes are checked.

    Returns:
        ``(state, metadata)``: CPU tensors by dotted key (an alias maps to the very
        tensor of its target), and the header metadata.

    Raises:
        WeightsTooLargeError: The blob or its header is over its cap.
        WeightsError: The blob is truncated, malformed, does not fit ``expected``
            or holds non-finite values.
        TypeError: ``blob`` is not bytes-like.
    """
    view = _capped_view(blob, max_bytes)
    aliases: dict[str, str] = {}
    limit = max_keys if expected is None else len(expected)
    check = _header_check(limit, expected, aliases, subset, adapter)
    state, metadata = read_blob(
        view, MAX_HEADER_BYTES, max_keys=max_keys, expected=expected, check=check
    )
    if not allow_non_finite:
        check_finite(state)
    expand_aliases(state, aliases)
    return state, metadata


def _capped_view(blob: object, max_bytes: int) -> memoryview:
    """``blob`` as a byte view, checked bytes-like and within ``max_bytes`` before any parsing.

    Raises:
        TypeError: ``blob`` is not bytes-like.
        WeightsTooLargeError: ``blob`` is over ``max_bytes``.
    """
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise TypeError(f"weights blob must be bytes-like, got {type(blob).__name__}")
    view = memoryview(blob).cast("B")
    if view.nbytes > max_bytes:
        raise WeightsTooLargeError(
            f"weights blob of {view.nbytes} bytes exceeds the cap of {max_bytes} bytes"
        )
    return view


def _header_check(
    limit: int,
    expected: Expected | None,
    aliases: dict[str, str],
    subset: bool,
    adapter: tuple[int, int] | None,
) -> HeaderCheck:
    """The check of a parsed header: form and adapter, alias map (into ``aliases``), fit."""

    def check(infos: dict[str, Any], metadata: dict[str, str]) -> None:
        form = PushForm.from_metadata(metadata)
        form.check_adapter(adapter)
        if subset:
            form = dataclasses.replace(form, subset=True)
        if expected is not None and any(key not in expected for key in infos):
            # Keys the model lacks first: they, not the alias count they exhaust, are the news.
            shapes = {k: (i["shape"], DTYPES[i["dtype"]]) for k, i in infos.items()}
            check_fit(shapes, expected, dataclasses.replace(form, subset=True))
        aliases.update(decode_aliases(metadata, infos, max(0, limit - len(infos))))
        if expected is not None:
            got = {k: (i["shape"], DTYPES[i["dtype"]]) for k, i in infos.items()}
            got.update({alias: got[target] for alias, target in aliases.items()})
            check_fit(got, expected, form)

    return check


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
