"""``update_policy_weights_``'s arguments, normalised into one :class:`WeightRequest`.

:func:`normalize_update_args` turns TorchRL's signature (weights given positionally,
``weights=``, ``policy=`` or ``weights_dict=``) into one request ({model_id: source}, target
worker_ids, an explicit version, a part of a multi-part push) or raises TorchRL's ValueErrors
for conflicting arguments; a mapping source is a subset of the model's keys, a module all of
them. :func:`resolve_worker_ids` checks the targets against the fleet. What is then encoded
and sent is :mod:`learner_client._weights`' and :mod:`learner_client._pushes`'.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping, Sequence

from tensordict import TensorDictBase
from torch import nn

from common.config import DEFAULT_MODEL_ID, MAX_POLICY_VERSION, as_int, check_model_id
from common.errors import UnknownWorkerError
from common.weights import Part
from learner_client._weights import PushOptions, WeightSource

__all__ = ["WeightRequest", "normalize_update_args", "renamed_weights", "resolve_worker_ids"]

#: The most unknown worker_ids an error lists (a caller may pass a million).
_MAX_LISTED = 10


@dataclasses.dataclass(frozen=True)
class WeightRequest:
    """One normalised ``update_policy_weights_`` call.

    Attributes:
        sources: ``{model_id: source}``; a None source means "the last one given".
        worker_ids: Targets as given (None: every worker); checked later against the fleet.
        nested: The caller used ``weights_dict``, so results are keyed by model_id.
        per_worker: TorchRL's per-worker form ``{worker_id: weights}`` for the one model
            in ``sources`` (whose source is then None); ``worker_ids`` are its keys.
        options: How every model of the request is encoded; None: not given (new weights
            are sent as they are, a re-send of the last weights as they were last sent).
        delta: Send each target only what changed since it last applied (``_deltas``).
        version: The version to install, as given (learner ranks agree on it); None:
            the model's next version.
        part: This rank's part of a multi-part push of ``version``; None: a whole push.
    """

    sources: dict[str, WeightSource | None]
    worker_ids: tuple[int, ...] | None
    nested: bool
    per_worker: dict[int, WeightSource] | None = None
    options: PushOptions | None = None
    delta: bool = False
    version: int | None = None
    part: Part | None = None


def _check_source(name: str, value: object) -> WeightSource:
    if isinstance(value, nn.Module | TensorDictBase | Mapping):
        return value
    raise TypeError(
        f"{name} must be an nn.Module, a TensorDict or a dict of tensors, "
        f"got {type(value).__name__}"
    )


def _normalize_worker_ids(worker_ids: object) -> tuple[int, ...] | None:
    if worker_ids is None:
        return None
    single = as_int(worker_ids)
    items = [single] if single is not None else worker_ids
    if not isinstance(items, Iterable) or isinstance(items, str | bytes):
        raise TypeError(f"worker_ids must be an int, a list of ints or None, got {worker_ids!r}")
    out: dict[int, None] = {}  # the first of each id, in order, found again in O(1)
    for item in items:
        wid = as_int(item)
        if wid is None:
            raise TypeError(f"worker_ids must hold ints, got {item!r} in {worker_ids!r:.80}")
        out[wid] = None
    if not out:
        raise ValueError("worker_ids is empty; pass None to update every worker")
    return tuple(out)


def renamed_weights(policy_or_weights: object, policy_weights: object) -> object:
    """``policy_or_weights``, or TorchRL's deprecated ``policy_weights`` in its place (warned).

    Raises:
        ValueError: Both given.
    """
    if policy_weights is None:
        return policy_or_weights
    if policy_or_weights is not None:
        raise ValueError("pass the weights once: got policy_or_weights and policy_weights")
    warnings.warn(
        "policy_weights is deprecated: pass the weights as policy_or_weights",
        DeprecationWarning,
        stacklevel=3,
    )
    return policy_weights


def normalize_update_args(
    policy_or_weights: object = None,
    *,
    weights: object = None,
    policy: object = None,
    worker_ids: object = None,
    model_id: object = None,
    weights_dict: object = None,
    delta: object = False,
    options: PushOptions | None = None,
    version: object = None,
    part: object = None,
    default_model_id: str = DEFAULT_MODEL_ID,
) -> WeightRequest:
    """Turn TorchRL's ``update_policy_weights_`` arguments into one :class:`WeightRequest`.

    ``options`` (a wire dtype, ``only_trainable``) apply to every model of the request;
    ``default_model_id`` is the model updated when no ``model_id`` is named (the collector's
    acting model, as TorchRL's call updates the collector's policy).

    Raises:
        ValueError: More than one of ``policy_or_weights``/``weights``/``policy``;
            ``weights_dict`` with ``model_id`` or with any of those three; an empty
            ``weights_dict`` or ``worker_ids``; an empty ``model_id``; weights without a
            tensor (an empty TensorDict or mapping) outside a ``part``; ``delta`` with
            per-worker weights (``delta`` combines with ``options``); a ``version``
            outside ``[1, 2**63 - 1]``; a ``part`` out of range, without ``version``,
            without weights, with per-worker weights or with ``only_trainable``.
        TypeError: A source, ``weights_dict``, ``worker_ids``, ``delta``, ``version``
            or ``part`` of the wrong type.
    """
    if not isinstance(delta, bool):
        raise TypeError(f"delta must be a bool, got {delta!r}")
    named = {"policy_or_weights": policy_or_weights, "weights": weights, "policy": policy}
    given = [name for name, value in named.items() if value is not None]
    if len(given) > 1:
        raise ValueError(f"pass the weights once: got {' and '.join(given)}")
    targets = _normalize_worker_ids(worker_ids)
    if weights_dict is not None:
        if model_id is not None:
            raise ValueError("weights_dict and model_id are mutually exclusive")
        if given:
            raise ValueError(f"weights_dict and {given[0]} are mutually exclusive")
        request = WeightRequest(_models(weights_dict), targets, nested=True, options=options)
    else:
        name = given[0] if given else None
        source = named[name] if name is not None else None
        mid = default_model_id if model_id is None else check_model_id(model_id)
        request = _one_model(name, source, mid, targets, options)
    if delta and request.per_worker is not None:
        raise ValueError("delta pushes send one set of weights; per-worker weights go in full")
    checked = _check_version(version)
    request = _with_part(dataclasses.replace(request, delta=delta, version=checked), part)
    if request.part is None:  # a rank's part may hold no key: the others hold them all
        _check_not_empty(request)
    return request


def _check_not_empty(request: WeightRequest) -> None:
    """Refuse a whole push of weights that hold no tensor: it would change nothing.

    Sent, it would install a new version whose weights are the old ones (the actors
    apply an empty subset), so versions would move although no weight did.

    Raises:
        ValueError: A TensorDict or mapping without a tensor leaf, naming whose it is.
    """
    named = {f"model_id {mid!r}": src for mid, src in request.sources.items()}
    named |= {f"worker_id {wid}": src for wid, src in (request.per_worker or {}).items()}
    for whose, source in named.items():
        if source is not None and not _holds_tensor(source):
            raise ValueError(
                f"the weights given for {whose} hold no tensor (an empty TensorDict or "
                f"mapping): nothing would change, so nothing was sent and the version "
                f"stays; pass the model's weights (a module, TensorDict.from_module(policy) "
                f"or its state_dict()), or no weights to send the last ones again"
            )


def _holds_tensor(source: WeightSource) -> bool:
    """Whether ``source`` has a leaf (a module always does: the actor checks its keys)."""
    if isinstance(source, nn.Module):
        return True
    if isinstance(source, TensorDictBase):
        return not source.is_empty()
    return any(not isinstance(value, Mapping) or _holds_tensor(value) for value in source.values())


def _check_version(version: object) -> int | None:
    """An explicit version: an int in ``[1, MAX_POLICY_VERSION]`` (actors refuse others)."""
    if version is None:
        return None
    number = as_int(version)
    if number is None:
        raise TypeError(f"version must be an int or None, got {version!r:.80}")
    if not 1 <= number <= MAX_POLICY_VERSION:
        raise ValueError(f"version must be in [1, {MAX_POLICY_VERSION}], got {number}")
    return number


def _with_part(request: WeightRequest, part: object) -> WeightRequest:
    """``request`` as this rank's ``part=(index, count)`` of a multi-part push, checked."""
    if part is None:
        return request
    if isinstance(part, Part):
        part = (part.index, part.count)
    if not isinstance(part, tuple | list) or len(part) != 2:
        raise TypeError(f"part must be (index, count), e.g. (rank, world_size); got {part!r:.80}")
    checked = Part(*part)  # a ValueError (WeightsError) when out of range
    if request.version is None:
        raise ValueError(
            "part= needs version=: every rank pushes its part of the same, agreed version"
        )
    if request.per_worker is not None or any(s is None for s in request.sources.values()):
        raise ValueError("part= needs this rank's weights (one mapping or module per model)")
    if request.options is not None and request.options.only_trainable:
        raise ValueError(
            "part= does not combine with only_trainable: the parts of a version hold every "
            "key of the model between them (or are deltas)"
        )
    return dataclasses.replace(request, part=checked)


