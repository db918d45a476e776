"""The script's env (``create_env_fn``) on a fleet: its signature, its state, its layout.

The env it builds must match the fleet's batches key by key. TorchRL's
``Collector(create_env_fn=env, ...)`` steps the script's own env object, so a script may
read that env's state afterwards:
``ppo_mujoco.py`` saves its ``VecNorm`` statistics with every checkpoint
(``get_vecnorm_state(train_env)``). On a fleet the actors step their own copies and the
script's env is never stepped, so :class:`ScriptEnv` loads an actor's env state (GetState's
``env``: the transforms' ``state_dict``) into the script's env after each batch, when that
env has state to follow (an empty ``state_dict()``: nothing is fetched), also an env that
never stepped (:mod:`learner_client._env_state`: a fresh ``VecNorm`` gets ``loc``/``scale``,
lazy buffers such as ``CatFrames``'s are made in the actor's shapes). The actor is the
first worker of the fleet, or the first ones when the script's env holds more envs than one
actor steps (each actor's envs in turn, as the batch lays them out); an actor's pool of one
env hands over that env's state (``worker0``). A state that does not fit the script's env
(another env, other envs) is not loaded at all, a UserWarning says so once and the env is
no longer followed; an actor that cannot be reached leaves the env as it was until the next
batch.

A batch also takes the layout of the script's env where the fleet can give it: TorchRL's
``Collector`` gives ``env.batch_size + [T]`` (``[T]`` for one unbatched env), a fleet
``[actors, envs, T]`` (each actor's part ``[envs, T]``), so a batch gets the script env's
``batch_size`` where the fleet steps as many envs: one actor with one env gives a
single-env script TorchRL's ``[T]``, two actors sharing a ``ParallelEnv``'s four envs give
its ``[4, T]``, in the batches and in the replay buffer alike. No torchrl import here: the
env is whatever the user's callable returns.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import torch
from tensordict import NonTensorStack, TensorDictBase

from common.env_state import dense_refusal, env_has_state
from common.env_weights import (
    ENV_MODEL_ID,
    env_parameters,
    parameters_module,
    trains_parameters,
)
from common.errors import RlfleetError, UnknownModelError
from common.gym_layout import batch_dtype, batch_shape
from learner_client._env_state import joined_state, load_env_state, pool_size
from learner_client._shared_policy import SharedPolicy

#: How the collector pushes a followed module when it is due (``Pusher.push_shared``).
PushShared = Callable[[SharedPolicy | None, str], None]

__all__ = ["ScriptEnv", "check_env_signature", "env_signature", "is_env_object"]

log = logging.getLogger("learner_client")


#: A key's trailing shape and dtype in one step of an env.
KeySpec = tuple[tuple[int, ...], torch.dtype]


class EnvSignature(NamedTuple):
    """What ``create_env_fn``'s env says a batch holds.

    Attributes:
        keys: Each key's trailing shape and dtype in one step.
        batch_size: The env's ``batch_size`` for a TorchRL env; None for a gymnasium env
            (TorchRL's collectors take no such env).
    """

    keys: dict[Any, KeySpec]
    batch_size: tuple[int, ...] | None


def env_signature(
    create_env_fn: Callable[..., Any],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> EnvSignature:
    """The keys, trailing shapes and dtypes of one step of the env ``create_env_fn`` builds.

    ``create_env_kwargs`` may be a multi-worker collector's list (one per worker): the
    first worker's build the env, as the first of ``create_env_fn``'s list is the one read.
    A TorchRL env gives every leaf of its ``fake_tensordict()``; a gymnasium env its
    ``observation`` (actions are encoded by the actors). The env is closed afterwards,
    unless ``create_env_fn`` is a TorchRL env itself, as TorchRL's ``Collector`` also
    takes one: that env is the script's, read as it is (calling it would run
    ``EnvBase.forward``) and left open.

    Raises:
        TypeError: ``create_env_fn`` is not callable, or builds neither kind of env.
    """
    if is_env_object(create_env_fn):
        return _signature(create_env_fn)
    if not callable(create_env_fn):
        raise TypeError(f"create_env_fn must be callable, got {create_env_fn!r:.60}")
    kwargs = create_env_kwargs
    if isinstance(kwargs, list | tuple):  # a multi-worker collector's, one per worker
        kwargs = kwargs[0] if kwargs else None
    env = create_env_fn(**dict(cast("Mapping[str, Any] | None", kwargs) or {}))
    try:
        return _signature(env)
    finally:
        if is_env_object(env):  # a batched env never started is closed already to TorchRL
            env.close(raise_if_closed=False)
        elif callable(close := getattr(env, "close", None)):
            close()


def is_env_object(value: object) -> bool:
    """Whether ``value`` is a TorchRL env object (not a constructor: an env class is one)."""
    return not isinstance(value, type) and callable(getattr(value, "fake_tensordict", None))


def _signature(env: Any) -> EnvSignature:
    """:func:`env_signature` of an env built (or given) already."""
    fake = getattr(env, "fake_tensordict", None)
    if callable(fake):
        if refusal := dense_refusal(env, "create_env_fn's env"):
            raise ValueError(refusal)
        td = fake()
        size = tuple(getattr(env, "batch_size", ()))
        dims = len(size)
        keys = {
            key: (tuple(value.shape[dims:]), value.dtype)
            for key, value in td.items(include_nested=True, leaves_only=True)
            if not _private(key)
        }
        return EnvSignature(keys, size)
    space = getattr(env, "observation_space", None)
    if space is None or getattr(space, "dtype", None) is None:
        raise TypeError(
            f"create_env_fn returned a {type(env).__name__}: neither a TorchRL env "
            "nor a gymnasium env with a Box observation space"
        )
    layout = (batch_shape(space), batch_dtype(space))  # as a gymnasium actor batches it
    return EnvSignature({"observation": layout}, None)


def _private(key: object) -> bool:
    parts = key if isinstance(key, tuple) else (key,)
    return any(str(p).startswith("_") for p in parts) or parts[0] == "collector"


def check_env_signature(expected: Mapping[Any, KeySpec], batch: Any, worker: str) -> None:
    """Check a fleet batch against :func:`env_signature` of ``create_env_fn``'s env.

    Raises:
        ValueError: A key of the env missing from the batch, or with another trailing
            shape or dtype (naming the key, both specs and the actor).
    """
    keys = set(batch.keys(include_nested=True, leaves_only=True))
    for key, (shape, dtype) in expected.items():
        if key not in keys:
            raise ValueError(
                f"create_env_fn's env has {key!r}, which the batches of {worker} lack "
                f"(they hold {_observation_keys(keys)}): {_ANOTHER_ENV}"
            )
        value = batch.get(key)
        trailing = tuple(value.shape[value.dim() - len(shape) :]) if shape else ()
        if value.dtype != dtype or trailing != shape:
            raise ValueError(
                f"create_env_fn's env has {key!r} as {list(shape)} {dtype}, the batches of "
                f"{worker} as {list(trailing)} {value.dtype}: {_ANOTHER_ENV}"
            )


#: The end of :func:`check_env_signature`'s refusals: the two causes and their fixes.
_ANOTHER_ENV = (
    "the actors run another env, or host it another way: a gymnasium actor (the default "
    "kind) writes every observation as 'observation', where TorchRL's wrappers may name "
    "it otherwise (an RGB image 'pixels'); host the env as a TorchRL env for TorchRL's "
    'keys (kind="torchrl", an env factory returning e.g. GymWrapper(env))'
)


def _observation_keys(keys: set[Any]) -> str:
    """The root keys of a batch a message lists (not the bookkeeping ones)."""
    names = sorted({str(k if isinstance(k, str) else k[0]) for k in keys} - {"collector", "next"})
    return ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")


#: What reads one actor's decoded state (``GrpcCollector.actor_state``).
StateReader = Callable[[int], Mapping[str, Any]]


def _layout_message(size: tuple[int, ...], got: tuple[int, ...]) -> str:
    """The warning for a fleet stepping another number of envs than the script's env."""
    envs = math.prod(size)
    return (
        f"the fleet steps {math.prod(got[:-1])} envs per batch, batches {list(got)} "
        f"([actors, envs, time] when sync), where the script's env (create_env_fn) has "
        f"batch_size {list(size)}, so TorchRL's collector would give {[*size, got[-1]]}; "
        f"for TorchRL's layout give the fleet {envs} env{'s' * (envs != 1)} in all "
        f"(actors x num_envs, e.g. LocalFleet(1, num_envs={envs}, ...)), or keep this "
        f"layout and read the batches as [actors, envs, time]"
    )


