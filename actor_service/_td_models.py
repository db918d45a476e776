"""The TensorDict policies a TorchRL-env actor holds: versioned, swapped atomically between steps.

:class:`TDModels` is the TorchRL core's counterpart of the env actor's
``ModelRegistry``: one module per ``model_id``, each a ``TensorDictModuleBase`` (or
the env's random actions) called on the rollout's TensorDict as TorchRL's ``Collector``
calls its policy, with a policy version (0 at start, then whatever the last applied
push said). A module's weights are its ``state_dict()``, buffers included, so an
annealed epsilon or sigma pushed by a learner reaches the actor. Every forward and
every swap take the model's lock, so a push lands between two env steps; pushes and
restores are validated in full first (``actor_service._swap``,
``actor_service._weight_rules``). :func:`build_td_model` builds one from its spec. No
torchrl import: the core passes the env in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from actor_service._config import ModelSpec
from actor_service._swap import Swap, push_delta, push_full, restore, snapshot
from actor_service._weight_rules import stage_weights
from common.errors import UnknownModelError
from common.policies import load_callable
from common.weights import Delta, PushForm, to_state_dict

__all__ = ["TDModel", "TDModels", "build_td_model", "check_td_factory"]

#: How a model acts: the rollout's TensorDict in, the same TensorDict (written) out.
Act = Callable[[TensorDictBase], TensorDictBase]


class TDModel:
    """One model: the module holding its weights, how it acts, its version and lock.

    Args:
        factory: What built it (``"random"`` or ``"package.module:function"``), for messages.
        module: The ``nn.Module`` whose ``state_dict()`` (buffers included) is its weights.
        act: Called on the rollout's TensorDict; writes the action and any other outputs.
    """

    def __init__(self, factory: str, module: nn.Module, act: Act) -> None:
        self.factory = factory
        self.module = module
        self.act = act
        self.version = 0
        self.lock = threading.Lock()
        self.reference = {k: v.detach() for k, v in module.state_dict().items()}
        self.parameters_info = {
            k: (tuple(v.shape), v.dtype) for k, v in to_state_dict(module).items()
        }


def check_td_factory(spec: ModelSpec) -> None:
    """Refuse a model spec a TorchRL-env actor cannot build (``mlp`` reads gymnasium spaces)."""
    if spec.factory == "mlp":
        raise ValueError(
            f"model {spec.model_id!r}: the built-in 'mlp' reads gymnasium spaces; a TorchRL-env "
            "actor takes 'random' or 'package.module:function' (called with (env, **kwargs))"
        )


def build_td_model(spec: ModelSpec, env: Any, rand_action: Act, device: torch.device) -> TDModel:
    """A model of a TorchRL-env actor: ``random`` acts by ``rand_action``, a factory gets ``env``.

    Raises:
        ValueError: ``mlp``, an unimportable factory, one that raises or returns no
            ``TensorDictModuleBase`` (naming the model and the factory).
    """
    check_td_factory(spec)
    if spec.factory == "random":  # TorchRL's RandomPolicy draws from the action spec alike
        return TDModel(spec.factory, nn.Module(), rand_action)
    factory = load_callable(spec.factory)
    try:
        module = factory(env, **dict(spec.kwargs))
    except Exception as exc:
        raise ValueError(
            f"model {spec.model_id!r}: policy factory {spec.factory!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(module, TensorDictModuleBase):
        raise ValueError(
            f"model {spec.model_id!r}: policy factory {spec.factory!r} returned a "
            f"{type(module).__name__}, not a tensordict.nn.TensorDictModuleBase"
        )
    module = module.to(device)
    return TDModel(spec.factory, module, module)


class TDModels:
    """The TensorDict policies of a TorchRL-env actor, by ``model_id``.

    Thread-safe: the collection thread acts, other threads push; both take the
    model's lock.

    Args:
        models: The built models by ``model_id`` (the first acts by default).

    Example::

        models = TDModels({"policy": TDModel("pkg.mod:make", module, module)})
        version = models.act("policy", carrier)     # writes carrier["action"]
        models.load_weights("policy", 1, module.state_dict())
    """

    def __init__(self, models: Mapping[str, TDModel]) -> None:
        if not models:
            raise ValueError("an actor needs at least one model")
        self._models = dict(models)

    def _get(self, model_id: str) -> TDModel:
        try:
            return self._models[model_id]
        except (KeyError, TypeError):
            raise UnknownModelError(
                f"no model {model_id!r} on this actor; known model_ids: {list(self._models)}"
            ) from None

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The registered ids, in registration order (the first acts by default)."""
        return tuple(self._models)

    def module(self, model_id: str) -> nn.Module:
        """The live module of ``model_id`` (read it only between weight loads)."""
        return self._get(model_id).module

    def policy_version(self, model_id: str) -> int:
        """The version of the weights ``model_id`` acts with now (0 until a push)."""
        return self._get(model_id).version

    def parameters_info(self, model_id: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """State-dict keys of ``model_id`` with their shapes and dtypes (what a push must match)."""
        return dict(self._get(model_id).parameters_info)

    def act(self, model_id: str, tensordict: TensorDictBase) -> int:
        """Call ``model_id`` on ``tensordict`` under its lock; the version of the weights used.

        The caller sets grad mode and the exploration type.
        """
        model = self._get(model_id)
        with model.lock:
            out = model.act(tensordict)
            version = model.version
        if out is not None and out is not tensordict:  # as TorchRL's collector merges it
            tensordict.update(out)
        return version

    def validate(
        self, model_id: str, state: object, form: PushForm | None = None
    ) -> dict[str, torch.Tensor]:
        """Check ``state`` against ``model_id`` and stage it; change nothing."""
        return stage_weights(model_id, state, self._get(model_id).reference, form)

    def load_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> int:
        """Validate ``state`` in full, then swap it in between two env steps; the new version."""
        return self.swap_weights(model_id, version, state, form).version

    def swap_weights(
        self,
        model_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        form: PushForm | None = None,
    ) -> Swap:
        """Validate ``state`` in full, then swap it in between two env steps.

        Raises:
            UnknownModelError: No such model.
            StaleVersionError: ``version`` is not greater than the current one.
            WeightsError: Missing/unexpected keys, shape or dtype mismatches, NaN/Inf.
        """
        model = self._get(model_id)
        return push_full(model, model_id, version, model.reference, state, form)

    def swap_delta(self, model_id: str, base_version: int, version: int, delta: Delta) -> Swap:
        """Apply a checked delta on ``base_version`` (else SessionStateError, StaleVersionError)."""
        model = self._get(model_id)
        return push_delta(model, model_id, base_version, version, model.reference, delta)

    def state_dict(self) -> dict[str, dict]:
        """``{model_id: {"version": int, "weights": {key: CPU tensor}}}`` (copies)."""
        return {model_id: snapshot(m, m.module) for model_id, m in self._models.items()}

    def load_state_dict(
        self, state: object, *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """Restore every model's weights and version, all or nothing; ``{model_id: (old, new)}``."""
        slots = {model_id: (m, m.reference) for model_id, m in self._models.items()}
        return restore(slots, state, self._get, allow_rollback=allow_rollback)