def _one_model(
    given: str | None,
    source: object,
    mid: str,
    targets: tuple[int, ...] | None,
    options: PushOptions | None,
) -> WeightRequest:
    """The request for model ``mid``, whose ``source`` came as the argument named ``given``.

    ``given`` None means no weights were passed: the model's last ones are sent again.
    """
    if given == "policy" and not isinstance(source, nn.Module):
        raise TypeError(f"policy must be an nn.Module, got {type(source).__name__}")
    if given == "weights" and not isinstance(source, TensorDictBase | Mapping):
        raise TypeError(
            f"weights must be a TensorDict or a dict of tensors, got {type(source).__name__}"
        )
    if isinstance(source, Mapping) and _is_per_worker(source):
        if targets is not None:
            raise ValueError("per-worker weights: {worker_id: weights} or worker_ids=, not both")
        per_worker: dict[int, WeightSource] = {}
        for key, src in source.items():  # numpy and tensor ints are worker_ids too
            if (wid := int(as_int(key) or 0)) in per_worker:
                raise ValueError(f"per-worker weights name worker_id {wid} twice")
            per_worker[wid] = _check_source(f"{given}[{wid}]", src)
        return WeightRequest({mid: None}, tuple(per_worker), False, per_worker, options)
    checked = None if given is None else _check_source(given, source)
    return WeightRequest({mid: checked}, targets, nested=False, options=options)


