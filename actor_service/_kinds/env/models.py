"""The models an actor holds: built on its device, versioned, swapped atomically between steps.

A :class:`ModelRegistry` owns one module per ``model_id`` plus its policy version
(0 at start, then whatever the last applied push said); lookup, versions and pushes
are its :class:`~actor_service._core._model_book.ModelBook` base's. Inference and weight loads
take the same per-model lock, so a push lands between two env steps, never during
one, and the version recorded for a frame is the version of the weights that chose
its action. A push is validated in full (keys, shapes, dtypes, finiteness) before the
lock is taken; a rejected push changes nothing.

Three kinds of module can act: the built-in policies (``common.policies``), which
offer the allocation-light ``act_compact``; any ``TensorDictModuleBase`` reading
``"observation"`` and writing ``"action"`` plus extra keys (kept in batches); and a
plain ``nn.Module`` mapping an observation tensor to an action tensor. A TensorDict
module whose inner modules can be called on tensors (``actor_service._kinds.env.tensor_forward``)
is called that way, once both ways have given equal outputs on a probe batch from one
RNG state; otherwise it is called on a TensorDict each step.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence

import gymnasium
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase, set_interaction_type
from tensordict.nn.probabilistic import InteractionType
from torch import nn

from actor_service._config import ModelSpec
from actor_service._core._model_book import LiveState, ModelBook
from actor_service._core._placement import CompiledForward
from actor_service._kinds.env.device_stage import DeviceStage
from actor_service._kinds.env.spaces import ActionCodec, ObservationCodec
from actor_service._kinds.env.tensor_forward import TensorForward, tensor_forward
from common.errors import InternalError
from common.plain_config import from_plain
from common.policies import make_policy
from common.weights import to_state_dict

__all__ = ["RESERVED_KEYS", "ModelRegistry", "unsupplied_keys"]

#: Batch keys the rollout writes itself; a policy may not output them.
RESERVED_KEYS = frozenset(
    {
        "observation",
        "action",
        "done",
        "terminated",
        "truncated",
        "reward",
        "next",
        "collector",
        "policy_version",
        "step_count",
    }
)
Compact = tuple[torch.Tensor, dict[str, torch.Tensor]]


def _check_id(model_id: str, models: Mapping[str, object]) -> None:
    if model_id in models:
        raise ValueError(f"model_id {model_id!r} is registered twice")


class _Model:
    """One registered model: module, version, lock and its compact-form forward."""

    def __init__(
        self,
        spec: ModelSpec,
        module: nn.Module,
        obs: ObservationCodec,
        act: ActionCodec,
        device: torch.device,
    ) -> None:
        self.spec = spec
        self.module = module
        self.version = 0
        self.lock = threading.Lock()
        self.device = device
        self._act = act
        self._obs = obs
        self.path = ""
        # The forward in force: eager, or compiled for a session (compile_policy).
        self.runner = self.forward = CompiledForward(self._pick_forward(module))
        # The probe runs the module once: lazy layers (nn.LazyLinear) get their sizes first.
        self.output_specs = self._probe(obs)
        self.reference = LiveState(module)
        self.parameters_info = {
            k: (tuple(v.shape), v.dtype) for k, v in to_state_dict(module).items()
        }

    def _pick_forward(self, module: nn.Module) -> Callable[[torch.Tensor], Compact]:
        act_compact = getattr(module, "act_compact", None)
        if callable(act_compact):
            self.path = "compact"
            return act_compact
        if not isinstance(module, TensorDictModuleBase):
            self.path = "module"
            return lambda obs: (self._act.from_policy(module(obs), obs.shape[0]), {})
        missing = unsupplied_keys(module)
        if missing:
            raise ValueError(
                f"model {self.spec.model_id!r} ({self.spec.factory}) reads {missing}, which a "
                "gymnasium env actor does not provide (its steps hold 'observation' only): run "
                "it on a TorchRL-env actor (--kind torchrl), whose steps carry them"
            )
        extras = [k for k in module.out_keys if k != "action" and not _private(k)]
        general = functools.partial(self._td_forward, extras=extras)
        on_tensors = tensor_forward(module)
        fast = on_tensors and functools.partial(
            self._tensor_forward, fast=on_tensors, extras=extras
        )
        if fast is not None and self._same_outputs(general, fast):
            self.path = "tensors"
            return fast
        self.path = "tensordict"
        return general

    def _td_forward(self, obs: torch.Tensor, extras: list) -> Compact:
        """The general path: the module called on a TensorDict, as TorchRL calls it."""
        td = self.module(
            TensorDict({"observation": obs}, batch_size=obs.shape[:1], device=obs.device)
        )
        if "action" not in td:
            raise InternalError(f"model {self.spec.model_id!r} wrote no 'action' key")
        action = self._act.from_policy(td.get("action"), obs.shape[0])
        return action, {k: td.get(k) for k in extras}

    def _tensor_forward(self, obs: torch.Tensor, fast: TensorForward, extras: list) -> Compact:
        """The fast path: the same inner modules on tensors (``tensor_forward`` in this folder)."""
        values = fast(obs)
        if "action" not in values:
            raise InternalError(f"model {self.spec.model_id!r} wrote no 'action' key")
        action = self._act.from_policy(values["action"], obs.shape[0])
        return action, {k: values[k] for k in extras}

    def _same_outputs(self, general: Callable, fast: Callable) -> bool:
        """Both paths, from one RNG state, give equal outputs on a probe batch (else: general)."""
        sample = self._obs.encode(self._obs.placeholder(2)).to(self.device)
        devices = [self.device] if self.device.type == "cuda" else []
        results = []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            state = torch.get_rng_state()
            for path in (general, fast):
                torch.set_rng_state(state)
                try:
                    with set_interaction_type(InteractionType.RANDOM):
                        results.append(path(sample))
                except Exception:
                    return False
        return _equal(results[0], results[1])

    def _probe(self, obs: ObservationCodec) -> dict:
        """Run once on placeholder observations to learn the extra outputs' shapes and dtypes."""
        batch = 2
        sample = obs.encode(obs.placeholder(batch)).to(self.device)
        try:
            with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
                _, extras = self.forward(sample)
        except Exception as exc:
            raise ValueError(
                f"model {self.spec.model_id!r} ({self.spec.factory}) fails on a batch of "
                f"placeholder observations: {type(exc).__name__}: {exc}"
            ) from exc
        specs = {"action": (self._act.shape, self._act.dtype)}
        for key, value in extras.items():
            top = key if isinstance(key, str) else key[0]
            if top in RESERVED_KEYS:
                raise ValueError(
                    f"model {self.spec.model_id!r} writes {key!r}, a key the rollout writes itself"
                )
            if not isinstance(value, torch.Tensor) or value.shape[:1] != (batch,):
                raise ValueError(
                    f"model {self.spec.model_id!r} output {key!r} must be a tensor with one row "
                    f"per env, got {getattr(value, 'shape', type(value).__name__)}"
                )
            specs[key] = (tuple(value.shape[1:]), value.dtype)
        return specs


