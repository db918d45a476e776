"""The learner's policy module, followed as TorchRL's collectors share it with their workers.

TorchRL's ``Collector(env, policy, ...)`` holds the learner's own policy object: its workers
read its memory, so an optimiser step or an annealed exploration buffer
(``EGreedyModule.step()``) is what the next batch acts with, and many scripts never call
``update_policy_weights_``. ``GrpcCollector(..., policy=module)`` gives the same result over
the network: :class:`SharedPolicy` remembers the module, and the collector's pusher
(:meth:`learner_client._pushes.Pusher.push_shared`) pushes it (parameters and buffers)
before the first batch and, unless told otherwise, whenever it changed before the next batch
is requested.

Noticing a change is cheap: a parameter changed in place (an optimiser step, a ``copy_``
under ``no_grad``) bumps its version counter, and buffers (an epsilon, a noise scale,
normalisation statistics: a few numbers) are compared with a copy of their last pushed
values, and a tensor given new memory (``param.data = other``) moves its data pointer.
Nothing is compared element by element on the parameters. A change made in place through
``.data`` on a *parameter* (``param.data.fill_(x)``) bumps no counter and is not seen: push
it with ``update_policy_weights_(module)``, which always sends. Buffers of more than
:data:`VALUE_CHECKED_BUFFER_ELEMENTS` elements are followed by their version counters alone.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar, cast

import torch
from tensordict import TensorDictBase
from torch import nn

__all__ = [
    "VALUE_CHECKED_BUFFER_ELEMENTS",
    "GivenWeights",
    "Plan",
    "SharedPolicy",
    "WeightsMark",
]

_R = TypeVar("_R")

#: Per tensor: its identity, version counter and data pointer (a change in place, new memory).
_Counters = tuple[tuple[int, int, int], ...]

#: Buffers up to this size are compared by value (``.data.copy_`` bumps no version counter,
#: and TorchRL's exploration modules anneal their buffers that way).
VALUE_CHECKED_BUFFER_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class GivenWeights:
    """The weights an ``update_policy_weights_`` call names, in each of its forms."""

    policy_or_weights: object
    weights: object
    policy: object
    weights_dict: object

    def nothing(self) -> bool:
        """Whether no form names weights (TorchRL's argument-less call)."""
        forms = (self.policy_or_weights, self.weights, self.policy, self.weights_dict)
        return all(form is None for form in forms)


class SharedPolicy:
    """The module passed as ``policy=``, and whether it changed since it was last pushed.

    Args:
        module: The learner's policy.
        follow: Push it whenever it changed before each batch (TorchRL's shared policy);
            False pushes it only at the start and when ``update_policy_weights_`` asks.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, ``follow`` not a bool.
    """

    @classmethod
    def of(cls, policy: object, *, follow: bool, env: object = None) -> SharedPolicy | None:
        """The ``policy=`` argument as the collector follows it; None when it holds no weights.

        TorchRL's collectors take any callable policy, and scripts pass weightless ones
        (``RandomPolicy(spec)``, or ``RandomPolicy()``, whose ``action_spec`` TorchRL's
        ``Collector`` fills from its env): the actors act with their own, so nothing is
        pushed, and a UserWarning says so. A spec-less one is given ``env``'s (the script's
        env object), as TorchRL's.

        Raises:
            TypeError: ``policy`` is neither an ``nn.Module`` nor callable, or it is a
                module and ``follow`` is not a bool.
        """
        if policy is None:
            return None
        if not isinstance(policy, nn.Module) and callable(policy):
            fill = getattr(policy, "set_action_spec_from_env", None)
            if callable(fill) and env is not None:
                fill(env)
            warnings.warn(
                f"policy={type(policy).__name__}(...) holds no weights to push: the actors act "
                f"with their own policy (a random one: start them with --policy random)",
                UserWarning,
                stacklevel=4,
            )
            return None
        return cls(cast("nn.Module", policy), follow=follow)  # not a module: refused there

    def __init__(self, module: nn.Module, *, follow: bool) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"policy must be an nn.Module or a callable without weights (the actors act "
                f"with their own copy), "
                f"got {type(module).__name__}"
            )
        if not isinstance(follow, bool):
            raise TypeError(f"push_policy_changes must be a bool, got {follow!r}")
        self.module = module
        self.follow = follow
        self.pushed = False
        self._mark: WeightsMark | None = None
        #: Other weights were pushed since the module (per-worker ones): an argument-less
        #: call sends it again, though it did not change (no automatic push for that).
        self._superseded = False

    def due(self) -> bool:
        """Whether the module must be pushed before the next batch.

        True before the first push; afterwards, when following and a parameter or
        buffer changed since the last push.
        """
        if not self.pushed:
            return True
        return self.follow and self.changed()

    def changed(self) -> bool:
        """Whether a parameter or buffer changed since :meth:`mark_pushed` (cheap)."""
        return self._mark is None or not self._mark.matches(self.module)

    def mark_pushed(self) -> None:
        """Record the module's state as pushed (call right before the push reads it)."""
        self.pushed = True
        self._superseded = False
        self._mark = WeightsMark.of(self.module)

    def forget(self) -> None:
        """Treat the module as changed (its last push failed somewhere)."""
        self._mark = None

    def planned(
        self, given: GivenWeights, *, default_model: bool, whole: bool, version: int | None
    ) -> Plan | None:
        """What an ``update_policy_weights_`` call sends, this module shared; None: nothing.

        ``default_model``: no ``model_id`` named; ``whole``: to every worker, unfiltered and
        uncast. Given weights the module can hold become it (:meth:`holdable`); with nothing
        given, the module is sent, unless it did not change since its last push and no
        ``version`` was asked for (None then). Changes nothing: :meth:`carry_out` does,
        once the call is checked, under the lock its push is made under.
        """
        to_all = default_model and whole
        copied = None
        if to_all and given.policy is None and given.weights_dict is None:
            copied = self.holdable(given.policy_or_weights, given.weights)
            if copied is not None:
                given = dataclasses.replace(given, policy_or_weights=self.module, weights=None)
        nothing, marks = given.nothing(), False
        module = self.module is given.policy_or_weights or self.module is given.policy
        if to_all:
            unchanged = self.pushed and not self.changed() and not self._superseded
            if nothing and version is None and unchanged:
                return None  # unchanged since its last push: nothing sent, the version stays
            marks = nothing or module  # the whole module, to every worker
        supersedes = default_model and not nothing and not module  # e.g. per-worker weights
        if nothing and default_model:  # TorchRL's no-argument form: the collector's own policy
            given = dataclasses.replace(given, policy=self.module)
        return Plan(given, copied, marks, supersedes)

    def carry_out(self, plan: Plan, push: Callable[[], _R]) -> _R:
        """Carry out a checked :meth:`planned` call: its weights into the module, then ``push()``.

        A plan sending the whole module to every worker marks it pushed (no automatic push
        follows; one follows if the push fails). After other weights, an argument-less call
        sends the module again.
        """
        if plan.copied is not None:
            state = self.module.state_dict(keep_vars=True)
            with torch.no_grad():
                for key, value in plan.copied.items():
                    if value.data_ptr() != state[key].data_ptr():  # from_module(policy): its own
                        state[key].copy_(value)
        if plan.marks:
            self.mark_pushed()
        if plan.supersedes:
            self._superseded = True
        try:
            return push()
        except BaseException:
            if plan.marks:
                self.forget()  # pushed again before the next batch
            raise

    def holdable(
        self, policy_or_weights: object, weights: object
    ) -> dict[str, torch.Tensor] | None:
        """The given weights a push to every worker copies into the module; None: sent as given.

        TorchRL's ``Collector`` copies what ``update_policy_weights_(weights)`` is given (a
        TensorDict or mapping of tensors) into its policy; so does this, so that the module's
        later pushes and checks follow them. Weights it cannot hold (other names or shapes,
        a per-worker mapping) are sent as given, the module left as it is.
        """
        if (policy_or_weights is None) == (weights is None):  # neither given, or both (refused)
            return None
        named = _by_state_name(weights if policy_or_weights is None else policy_or_weights)
        if named is None:
            return None
        state = self.module.state_dict(keep_vars=True)
        if any(
            key not in state or nn.parameter.is_lazy(state[key]) or state[key].shape != value.shape
            for key, value in named.items()
        ):
            return None
        return named


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one ``update_policy_weights_`` call does with the shared module.

    Attributes:
        given: The weights the call sends, in its forms.
        copied: ``{state_dict name: tensor}`` copied into the module first; None: none.
        marks: The whole module goes to every worker: it counts as pushed.
        supersedes: Other weights go to the module's model (per-worker ones, say).
    """

    given: GivenWeights
    copied: dict[str, torch.Tensor] | None
    marks: bool
    supersedes: bool


def _counters(tensors: Iterable[torch.Tensor]) -> _Counters:
    return tuple((id(t), t._version, t.data_ptr()) for t in tensors)


class WeightsMark:
    """What a push read from the weights it was given, to tell later whether they changed.

    The signs the module docstring names: version counters and data pointers of every
    tensor, values of small ones (a module's buffers; a mapping's tensors up to
    :data:`VALUE_CHECKED_BUFFER_ELEMENTS` elements). A tensor of ``model.state_dict()``
    shares its parameter's counter, so an optimiser step on the model shows. A lazy module
    not yet run has no mark (:meth:`of` gives None): its weights are not there to follow.
    """

    def __init__(self, counters: _Counters, small: list[torch.Tensor]) -> None:
        self._counters, self._small = counters, small

    @classmethod
    def of(cls, source: object) -> WeightsMark | None:
        """The mark of a module, TensorDict or mapping of tensors; None for other forms."""
        tensors, checked = _tensors(source)
        if tensors is None:
            return None
        return cls(_counters(tensors), [t.detach().clone() for t in checked])

    def matches(self, source: object) -> bool:
        """Whether ``source`` is as this mark saw it (same tensors, untouched)."""
        tensors, checked = _tensors(source)
        if (
            tensors is None
            or _counters(tensors) != self._counters
            or len(checked) != len(self._small)
        ):
            return False
        pairs = zip(self._small, checked, strict=True)  # as many: the counters matched
        return all(torch.equal(old, new.detach()) for old, new in pairs)


def _tensors(source: object) -> tuple[list[torch.Tensor] | None, list[torch.Tensor]]:
    """Every tensor of ``source`` and those compared by value; (None, []) if not weights.

    Also (None, []) when a tensor is not :func:`_readable`.
    """
    if isinstance(source, nn.Module):
        buffers = list(source.buffers())
        tensors = [*source.parameters(), *buffers]
    elif isinstance(source, TensorDictBase):
        tensors = buffers = list(source.values(include_nested=True, leaves_only=True))
    elif isinstance(source, Mapping):
        tensors = buffers = list(source.values())
    else:
        return None, []
    if not all(_readable(t) for t in tensors):
        return None, []
    return tensors, [t for t in buffers if t.numel() <= VALUE_CHECKED_BUFFER_ELEMENTS]


def _readable(value: object) -> bool:
    """Whether ``value`` is a tensor whose memory may be read: followed, copied from.

    A lazy module's parameter (in a module, or ``TensorDict.from_module(lazy)``), a sparse
    tensor or one on the meta device is not: reading its size, data pointer or values
    raises torch's own error. Weights holding one are never followed nor copied into the
    module (half of them, before the error); their push's encoding refuses them, naming
    the key and the fix.
    """
    return (
        isinstance(value, torch.Tensor)
        and not nn.parameter.is_lazy(value)
        and value.layout == torch.strided
        and value.device.type != "meta"
    )


def _by_state_name(weights: object) -> dict[str, torch.Tensor] | None:
    """``weights`` as ``{state_dict name: tensor}``: None unless a TensorDict or such a mapping."""
    if isinstance(weights, TensorDictBase):
        named = dict(weights.flatten_keys(".").items())
    elif isinstance(weights, Mapping):
        named = dict(weights)
    else:
        return None
    if not named or not all(isinstance(k, str) and _readable(v) for k, v in named.items()):
        return None  # sent as given: its encoding names what is wrong (a lazy parameter...)
    return named
