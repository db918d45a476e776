"""The TensorDict policies a TorchRL-env actor holds: versioned, swapped atomically between steps.

:class:`TDModels` is the TorchRL core's counterpart of the env actor's
``ModelRegistry``: one module per ``model_id``, each a ``TensorDictModuleBase`` (or
the env's random actions) called on the rollout's TensorDict as TorchRL's ``Collector``
calls its policy, with a policy version (0 at start, then whatever the last applied
push said). A module's weights are its ``state_dict()``, buffers included, so an
annealed epsilon or sigma pushed by a learner reaches the actor. Every forward and
every swap take the model's lock, so a push lands between two env steps; pushes and
restores are validated in full first, by the same
:class:`~actor_service._core._model_book.ModelBook` as the env actor's. :func:`build_td_model`
builds one from its spec. No torchrl import: the core passes the env in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torch.nn.parameter import is_lazy

from actor_service._config import ModelSpec
from actor_service._core._model_book import LiveState, ModelBook
from actor_service._core._placement import CompiledForward
from actor_service._core._settings import factory_name
from common.import_paths import load_callable
from common.plain_config import from_plain
from common.weights import to_state_dict

__all__ = ["TDModel", "TDModels", "build_td_model", "check_td_factory"]

#: How a model acts: the rollout's TensorDict in, the same TensorDict (written) out.
Act = Callable[[TensorDictBase], TensorDictBase]


class TDModel:
    """One model: the module holding its weights, how it acts, its version and lock.

    Args:
        factory: What built it (``"random"``, ``"package.module:function"`` or the name of
            an in-memory factory), for messages.
        module: The ``nn.Module`` whose ``state_dict()`` (buffers included) is its weights.
        act: Called on the rollout's TensorDict; writes the action and any other outputs.
    """

    def __init__(self, factory: str, module: nn.Module, act: Act) -> None:
        self.factory = factory
        self.module = module
        # How it acts in force: eager, or compiled for a session (compile_policy).
        self.runner = self.act = CompiledForward(act)
        self.version = 0
        self.lock = threading.Lock()
        self.reference = LiveState(module)
        self.parameters_info = {
            k: (tuple(v.shape), v.dtype) for k, v in to_state_dict(module).items()
        }


def check_td_factory(spec: ModelSpec) -> None:
    """Refuse a model spec a TorchRL-env actor cannot build (``mlp`` reads gymnasium spaces).

    ``random`` with keyword arguments too: they were meant for a factory not named.
    """
    if spec.factory == "mlp":
        raise ValueError(
            f"model {spec.model_id!r}: the built-in 'mlp' reads gymnasium spaces; a TorchRL-env "
            "actor takes 'random' or 'package.module:function' (called with (env, **kwargs))"
        )
    if spec.factory == "random" and spec.kwargs:
        raise ValueError(
            f"model {spec.model_id!r}: the 'random' policy takes no arguments, got "
            f"{sorted(spec.kwargs)}: name the factory they are for, 'package.module:function' "
            "(--policy; LocalFleet's policy=)"
        )


def build_td_model(spec: ModelSpec, env: Any, rand_action: Act, device: torch.device) -> TDModel:
    """A model of a TorchRL-env actor: ``random`` acts by ``rand_action``, a factory gets ``env``.

    The factory is an import path or, in an in-process server, the callable itself.

    Raises:
        ValueError: ``mlp``, an unimportable factory, one that raises or returns no
            ``TensorDictModuleBase`` (naming the model and the factory).
    """
    check_td_factory(spec)
    name = factory_name(spec.factory)
    if spec.factory == "random":  # TorchRL's RandomPolicy draws from the action spec alike
        return TDModel(name, nn.Module(), rand_action)
    factory = spec.factory if callable(spec.factory) else load_callable(spec.factory)
    try:
        module = factory(env, **from_plain(spec.kwargs))
    except Exception as exc:
        raise ValueError(
            f"model {spec.model_id!r}: policy factory {name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(module, TensorDictModuleBase):
        raise ValueError(
            f"model {spec.model_id!r}: policy factory {name!r} returned a "
            f"{type(module).__name__}, not a tensordict.nn.TensorDictModuleBase"
        )
    module = module.to(device)
    _initialise_lazy(spec.model_id, name, module, env, device)
    return TDModel(name, module, module)


def _initialise_lazy(
    model_id: str, name: str, module: TensorDictModuleBase, env: Any, device: torch.device
) -> None:
    """Give lazy modules (``LazyLinear``, TorchRL's ``MLP`` without ``in_features``) their sizes.

    TorchRL's collector runs such a policy as it is; here its weights must exist before
    the actor describes them and takes pushes: one forward on the env's fake TensorDict
    (zeros shaped by its specs; no env step, the random state left as it was).

    Raises:
        ValueError: The forward fails (naming the model, the factory and the fix).
    """
    if not any(is_lazy(t) for t in (*module.parameters(), *module.buffers())):
        return
    try:
        with torch.random.fork_rng(), torch.no_grad():
            module(env.fake_tensordict().to(device))
    except Exception as exc:
        raise ValueError(
            f"model {model_id!r}: policy factory {name!r} holds lazy modules that one forward "
            f"on the env's fake_tensordict() could not size ({type(exc).__name__}: {exc}); "
            "give them their input sizes (in_features=...)"
        ) from exc


class TDModels(ModelBook[TDModel]):
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
