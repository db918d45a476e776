"""An env's own weights: the parameters of its transforms, which the learner trains.

Some TorchRL envs hold networks in their transforms: ``RNDTransform``'s target and
predictor compute an intrinsic reward at every step, and the script trains the predictor
between batches. With TorchRL's ``Collector`` the env is the script's own object, so the
next batch sees the trained predictor. On a fleet each actor's env is its own copy: the
learner pushes the parameters of the script's env (``create_env_fn``) to the actors as the
model :data:`ENV_MODEL_ID` whenever they changed, as it pushes a ``policy=`` module, and the
actors' envs step with them (``docs/collector.md``, "An env with weights").

Both sides name the weights by ``env.named_parameters()`` and hold them in a module built by
:func:`parameters_module`, whose ``state_dict()`` is exactly those parameters (the same
``Parameter`` objects, so an optimiser step on the learner or a push on the actor is seen by
the env itself). An actor stepping several envs ties them to one set (:func:`tie_parameters`).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

__all__ = [
    "ENV_MODEL_ID",
    "env_parameters",
    "parameters_module",
    "tie_parameters",
    "trains_parameters",
]

#: The ``model_id`` under which an actor holds, and a learner pushes, the env's own weights.
ENV_MODEL_ID = "env"


def env_parameters(env: nn.Module) -> dict[str, nn.Parameter]:
    """``env``'s parameters by name (its transforms' networks); empty for most envs."""
    return dict(env.named_parameters())


def trains_parameters(env: nn.Module) -> bool:
    """Whether ``env`` has a parameter that takes gradients (a network the script trains)."""
    return any(p.requires_grad for p in env.parameters())


def parameters_module(named: Mapping[str, nn.Parameter]) -> nn.Module:
    """A module whose ``state_dict()`` is ``named``: the same ``Parameter`` objects, by name.

    Dotted names become nested submodules (``"a.0.weight"``: module ``a``, child ``0``).
    """
    root = nn.Module()
    for name, parameter in named.items():
        owner = _owner(root, name, create=True)
        owner.register_parameter(name.rpartition(".")[2], parameter)
    return root


def tie_parameters(env: nn.Module, named: Mapping[str, nn.Parameter]) -> None:
    """Make ``env`` use the ``Parameter`` objects of ``named`` in place of its own.

    Raises:
        ValueError: ``env`` has other parameter names than ``named``, or one of another
            shape or dtype (its factory builds other networks).
    """
    own = env_parameters(env)
    if own.keys() != named.keys():
        raise ValueError(
            f"the envs hold different weights: {sorted(own.keys() ^ named.keys())[:5]} are in "
            "one env and not in another; every env of an actor must build the same networks"
        )
    for name, parameter in named.items():
        mine = own[name]
        if mine.shape != parameter.shape or mine.dtype != parameter.dtype:
            raise ValueError(
                f"the envs hold {name!r} as {list(mine.shape)} {mine.dtype} and as "
                f"{list(parameter.shape)} {parameter.dtype}: every env of an actor must build "
                "the same networks"
            )
        owner = _owner(env, name, create=False)
        setattr(owner, name.rpartition(".")[2], parameter)


def _owner(root: nn.Module, name: str, *, create: bool) -> nn.Module:
    """The module that holds the parameter ``name`` (its dotted path's last module)."""
    module = root
    for part in name.split(".")[:-1]:
        child = module._modules.get(part)
        if child is None:
            if not create:
                raise ValueError(f"no module {part!r} on the path of {name!r}")
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module