def _equal(a: Compact, b: Compact) -> bool:
    """Same action and extras: keys, dtypes, shapes and values (NaN equal to NaN)."""
    pairs = [(a[0], b[0])] + [(a[1][k], b[1].get(k)) for k in a[1]]
    return a[1].keys() == b[1].keys() and all(
        isinstance(y, torch.Tensor)
        and x.dtype == y.dtype
        and x.shape == y.shape
        and bool(torch.equal(x, y) or torch.allclose(x, y, rtol=0, atol=0, equal_nan=True))
        for x, y in pairs
    )


def unsupplied_keys(module: TensorDictModuleBase) -> list[str]:
    """What ``module`` reads that a gymnasium actor's steps do not hold (they hold ``observation``).

    Its ``in_keys`` beyond ``observation`` (recurrent states, ``is_init``, pixels...) and
    the ``is_init_key`` of its exploration modules that restart their state on it (TorchRL's
    ``OrnsteinUhlenbeckProcessModule``, which would otherwise warn and run on uncorrelated
    noise).
    """
    keys = {str(k if isinstance(k, str) else tuple(k)) for k in module.in_keys}
    for sub in module.modules():
        key = getattr(sub, "is_init_key", None)
        if isinstance(key, str | tuple):
            keys.add(str(key))
    keys.discard("observation")
    return sorted(keys)


