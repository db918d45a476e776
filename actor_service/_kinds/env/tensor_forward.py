"""A user's TensorDict policy called on tensors: the same outputs without building TensorDicts.

An actor calls its policy once per env step. A ``TensorDictModule`` called the usual
way builds a TensorDict around the observation, looks keys up through tensordict's
dispatch and key checks, and wraps every output, which costs more than a small
network's forward. :func:`tensor_forward` turns a module whose behaviour is plain
(``observation`` in, named tensors out) into a function on a dict of tensors that
runs exactly the same inner modules in the same order:

- a ``TensorDictModule`` (forward not overridden, no hooks on the wrapper, positional
  inputs that are all known by the time it runs): ``module(*inputs)`` (or its
  ``method``), outputs bound to ``out_keys`` (``"_"`` dropped), as tensordict does;
- a ``TensorDictSequential`` (forward not overridden, no hooks, not partial-tolerant,
  no output selection) of such modules, in order;
- an ``nn.Sequential`` inside them with no hooks anywhere (and no global hooks) is
  run layer by layer, skipping ``nn.Module.__call__``;
- a ``ProbabilisticTensorDictSequential`` (TorchRL's ``ProbabilisticActor`` is one)
  whose deterministic part is made of the above: that part runs on tensors, then its
  final probabilistic module is called as usual, on a TensorDict holding only its
  inputs (one small TensorDict per step instead of one per module and per output).

Anything else (custom ``forward`` overrides, hooks, keyword inputs, composite or
multi-sample distributions) returns ``None`` and keeps the TensorDict path. The
registry also compares both paths on a probe batch before trusting this one
(``actor_service._kinds.env.models``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
    set_interaction_type,
)
from tensordict.nn.probabilistic import interaction_type
from torch import nn
from torch.nn.modules import module as _torch_module

__all__ = ["TensorForward", "tensor_forward"]

#: Maps the observation to every key the module writes (nested keys as tuples).
TensorForward = Callable[[torch.Tensor], dict[Any, torch.Tensor]]
_Step = Callable[[dict[Any, Any]], None]


def tensor_forward(module: nn.Module) -> TensorForward | None:
    """A tensor-only equivalent of ``module(TensorDict({"observation": obs}))``, or None.

    Args:
        module: The policy as the user built it.

    Returns:
        ``forward(observation) -> {key: tensor}`` holding ``"observation"`` and every
        key the module writes, or None when the module is not one whose behaviour this
        function reproduces exactly.
    """
    known: set[Any] = {"observation"}
    steps = _plan(module, known)
    if steps is None:
        return None

    def forward(observation: torch.Tensor) -> dict[Any, torch.Tensor]:
        values: dict[Any, Any] = {"observation": observation}
        for step in steps:
            step(values)
        return values

    return forward


def _plan(module: nn.Module, known: set[Any]) -> list[_Step] | None:
    if _has_hooks(module):
        return None
    if isinstance(module, ProbabilisticTensorDictSequential):
        if _plain(module, ProbabilisticTensorDictSequential):
            return _probabilistic_plan(module, known)
        return None
    if isinstance(module, TensorDictSequential) and _plain(module, TensorDictSequential):
        if bool(module.partial_tolerant) or getattr(module, "_select_before_return", False):
            return None
        steps: list[_Step] = []
        for sub in module._module_iter():  # its submodules, in call order
            planned = _plan(sub, known)
            if planned is None:
                return None
            steps += planned
        return steps
    if isinstance(module, TensorDictModule) and _plain(module, TensorDictModule):
        step = _module_step(module, known)
        return None if step is None else [step]
    return None


def _probabilistic_plan(
    module: ProbabilisticTensorDictSequential, known: set[Any]
) -> list[_Step] | None:
    """Deterministic part on tensors, then the last module on a TensorDict of its inputs."""
    if (
        bool(module.return_composite)
        or not bool(module._requires_sample)
        or bool(module.partial_tolerant)
        or getattr(module, "_select_before_return", False)
    ):
        return None
    *deterministic, last = list(module._module_iter())
    steps: list[_Step] = []
    for sub in deterministic:
        planned = _plan(sub, known)
        if planned is None:
            return None
        steps += planned
    in_keys = tuple(last.in_keys)
    if getattr(last, "num_samples", None) is not None or not all(k in known for k in in_keys):
        return None
    default = last.default_interaction_type
    known.update(last.out_keys)

    def step(values: dict[Any, Any]) -> None:
        if interaction_type() is None:  # as get_dist_params: the last module's default
            with set_interaction_type(default):
                for det in steps:
                    det(values)
        else:
            for det in steps:
                det(values)
        observation = values["observation"]
        td = TensorDict(batch_size=observation.shape[:1], device=observation.device)
        for key in in_keys:
            td.set(key, values[key])
        out = last(td, _requires_sample=True)
        for key in out.keys(include_nested=True, leaves_only=True):
            values[key] = out.get(key)

    return [step]


def _plain(module: nn.Module, cls: type) -> bool:
    """``module`` is a ``cls`` whose call path is ``cls``'s own (not overridden)."""
    if not isinstance(module, cls):
        return False
    kind = type(module)
    names = ("forward", "_call_module", "_write_to_tensordict", "_run_module", "__call__")
    return all(getattr(kind, n, None) is getattr(cls, n, None) for n in names)


def _module_step(module: TensorDictModule, known: set[Any]) -> _Step | None:
    if module._kwargs is not None or module._get_kwargs:
        return None
    in_keys, out_keys = tuple(module.in_keys), tuple(module.out_keys_source)
    if list(module.out_keys) != list(out_keys) or not all(k in known for k in in_keys):
        return None
    call = _direct_call(module.module, module.method)
    kwargs = dict(module.method_kwargs)
    known.update(k for k in out_keys if k != "_")

    def step(values: dict[Any, Any]) -> None:
        out = call(*[values[k] for k in in_keys], **kwargs)
        if (
            type(out) is not torch.Tensor
            and isinstance(out, dict | TensorDictBase)
            and all(k in out for k in out_keys)
        ):
            out = tuple(out[k] for k in out_keys)
        outputs = out if isinstance(out, tuple) else (out,)
        if len(outputs) != len(out_keys):
            raise RuntimeError(
                f"the policy module returned {len(outputs)} tensors for out_keys {list(out_keys)}"
            )
        for key, value in zip(out_keys, outputs, strict=True):
            if key != "_":
                values[key] = value

    return step


def _direct_call(inner: Any, method: str | None) -> Callable[..., Any]:
    """``inner``'s forward; an unhooked ``nn.Sequential`` runs its layers' forwards directly."""
    if method is not None:
        return getattr(inner, method)
    if type(inner) is nn.Sequential and not _any_hooks(inner) and all(map(_bare, inner)):
        layers = tuple(layer.forward for layer in inner)

        def sequential(x: Any) -> Any:
            for layer in layers:
                x = layer(x)
            return x

        return sequential
    return inner


def _bare(module: nn.Module) -> bool:
    """Calling ``module`` is calling its ``forward`` (no ``__call__`` override, not compiled)."""
    return (
        type(module).__call__ is nn.Module.__call__
        and getattr(module, "_compiled_call_impl", None) is None
    )


def _has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _any_hooks(module: nn.Module) -> bool:
    """Hooks on ``module``, on any module inside it, or registered globally."""
    if (
        _torch_module._global_forward_hooks
        or _torch_module._global_forward_pre_hooks
        or _torch_module._global_backward_hooks
        or _torch_module._global_backward_pre_hooks
    ):
        return True
    return any(_has_hooks(m) for m in module.modules())