class ScriptEnv:
    """The env of ``create_env_fn``: its signature, and the script's env if it is one.

    Args:
        create_env_fn: TorchRL's argument: an env constructor, or a TorchRL env itself.
        create_env_kwargs: Keyword arguments of the constructor.
        per_actor: Shape each actor's part as a worker's batch, each worker stepping the
            env (``RayCollector``'s drop-in form, and a multi-worker collector's list of
            constructors): the env dimension of ``[..., envs, T]`` becomes the env's
            ``batch_size`` where the actor steps as many envs, the actors' dimension (sync)
            stays, as ``MultiSyncCollector`` stacks its workers; never warns.
    """

    @classmethod
    def of(cls, create_env_fn: Any, create_env_kwargs: Any, *, on_ray: bool) -> ScriptEnv | None:
        """The ``ScriptEnv`` of a collector's ``create_env_fn`` (None when not given).

        A list (``MultiSyncCollector``'s and ``RayCollector``'s, one constructor per worker)
        is read through its first, each actor's part shaped as one worker's batch.
        """
        per_worker = isinstance(create_env_fn, list | tuple)
        env_fn = (create_env_fn[0] if create_env_fn else None) if per_worker else create_env_fn
        if env_fn is None:
            return None
        return cls(env_fn, create_env_kwargs, per_actor=on_ray or per_worker)

    def __init__(
        self,
        create_env_fn: Callable[..., Any],
        create_env_kwargs: Mapping[str, Any] | None,
        *,
        per_actor: bool = False,
    ) -> None:
        self._per_actor = per_actor
        signature = env_signature(create_env_fn, create_env_kwargs)
        self._signature: dict[Any, Any] | None = signature.keys
        self._batch_size = signature.batch_size
        self._warned = False  # about a fleet stepping another number of envs
        own = is_env_object(create_env_fn)
        #: The env object the script gave (a TorchRL env), or None for a constructor.
        self.given = create_env_fn if own else None
        self._env = create_env_fn if own and env_has_state(create_env_fn) else None
        #: The script's env's own weights, pushed to the actors' envs whenever they changed,
        #: when the script trains some of them (``common.env_weights``); None otherwise.
        self.weights = _trained_weights(create_env_fn) if own else None

    def push_weights(self, push_shared: PushShared) -> None:
        """Push the env's weights to the actors' envs if they changed (docs/collector.md).

        Raises:
            UnknownModelError: The actors' envs hold no weights to take them.
        """
        try:
            push_shared(self.weights, ENV_MODEL_ID)
        except UnknownModelError as exc:
            raise UnknownModelError(
                f"create_env_fn's env holds weights the script trains (an RNDTransform's "
                f"networks, say), which the actors' envs must step with: {exc}. Run the actors "
                f"with --kind torchrl, env_backend 'sync', and an env factory that builds the "
                f"same transforms (docs/collector.md, 'An env with weights')"
            ) from exc

    @property
    def followed(self) -> bool:
        """Whether the script's env follows an actor's env state after each batch."""
        return self._env is not None

    def shaped(self, batch: Any) -> Any:
        """``batch`` (``[actors, envs, T]`` or ``[envs, T]``) as ``env.batch_size + [T]``.

        Only where the envs are as many as the script's env steps; otherwise unchanged.
        """
        size = self._batch_size
        if self._per_actor:
            return self._per_actor_shaped(batch)
        lead = tuple(batch.batch_size[:-1])
        if size is not None and math.prod(lead) != math.prod(size) and not self._warned:
            self._warned = True
            warnings.warn(_layout_message(size, tuple(batch.batch_size)), UserWarning, stacklevel=4)
        if size is None or lead == size or math.prod(lead) != math.prod(size):
            return batch
        if not size:
            return batch[(0,) * len(lead)]
        return _reshape(batch, (*size, batch.batch_size[-1]))

    def _per_actor_shaped(self, batch: Any) -> Any:
        """``[..., envs, T]`` as ``[..., *env.batch_size, T]`` where the envs are as many."""
        size, shape = self._batch_size, tuple(batch.batch_size)
        if size is None or len(shape) < 2 or shape[-2] != math.prod(size) or shape[-2:-1] == size:
            return batch
        outer = shape[:-2]
        if not size and not outer:
            return batch[0]
        return _reshape(batch, (*outer, *size, shape[-1]))

    def after_batch(self, batch: Any, workers: list[int], read_state: StateReader) -> None:
        """Check the first batch; load an actor's env state into the script's env.

        Raises:
            ValueError: The first batch lacks a key of the env, or has it in another
                shape or dtype (:func:`check_env_signature`).
        """
        if self._signature is not None:
            check_env_signature(self._signature, batch, f"actors {workers}")
            self._signature = None
        self.follow(workers, read_state)

    def follow(self, workers: list[int], read_state: StateReader) -> None:
        """Load the actors' env state into the script's env; stop following if it does not fit.

        After each batch and after a restore. Once it does not fit, a UserWarning says so
        and the env is left as it was.
        """
        if self._env is None or not workers:
            return
        states = self._read_states(workers, read_state)
        if not states:
            return
        try:
            load_env_state(self._env, joined_state(states, self._env))
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            message = (
                f"create_env_fn's env no longer follows the env state of worker_ids "
                f"{workers[: len(states)]}, which does not fit it: {str(exc).splitlines()[0]}"
            )
            log.warning("%s", message)
            warnings.warn(message, UserWarning, stacklevel=5)
            self._env = None

    def _read_states(self, workers: list[int], read_state: StateReader) -> list[Any]:
        """The env states of the first actors, as many as hold the script's env's envs."""
        wanted = math.prod(self._batch_size or ())  # the script's envs; 1 when unbatched
        states: list[Any] = []
        for worker_id in workers:
            try:
                state = read_state(worker_id).get("env")
            except RlfleetError as exc:
                log.warning("the env state of worker_id %d could not be read: %s", worker_id, exc)
                return []
            if not state:
                return []
            states.append(state)
            if sum(pool_size(s) or wanted for s in states) >= wanted:
                break
        return states


