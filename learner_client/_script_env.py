"""``create_env_fn`` on a fleet: checked against the first batch; the script's env, followed.

TorchRL's ``Collector(create_env_fn=env, ...)`` steps the script's own env object, so a
script may read that env's state afterwards: ``ppo_mujoco.py`` saves its ``VecNorm``
statistics with every checkpoint (``get_vecnorm_state(train_env)``). On a fleet the actors
step their own copies and the script's env is never stepped, so :class:`ScriptEnv` loads
an actor's env state (GetState's ``env``: the transforms' ``state_dict``) into the
script's env after each batch, when that env has state to follow (an empty
``state_dict()``: nothing is fetched). The actor is the first worker of the fleet; an
actor's pool of one env hands over that env's state (``worker0``). A state that does not
fit the script's env (another env, another pool layout) is logged once and no longer
followed; an actor that cannot be reached leaves the env as it was until the next batch.

A batch also takes the layout of the script's env where the fleet can give it: TorchRL's
``Collector`` gives ``env.batch_size + [T]`` (``[T]`` for one unbatched env), a fleet
``[actors, envs, T]`` (each actor's part ``[envs, T]``), so :meth:`ScriptEnv.shaped` gives
a batch the script env's ``batch_size`` where the fleet steps as many envs: one actor with
one env gives a single-env script TorchRL's ``[T]``, two actors sharing a ``ParallelEnv``'s
four envs give its ``[4, T]``, in the batches and in the replay buffer alike.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from tensordict import NonTensorStack, TensorDictBase

from common.errors import RlfleetError
from learner_client._torchrl_args import check_env_signature, env_signature

__all__ = ["ScriptEnv"]

log = logging.getLogger("learner_client")

#: What reads one actor's decoded state (``GrpcCollector.actor_state``).
StateReader = Callable[[int], Mapping[str, Any]]


class ScriptEnv:
    """The env of ``create_env_fn``: its signature, and the script's env if it is one.

    Args:
        create_env_fn: TorchRL's argument: an env constructor, or a TorchRL env itself.
        create_env_kwargs: Keyword arguments of the constructor.
    """

    def __init__(
        self, create_env_fn: Callable[..., Any], create_env_kwargs: Mapping[str, Any] | None
    ) -> None:
        signature = env_signature(create_env_fn, create_env_kwargs)
        self._signature: dict[Any, Any] | None = signature.keys
        self._batch_size = signature.batch_size
        own = callable(getattr(create_env_fn, "fake_tensordict", None))
        self._env = create_env_fn if own and _has_state(create_env_fn) else None

    @property
    def followed(self) -> bool:
        """Whether the script's env follows an actor's env state after each batch."""
        return self._env is not None

    def shaped(self, batch: Any) -> Any:
        """``batch`` (``[actors, envs, T]`` or ``[envs, T]``) as ``env.batch_size + [T]``.

        Only where the envs are as many as the script's env steps; otherwise unchanged.
        """
        size = self._batch_size
        lead = tuple(batch.batch_size[:-1])
        if size is None or lead == size or math.prod(lead) != math.prod(size):
            return batch
        if not size:
            return batch[(0,) * len(lead)]
        return _reshape(batch, (*size, batch.batch_size[-1]))

    def after_batch(self, batch: Any, workers: list[int], read_state: StateReader) -> None:
        """Check the first batch; load an actor's env state into the script's env.

        Raises:
            ValueError: The first batch lacks a key of the env, or has it in another
                shape or dtype (:func:`check_env_signature`).
        """
        if self._signature is not None:
            check_env_signature(self._signature, batch, f"actors {workers}")
            self._signature = None
        if self._env is not None and workers:
            self._follow(workers[0], read_state)

    def _follow(self, worker_id: int, read_state: StateReader) -> None:
        try:
            state = read_state(worker_id).get("env")
        except RlfleetError as exc:
            log.warning("the env state of worker_id %d could not be read: %s", worker_id, exc)
            return
        if not state:
            return
        state = _one_env(state, self._env)
        try:
            self._env.load_state_dict(state)  # type: ignore[union-attr]
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            log.warning(
                "create_env_fn's env no longer follows worker_id %d's env state, which "
                "does not fit it: %s",
                worker_id,
                str(exc).splitlines()[0],
            )
            self._env = None


def _has_state(env: Any) -> bool:
    try:
        return bool(env.state_dict())
    except (RuntimeError, AttributeError, TypeError):
        return False


def _one_env(state: Mapping[str, Any], env: Any) -> Mapping[str, Any]:
    """An actor pool's state as one env's: ``worker0``'s, when the script's env is unbatched."""
    batched = tuple(getattr(env, "batch_size", ())) != ()
    inner = state.get("worker0")
    if not batched and isinstance(inner, Mapping) and all(k.startswith("worker") for k in state):
        return inner
    return state


def _reshape(batch: Any, size: tuple[int, ...]) -> Any:
    """``batch.reshape(*size)``, its text (``NonTensorStack``) keys included.

    tensordict's reshape leaves a ``NonTensorStack`` in its old shape when the reshape only
    drops a unit dimension (``[2, 1, T]`` to ``[2, T]``); those are rebuilt, row for row.
    """
    shaped = batch.reshape(*size)

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
