"""LoRA adapters on language models: the ``--lora`` spec, and the one way both sides apply it.

An LLM actor started with ``--lora r=16,targets=q_proj,v_proj`` wraps its model in a
peft ``PeftModel`` with that adapter; a learner that calls :func:`apply_lora` with
the same spec on the same base model holds the same keys, so its adapter-only pushes
(``update_policy_weights_(model, only_trainable=True)``) carry just the adapter's
``lora_A`` / ``lora_B`` tensors. The adapter starts as peft starts it (``lora_B``
zero: the wrapped model computes what the base computes).

Parsing a spec imports nothing heavy; :func:`apply_lora` imports ``peft`` (the
``lora`` extra) and says how to install it when it is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import warnings
from typing import Any

__all__ = ["LORA_INT_RANGES", "LoraSpec", "apply_lora", "check_peft", "parse_lora"]

#: The integer ranges of a LoRA spec's fields.
LORA_INT_RANGES: dict[str, tuple[int, int]] = {"r": (1, 4096), "alpha": (1, 1 << 16)}
_TARGET_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$")
_MAX_TARGETS = 64


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter: its rank, its scale and the modules it wraps.

    Attributes:
        r: The adapter's rank.
        targets: Names of the modules to wrap (peft's ``target_modules``, e.g.
            ``("q_proj", "v_proj")``).
        alpha: peft's ``lora_alpha`` (the adapter's output is scaled by ``alpha / r``);
            None means ``r`` (scale 1).
    """

    r: int = 16
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    alpha: int | None = None

    def __post_init__(self) -> None:
        """Refuse a spec peft cannot build, naming the field.

        Raises:
            ValueError: ``r`` or ``alpha`` outside :data:`LORA_INT_RANGES`, no targets,
                too many, or a target that is not a module name.
        """
        for name, (low, high) in LORA_INT_RANGES.items():
            value = getattr(self, name)
            if name == "alpha" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"lora {name} must be an int in {low}..{high}, got {value!r}")
        if not isinstance(self.targets, tuple) or not 1 <= len(self.targets) <= _MAX_TARGETS:
            raise ValueError(
                f"lora targets must be a tuple of 1..{_MAX_TARGETS} module names, "
                f"got {self.targets!r:.120}"
            )
        for target in self.targets:
            if not isinstance(target, str) or not _TARGET_RE.match(target):
                raise ValueError(f"lora target {target!r:.80} is not a module name")

    def __str__(self) -> str:
        alpha = "" if self.alpha is None else f",alpha={self.alpha}"
        return f"r={self.r},targets={','.join(self.targets)}{alpha}"


def parse_lora(text: str) -> LoraSpec:
    """Parse ``r=16,targets=q_proj,v_proj[,alpha=32]`` into a :class:`LoraSpec`.

    A bare item after ``targets=`` is one more target.

    Raises:
        ValueError: An unknown field, a repeated one, a non-integer ``r``/``alpha``,
            or any rule of :class:`LoraSpec`.
    """
    fields: dict[str, Any] = {}
    current = ""
    for item in (part.strip() for part in text.split(",")):
        if "=" in item:
            current, _, value = (x.strip() for x in item.partition("="))
            if current not in ("r", "alpha", "targets"):
                raise ValueError(f"lora: unknown field {current!r:.40}; known: r, alpha, targets")
            if current in fields:
                raise ValueError(f"lora: {current} is given twice")
            fields[current] = [value] if current == "targets" else _int(current, value)
        elif current == "targets" and item:
            fields["targets"].append(item)
        else:
            raise ValueError(f"lora: expected r=N,targets=A,B[,alpha=N], got {text!r:.120}")
    if "targets" in fields:
        fields["targets"] = tuple(fields["targets"])
    return LoraSpec(**fields)


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"lora {name} must be an integer, got {value!r:.40}") from None


def check_peft() -> None:
    """Raise unless ``peft`` can be imported (without importing it).

    Raises:
        ValueError: Naming the extra that installs it.
    """
    if importlib.util.find_spec("peft") is None:
        raise ValueError(
            "lora needs the peft package, which is not installed: pip install 'rlfleet[lora]'"
        )


def apply_lora(model: Any, spec: LoraSpec | str) -> Any:
    """Wrap a causal LM in a peft LoRA adapter (``lora_B`` zero, no dropout).

    The base parameters are frozen; the adapter's are trainable, so
    ``only_trainable=True`` pushes exactly the adapter.

    Args:
        model: A ``transformers`` causal LM (e.g. from :func:`common.llm.build_policy`).
        spec: A :class:`LoraSpec` or its text (``"r=16,targets=q_proj,v_proj"``).

    Returns:
        The ``peft.PeftModel`` (it shares the base model's modules).

    Raises:
        ValueError: A bad spec, peft missing, or targets the model does not have.

    Example::

        model, tokenizer = build_policy("rlfleet:tiny-qwen2")
        model = apply_lora(model, "r=16,targets=q_proj,v_proj")
    """
    spec = parse_lora(spec) if isinstance(spec, str) else spec
    check_peft()
    from peft import LoraConfig, get_peft_model

    _check_targets_exist(model, spec)
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.r if spec.alpha is None else spec.alpha,
        target_modules=list(spec.targets),
        lora_dropout=0.0,
    )
    with warnings.catch_warnings():
        # transformers deprecates a name peft still reads while wrapping.
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return get_peft_model(model, config)
        except ValueError as exc:
            raise ValueError(f"lora {spec}: {exc}") from None


def _check_targets_exist(model: Any, spec: LoraSpec) -> None:
    """Refuse a target no module of ``model`` is named (peft only refuses all missing)."""
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in spec.targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted(
            {n.rpartition(".")[2] for n, m in model.named_modules() if not [*m.children()]}
        )
        raise ValueError(
            f"lora {spec}: the model has no module named {missing}; its leaf modules: {leaves}"
        )