def _trained_weights(env: Any) -> SharedPolicy | None:
    """``env``'s weights as a followed module, when the script trains some of them."""
    if not isinstance(env, torch.nn.Module) or not trains_parameters(env):
        return None
    return SharedPolicy(parameters_module(env_parameters(env)), follow=True)


def _reshape(batch: Any, size: tuple[int, ...]) -> Any:
    """``batch.reshape(*size)``, its text (``NonTensorStack``) keys included.

    tensordict's reshape leaves a ``NonTensorStack`` in its old shape when the reshape only
    drops a unit dimension (``[2, 1, T]`` to ``[2, T]``); those are rebuilt, row for row. It
    also drops the dims' names: the last (``"time"``) is named again.
    """
    shaped = batch.reshape(*size)
    if (last := batch.names[-1]) is not None:
        shaped.names = [None] * (len(size) - 1) + [last]

    def leaf(cls: type) -> bool:
        return issubclass(cls, NonTensorStack) or not issubclass(cls, TensorDictBase)

    for key, value in list(shaped.items(True, True, is_leaf=leaf)):
        if isinstance(value, NonTensorStack) and tuple(value.batch_size) != size:
            items = value.tolist()
            for _ in range(value.batch_dims - 1):
                items = [item for row in items for item in row]
            for width in reversed(size[1:]):
                items = [items[i : i + width] for i in range(0, len(items), width)]
            shaped.set(key, NonTensorStack.from_list(items))
    return shaped