def _models(weights_dict: object) -> dict[str, WeightSource | None]:
    """``weights_dict`` checked: ``{model_id: weights or None}``, not empty."""
    if not isinstance(weights_dict, Mapping):
        raise TypeError(
            f"weights_dict must map model_id to weights, got {type(weights_dict).__name__}"
        )
    if not weights_dict:
        raise ValueError("weights_dict is empty")
    return {
        check_model_id(mid): None if src is None else _check_source(f"weights_dict[{mid!r}]", src)
        for mid, src in weights_dict.items()
    }


def _is_per_worker(source: object) -> bool:
    """Whether ``source`` is TorchRL's ``{worker_index: weights}`` (int keys), not a state dict.

    An empty mapping is no per-worker form: it is weights without a tensor
    (:func:`_check_not_empty` refuses a push of them).

    Raises:
        TypeError: A mapping mixing worker ids and parameter names.
    """
    if not isinstance(source, Mapping) or isinstance(source, TensorDictBase):
        return False
    worker_keys = [k for k in source if as_int(k) is not None]  # numpy's, a tensor's too
    if not worker_keys:
        return False
    if len(worker_keys) != len(source):
        others = [k for k in source if as_int(k) is None][:3]
        raise TypeError(
            f"per-worker weights map int worker_ids to weights; the mapping also has {others}"
        )
    return True


def resolve_worker_ids(
    worker_ids: tuple[int, ...] | None, known: Sequence[int], members: Sequence[int] = ()
) -> list[int]:
    """The target worker_ids of a push, checked against those this collector pushes to.

    Args:
        worker_ids: The ids asked for; None: every one of ``known``.
        known: The ids this collector pushes to (its rank's own actors).
        members: Every actor of the fleet, other ranks' included.

    Raises:
        UnknownWorkerError: An id not in ``known``, naming the known ids (and saying
            when the id is another rank's actor).
    """
    if worker_ids is None:
        return sorted(known)
    owned, fleet = set(known), set(members)
    unknown = [w for w in worker_ids if w not in owned]
    if unknown:
        others = [w for w in unknown if w in fleet]
        whose = (
            f" ({_listed(others)} are other learner ranks' actors: each rank pushes to its own)"
            if others
            else ""
        )
        raise UnknownWorkerError(
            f"unknown worker_ids {_listed(unknown)}; the fleet has worker_ids "
            f"{sorted(known)}{whose}"
        )
    return list(worker_ids)


def _listed(worker_ids: Sequence[int]) -> str:
    """The first :data:`_MAX_LISTED` of ``worker_ids``, and how many there are when more."""
    if len(worker_ids) <= _MAX_LISTED:
        return str(list(worker_ids))
    shown = ", ".join(str(w) for w in worker_ids[:_MAX_LISTED])
    return f"[{shown}, ...] ({len(worker_ids)} in all)"
