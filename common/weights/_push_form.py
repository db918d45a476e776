"""What a weights blob holds relative to the model it updates, and whether it fits.

A push is *full* (every key of the model, each in the model's dtype) unless its
header metadata says otherwise:

* ``rlfleet.subset: "1"`` — the blob holds some of the model's keys (an
  ``only_trainable`` push, a LoRA adapter, a partial mapping); every key it holds
  is checked, the keys it lacks keep their values;
* ``rlfleet.dtype: "bfloat16"`` (or ``float16``, ``float32``, ``float64``) — the
  sender cast its floating-point tensors to this *wire dtype*; the receiver
  casts them into the model's own floating dtype. Integer and bool tensors are
  never cast: they travel, and must arrive, in the model's dtype;
* ``rlfleet.lora: "r=16,alpha=32"`` — the sender's module is a peft LoRA model with this
  adapter (:func:`adapter_metadata`): an actor holding another adapter refuses the push
  (:meth:`PushForm.check_adapter`), since the same tensors under another ``alpha / r``
  scale are another function than the one the learner trains.

:func:`fit_problems` is the one rule of what fits (keys, shapes, dtypes under a
:class:`PushForm`), used on the header before any tensor is built and on live
tensors before anything is applied. A push carrying LoRA adapter keys to a model
without an adapter is named as such, with the flag that fixes it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from common.errors import WeightsError

__all__ = [
    "ADAPTER_KEY",
    "DTYPE_KEY",
    "SUBSET_KEY",
    "WIRE_DTYPES",
    "PushForm",
    "adapter_metadata",
    "check_fit",
    "fit_problems",
]

SUBSET_KEY = "rlfleet.subset"
DTYPE_KEY = "rlfleet.dtype"
ADAPTER_KEY = "rlfleet.lora"
_ADAPTER_RE = re.compile(r"^r=(\d{1,6}),alpha=(\d{1,6})$")
#: The floating dtypes weights may travel in, by name.
WIRE_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_WIRE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}
# Substrings of the state-dict keys peft gives LoRA adapters.
_ADAPTER_MARKS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")
_SHOWN = 10

Shapes = Mapping[str, tuple[Sequence[int], torch.dtype]]


@dataclasses.dataclass(frozen=True)
class PushForm:
    """How a push's tensors relate to the model's (see the module docstring).

    Attributes:
        subset: The push holds some of the model's keys; the others keep their values.
        wire_dtype: The dtype floating-point tensors travel in (cast into the model's
            own on load); None: every tensor arrives in the model's dtype.
        adapter: ``(r, alpha)`` of the sender's LoRA adapter; None: not declared.
    """

    subset: bool = False
    wire_dtype: torch.dtype | None = None
    adapter: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        """Refuse a wire dtype weights cannot travel in.

        Raises:
            ValueError: ``wire_dtype`` is not one of :data:`WIRE_DTYPES`.
        """
        if self.wire_dtype is not None and self.wire_dtype not in _WIRE_NAMES:
            raise ValueError(
                f"dtype must be None or one of torch.{', torch.'.join(WIRE_DTYPES)}; "
                f"got {self.wire_dtype!r}"
            )

    def metadata(self) -> dict[str, str]:
        """The header metadata entries that declare this form."""
        out = {}
        if self.subset:
            out[SUBSET_KEY] = "1"
        if self.wire_dtype is not None:
            out[DTYPE_KEY] = _WIRE_NAMES[self.wire_dtype]
        if self.adapter is not None:
            out[ADAPTER_KEY] = "r={},alpha={}".format(*self.adapter)
        return out

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> PushForm:
        """Read the form a received header declares.

        Raises:
            WeightsError: A subset flag other than ``"1"`` or an unknown wire dtype.
        """
        subset = metadata.get(SUBSET_KEY)
        if subset not in (None, "1"):
            raise WeightsError(f"weights header {SUBSET_KEY} must be '1', got {subset[:40]!r}")
        name = metadata.get(DTYPE_KEY)
        if name is not None and name not in WIRE_DTYPES:
            raise WeightsError(
                f"weights header {DTYPE_KEY} {name[:40]!r} is not one of {sorted(WIRE_DTYPES)}"
            )
        declared = metadata.get(ADAPTER_KEY)
        adapter = None if declared is None else _ADAPTER_RE.match(declared)
        if declared is not None and adapter is None:
            raise WeightsError(
                f"weights header {ADAPTER_KEY} must read r=R,alpha=A, got {declared[:40]!r}"
            )
        return cls(
            subset=subset == "1",
            wire_dtype=None if name is None else WIRE_DTYPES[name],
            adapter=None if adapter is None else (int(adapter[1]), int(adapter[2])),
        )

    def check_adapter(self, held: tuple[int, int] | None) -> None:
        """Refuse a push whose declared LoRA adapter is not the one held (``(r, alpha)``).

        Raises:
            WeightsError: Both are known and differ (a rank or a scale apart).
        """
        if self.adapter is None or held is None or self.adapter == held:
            return
        raise WeightsError(
            "the pushed weights' LoRA adapter is r={}, alpha={}; this actor's is r={}, alpha={} "
            "(--lora): its generations would scale the adapter by another alpha / r than the "
            "learner trains with; build the learner's adapter with the actor's spec "
            "(common.llm.apply_lora)".format(*self.adapter, *held)
        )

    def fits_dtype(self, got: torch.dtype, model: torch.dtype) -> bool:
        """Whether a tensor of dtype ``got`` may load into a model tensor of dtype ``model``."""
        if got == model:
            return True
        return got == self.wire_dtype and model.is_floating_point


FULL = PushForm()


def adapter_metadata(source: Any) -> dict[str, str]:
    """The header entry declaring ``source``'s LoRA adapter, if it is a peft LoRA model.

    Read from its active adapter's config (``r``, ``lora_alpha``); ``{}`` for anything
    else, or an adapter with per-module ranks or scales (not declared, not checked).
    """
    configs = getattr(source, "peft_config", None)
    if not isinstance(configs, Mapping):
        return {}
    config = configs.get(getattr(source, "active_adapter", "default"))
    r, alpha = getattr(config, "r", None), getattr(config, "lora_alpha", None)
    if getattr(config, "rank_pattern", None) or getattr(config, "alpha_pattern", None):
        return {}
    if not isinstance(r, int) or not isinstance(alpha, int) or min(r, alpha) <= 0:
        return {}  # (a bool is an int: True is 1, as peft would take it)
    return PushForm(adapter=(int(r), int(alpha))).metadata()


def _listed(keys: list[str]) -> str:
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return f"{[k[:120] for k in keys[:_SHOWN]]}{more}"


def _adapter_hint(unknown: list[str], missing: list[str], expected: Shapes) -> str:
    """Why the keys differ, when the cause is a LoRA adapter on one side only."""
    model_has_adapter = any(m in k for k in expected for m in _ADAPTER_MARKS)
    if not model_has_adapter and any(m in k for k in unknown for m in _ADAPTER_MARKS):
        return (
            "the push carries LoRA adapter keys but this model holds no adapter: start the "
            "actor with --lora r=R,targets=MODULES matching the learner's LoraConfig"
        )
    if model_has_adapter and unknown and not any(m in k for k in unknown for m in _ADAPTER_MARKS):
        return (
            "this model holds a LoRA adapter (keys base_model.model.*): push the learner's "
            "peft model (an adapter-only push: only_trainable=True)"
        )
    prefix = _wrapper_prefix(unknown, expected)
    if prefix:
        return (
            f"the pushed keys carry the prefix {prefix!r} of a wrapper around the model "
            "(TorchRL's TransformersWrapper holds it as .model): push the wrapped model"
        )
    return ""


def _wrapper_prefix(unknown: list[str], expected: Shapes) -> str:
    """The first part of the pushed keys, when without it they are the model's own."""
    heads = {key.split(".", 1)[0] for key in unknown if "." in key}
    if len(heads) != 1:
        return ""
    (head,) = heads
    stripped = {key.split(".", 1)[1] for key in unknown}
    own = stripped & set(expected)  # the rest: what the wrapper adds (non-persistent buffers)
    return head + "." if own and 2 * len(own) >= len(stripped) else ""