def _private(key: str | tuple) -> bool:
    parts = (key,) if isinstance(key, str) else key
    return any(p.startswith("_") for p in parts)


class ModelRegistry(ModelBook[_Model]):
    """The models of one actor, by ``model_id``.

    Args:
        specs: The models to build (ids must be unique); the first acts by default.
        observation_space: The single-env observation space.
        action_space: The single-env action space.
        device: Where the models live and run.

    Raises:
        ValueError: No specs, a duplicate or malformed ``model_id``, a factory that
            fails, or a model whose outputs do not fit a batch.

    Example::

        registry = ModelRegistry([ModelSpec()], env.observation_space, env.action_space, "cpu")
        version, action, extras = registry.act_compact("policy", torch.zeros(8, 4))
        registry.load_weights("policy", 1, new_state)   # -> 1
    """

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        observation_space: gymnasium.Space,
        action_space: gymnasium.Space,
        device: torch.device | str,
    ) -> None:
        self.device = torch.device(device)
        self._stage = DeviceStage(self.device)
        self.observation_codec = ObservationCodec(observation_space)
        self.action_codec = ActionCodec(action_space)
        models: dict[str, _Model] = {}
        for spec in specs:
            _check_id(spec.model_id, models)
            try:
                module = make_policy(
                    spec.path, observation_space, action_space, **from_plain(spec.kwargs)
                )
            except (ValueError, TypeError) as exc:
                raise ValueError(f"model {spec.model_id!r}: {exc}") from exc
            module = module.to(self.device).eval()
            models[spec.model_id] = _Model(
                spec, module, self.observation_codec, self.action_codec, self.device
            )
        super().__init__(models)

    def forward_path(self, model_id: str) -> str:
        """How ``model_id`` is called each step.

        ``"compact"`` (a built-in's ``act_compact``), ``"tensors"`` (a TensorDict
        module's inner modules called on tensors, see ``actor_service._kinds.env.tensor_forward``),
        ``"tensordict"`` (the module called on a TensorDict) or ``"module"`` (a plain
        ``nn.Module`` called on the observation).
        """
        return self._get(model_id).path

    def output_specs(self, model_id: str) -> dict[str | tuple, tuple[tuple[int, ...], torch.dtype]]:
        """Per-env shape and dtype of ``"action"`` (batch form) and every extra output."""
        return dict(self._get(model_id).output_specs)

    def act_compact(
        self, model_id: str, observation: torch.Tensor
    ) -> tuple[int, torch.Tensor, dict]:
        """One batched forward pass under the model's lock; the rollout's per-step call.

        The caller sets grad mode and the interaction type.

        Args:
            model_id: The acting model.
            observation: ``[B, *obs_shape]`` in batch form, on any device.

        Returns:
            ``(version, action, extras)``: the version of the weights used, the compact
            action and the extra outputs, on the host for a CUDA model (after one
            synchronisation, in buffers reused by the next call:
            :mod:`actor_service._kinds.env.device_stage`), else on the model's device.
        """
        model = self._get(model_id)
        observation = self._stage.to_device(observation)
        with model.lock:
            action, extras = model.forward(observation)
            version = model.version
        if self._stage.staged:
            action, extras = self._stage.to_host(action, extras)
            if model.path != "compact":  # a built-in's index is in range by construction
                self.action_codec.check_range(action)
        return version, action, extras