def _wire_hint(wanted: set[torch.dtype], form: PushForm) -> str:
    """The fix of floats sent undeclared where the model holds another float dtype, one."""
    if form.wire_dtype is not None or len(wanted) != 1 or not wanted <= set(_WIRE_NAMES):
        return ""
    (dtype,) = wanted
    return (
        f" (push with update_policy_weights_(..., dtype={dtype}): the learner casts the "
        f"floats into the model's dtype before sending)"
    )


def fit_problems(got: Shapes, expected: Shapes, form: PushForm = FULL) -> list[str]:
    """Every way ``got`` does not fit ``expected`` under ``form`` (empty: it fits).

    Args:
        got: ``{key: (shape, dtype)}`` of the push (aliases included).
        expected: ``{key: (shape, dtype)}`` of the model.
        form: What the push declares (subset, wire dtype).

    Returns:
        Human-readable problems: missing keys (unless a subset), unexpected keys,
        shape mismatches and dtype mismatches, each naming its keys.
    """
    problems = []
    unknown = sorted(set(got) - set(expected))
    missing = [] if form.subset else sorted(set(expected) - set(got))
    if missing:
        problems.append(f"missing keys {_listed(missing)}")
    if unknown:
        problems.append(f"unexpected keys {_listed(unknown)}")
    shapes, dtypes, floats = [], [], set()
    for key in sorted(set(got) & set(expected)):
        (shape, dtype), (want_shape, want_dtype) = got[key], expected[key]
        if list(shape) != list(want_shape):
            shapes.append(f"{key} (got {list(shape)!s:.80}, expected {list(want_shape)})")
        elif not form.fits_dtype(dtype, want_dtype):
            why = ""
            if dtype.is_floating_point and not want_dtype.is_floating_point:
                why = ": a floating-point tensor never loads into an integer or bool buffer"
            elif dtype.is_floating_point and want_dtype.is_floating_point:
                floats.add(want_dtype)
            dtypes.append(f"{key} (got {dtype}, expected {want_dtype}{why})")
    if shapes:
        problems.append(f"shape mismatch: {', '.join(shapes[:_SHOWN])}")
    if dtypes:
        problems.append(f"dtype mismatch: {', '.join(dtypes[:_SHOWN])}{_wire_hint(floats, form)}")
    hint = _adapter_hint(unknown, missing, expected) if problems else ""
    return [hint, *problems] if hint else problems


def check_fit(got: Shapes, expected: Shapes, form: PushForm = FULL) -> None:
    """Raise unless ``got`` fits ``expected`` under ``form`` (see :func:`fit_problems`).

    Raises:
        WeightsError: ``"weights do not fit the model: ..."`` naming every problem.
    """
    problems = fit_problems(got, expected, form)
    if problems:
        raise WeightsError(f"weights do not fit the model: {'; '.join(problems)}")
