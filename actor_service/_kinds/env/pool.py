"""The env pool: N gymnasium envs stepped together, in-process or in spawned subprocesses.

:func:`make_env_pool` builds a gymnasium ``SyncVectorEnv`` (``env_backend="sync"``) or
``AsyncVectorEnv(context="spawn")`` (``"async"``; gRPC is not fork-safe), both with
``AutoresetMode.SAME_STEP``: when an episode ends, the step returns the reset
observation and puts the final one in ``info["final_obs"]``. :func:`step_pool` and
:func:`reset_pool` bound every async call by ``step_timeout`` and turn a hung or
crashed env into an :class:`~common.errors.EnvError` (naming the env's exception, or a
``TimeoutError`` for a hung env) instead of a hang; :func:`close_pool`
reaps the subprocesses even when an env hangs, and closes every env even when one's
``close()`` raises. An env's ``close()`` gets ``_REAP_TIMEOUT`` seconds and never fails
the pool: an async worker's env is then terminated with its worker, and the env gymnasium
builds in the actor's process to read the spaces is left to its ``close()`` (logged). An
async worker's exception reaches the caller as the env raised it (:class:`_AsyncPool`).
:func:`derive_seed` chains per-env seeds exactly as TorchRL does.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from actor_service._config import ActorConfig
from actor_service._core._settings import env_name
from actor_service._kinds.env.factory import one_env
from actor_service._kinds.env.spaces import check_space
from common.errors import EnvError, exception_text
from common.import_paths import load_callable
from common.plain_config import from_plain

__all__ = [
    "close_pool",
    "close_throwaway",
    "derive_seed",
    "env_fn",
    "kill_pool",
    "make_env_pool",
    "reset_pool",
    "step_pool",
]

_SEED_MODULUS = 2**32 - 1
log = logging.getLogger(__name__)


def derive_seed(seed: int) -> int:
    """The next seed of a chain, exactly as TorchRL's ``seed_generator`` derives it."""
    rng = np.random.default_rng(seed)
    return int.from_bytes(rng.bytes(8), "big") % _SEED_MODULUS


# How long a terminated env subprocess gets to exit before it is killed.
_REAP_TIMEOUT = 5.0
# How long a killed env subprocess is waited for (SIGKILL cannot be ignored).
_KILL_JOIN = 1.0

StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


def env_fn(config: ActorConfig) -> Callable[[], gymnasium.Env]:
    """What makes one env of the pool: the factory or ``gymnasium.make``, with ``env_kwargs``."""
    # A partial of the user's own callable pickles by reference, and a spawned worker
    # then imports only that callable's module and the check's (not the pool's, which
    # would pull in torch).
    if config.env_factory:
        factory = load_callable(config.env_factory)
        kwargs = from_plain(config.env_kwargs)
        return functools.partial(one_env, factory, env_name(config.env_pool), **kwargs)
    return functools.partial(gymnasium.make, config.env, **from_plain(config.env_kwargs))


def make_env_pool(config: ActorConfig) -> VectorEnv:
    """Build the env pool an actor steps.

    Args:
        config: Reads ``env``/``env_factory``, ``env_kwargs``, ``num_envs``, ``env_backend``
            and ``step_timeout``.

    Returns:
        A gymnasium vector env with ``AutoresetMode.SAME_STEP``; not reset yet.

    Raises:
        ValueError: A malformed or unimportable ``env_factory``, an unknown backend, a
            bad ``num_envs``, envs that fail to build (the cause is chained), or
            unsupported spaces (the pool is closed first).
    """
    if not isinstance(config.num_envs, int) or config.num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {config.num_envs!r}")
    if config.env_backend not in ("sync", "async"):
        raise ValueError(f"env_backend must be 'sync' or 'async', got {config.env_backend!r}")
    if not config.env_factory and not config.env:
        raise ValueError("set env (a gymnasium id) or env_factory ('package.module:function')")
    env_fns = [env_fn(config)] * config.num_envs
    try:
        if config.env_backend == "sync":
            pool: VectorEnv = SyncVectorEnv(
                env_fns, copy=False, autoreset_mode=AutoresetMode.SAME_STEP
            )
        else:
            env_fns[0] = _BuiltHereFirst(env_fns[0], env_name(config.env_pool))
            pool = _AsyncPool(
                env_fns, copy=False, context="spawn", autoreset_mode=AutoresetMode.SAME_STEP
            )
    except Exception as exc:
        raise ValueError(
            f"cannot create {config.num_envs} {env_name(config.env_pool)!r} envs "
            f"({config.env_backend}): {exc}"
        ) from exc
    try:
        check_space(pool.single_observation_space, "observation")
        check_space(pool.single_action_space, "action")
    except ValueError:
        close_pool(pool)
        raise
    return pool


class _BuiltHereFirst:
    """The first env's factory: in the actor's process, the throwaway env gymnasium reads.

    ``AsyncVectorEnv`` builds one env in the actor's process to read its spaces and
    closes it before it starts the workers: an env whose ``close()`` hung kept the pool
    from being built (the actor never served, and said nothing), and one whose ``close()``
    raised failed it. Called, this builds the env and hands gymnasium a stand-in with its
    spaces, closing the env itself within ``_REAP_TIMEOUT``; sent to a worker, it is the
    factory itself (it pickles as a copy of it, so the worker imports none of rlfleet).
    """

    def __init__(self, factory: Callable[[], gymnasium.Env], env: str) -> None:
        self.factory, self.env = factory, env

    def __call__(self) -> gymnasium.Env:
        built = self.factory()
        stand_in = _SpacesOf(built)
        close_throwaway(built, self.env)
        return stand_in

    def __reduce__(self) -> tuple[Any, ...]:
        return (copy.copy, (self.factory,))


class _SpacesOf(gymnasium.Env):
    """What gymnasium reads of its throwaway env; closing it closes nothing."""

    def __init__(self, env: gymnasium.Env) -> None:
        self.metadata = env.metadata
        self.render_mode = env.render_mode
        self.observation_space = env.observation_space
        self.action_space = env.action_space


def close_throwaway(env: gymnasium.Env, name: str) -> None:
    """Close an env built in the actor's process only to be read; never hangs nor raises.

    ``env.close()`` runs on a daemon thread for at most ``_REAP_TIMEOUT`` seconds; a close
    that raises or takes longer is logged, naming the env ``name`` and the fix, and left.
    """
    failure: list[str] = []

    def close() -> None:
        try:
            env.close()
        except Exception as exc:  # the user's env: its close, whatever it raises
            failure.append(f"{type(exc).__name__}: {exception_text(exc)}")

    closing = threading.Thread(target=close, name="rlfleet-env-close", daemon=True)
    closing.start()
    closing.join(_REAP_TIMEOUT)
    if closing.is_alive() or failure:
        what = f"raised {failure[0]}" if failure else f"took over {_REAP_TIMEOUT} s"
        log.warning(
            "env %r: close() of an env built in the actor's process only to read its spaces "
            "%s; it is left unclosed and the actor goes on (make close() return)",
            name,
            what,
        )


class _AsyncPool(AsyncVectorEnv):
    """gymnasium's ``AsyncVectorEnv``, raising the exception a worker's env raised.

    gymnasium's own ``_raise_if_errors`` passes each worker's traceback to its logger as a
    %-format string (a ``%`` in the env's message or source line raised ``TypeError``
    instead) and rebuilds the exception from its type and value (which fails for an
    exception whose constructor takes other arguments). This one logs the traceback as
    text and raises the worker's exception itself.
    """

    def _raise_if_errors(self, successes: Iterable[bool]) -> None:
        successes = list(successes)
        if all(successes):
            return
        error: BaseException | None = None
        for _ in range(len(successes) - sum(successes)):
            index, exctype, value, trace = self.error_queue.get()
            log.warning("env worker %d raised, and is shut down:\n%s", index, trace)
            self.parent_pipes[index].close()
            # None marks a closed worker's pipe, as gymnasium's own method does.
            self.parent_pipes[index] = None  # type: ignore[call-overload]
            error = value if isinstance(value, BaseException) else exctype(value)
        self._state = AsyncState.DEFAULT
        raise error if error is not None else RuntimeError("an env worker failed")

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close as gymnasium does, each worker given ``_REAP_TIMEOUT`` to close its env.

        A worker answers ``close`` before it closes its env, and gymnasium then joins it
        without a bound: an env whose ``close()`` hangs hung the pool's close. Here a
        worker still closing its env then is terminated (killed if it ignores SIGTERM).
        """
        if not terminate and self._state == AsyncState.DEFAULT:
            for pipe in self.parent_pipes:
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(OSError):  # a worker that is gone already
                        pipe.send(("close", None))
            deadline = time.monotonic() + _REAP_TIMEOUT
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        _terminate(self.processes)
        super().close_extras(timeout, terminate=True)


def step_pool(
    pool: VectorEnv, actions: np.ndarray, timeout: float, *, env: str = "env"
) -> StepResult:
    """Step every env once.

    Args:
        pool: The vector env.
        actions: One action per env.
        timeout: Seconds an async step may take.
        env: The env's name, for errors.

    Returns:
        ``(obs, reward, terminated, truncated, info)`` as gymnasium returns them.

    Raises:
        EnvError: An env raised or its subprocess died (cause chained), or an async env
            did not answer within ``timeout`` (type ``TimeoutError``).
    """
    try:
        if isinstance(pool, AsyncVectorEnv):
            pool.step_async(actions)
            return pool.step_wait(timeout=timeout)
        return pool.step(actions)
    except multiprocessing.TimeoutError:
        raise _hung(env, "step", timeout) from None
    except BaseException as exc:  # the user's env: its error, whatever it is
        raise _env_error(pool, env, exc) from exc


def _hung(env: str, call: str, timeout: float) -> EnvError:
    """A hung env's error: its failure too, a ``TimeoutError`` of the env.

    The learner counts it with the crashes and raises it after a few sessions in a row,
    where it would otherwise retry until ``batch_timeout``.
    """
    return EnvError(
        env,
        "TimeoutError",
        f"an env {call} took longer than step_timeout={timeout} s; the env pool is rebuilt "
        "before the next batch",
    )


def _env_error(pool: VectorEnv, env: str, exc: BaseException) -> EnvError:
    """``exc`` as an :class:`EnvError`; an observation that misfits its space says what fits.

    Any exception of the env's is its failure, ``KeyboardInterrupt`` and ``SystemExit`` too:
    the env runs on the collection thread, where no signal raises them, so they are the env's
    own (a ``sys.exit`` in user code), and the actor lives on.
    """
    message = exception_text(exc)
    if any(words in message for words in _MISFIT_OBSERVATION):
        space = pool.single_observation_space
        message += (
            f" (an observation does not have the shape {list(space.shape or ())} and dtype "
            f"{space.dtype} its observation_space declares: return "
            f"np.asarray(obs, dtype=np.{space.dtype}).reshape({list(space.shape or ())}))"
        )
    return EnvError(env, type(exc).__name__, message)


# numpy's words when an observation does not fit the sync pool's array of observations: of
# another shape, a scalar for a Box of shape (1,), a float for an integer Box.
_MISFIT_OBSERVATION = ("wrong shape", "wrong dimensionality", "Cannot cast array data")


def reset_pool(
    pool: VectorEnv,
    timeout: float,
    seed: list[int] | None = None,
    mask: np.ndarray | None = None,
    *,
    env: str = "env",
) -> np.ndarray:
    """Reset every env, or those in ``mask``; return the observations of all envs.

    Args:
        pool: The vector env.
        timeout: Seconds an async reset may take.
        seed: One seed per env, or None to continue each env's generator.
        mask: Bool ``[num_envs]``; None resets all.
        env: The env's name, for errors.

    Raises:
        EnvError: An env raised or its subprocess died (cause chained), or an async env
            did not answer within ``timeout`` (type ``TimeoutError``).
    """
    options = None if mask is None else {"reset_mask": mask}
    # One seed per env: gymnasium's vector envs take a list, though VectorEnv.reset is
    # annotated ``int | None``.
    seeds: Any = seed
    try:
        if isinstance(pool, AsyncVectorEnv):
            pool.reset_async(seed=seeds, options=options)
            obs, _ = pool.reset_wait(timeout=timeout)
        else:
            obs, _ = pool.reset(seed=seeds, options=options)
    except multiprocessing.TimeoutError:
        raise _hung(env, "reset", timeout) from None
    except BaseException as exc:  # the user's env: its error, whatever it is
        raise _env_error(pool, env, exc) from exc
    return obs


def close_pool(pool: VectorEnv, *, force: bool = False) -> None:
    """Close the pool and reap its subprocesses; never hangs on a hung env.

    Args:
        pool: The vector env (closing twice is a no-op).
        force: Terminate async workers instead of asking them to close (after a
            timeout or a crash, a worker may never answer).
    """
    if pool.closed:
        return
    if not isinstance(pool, AsyncVectorEnv):
        _close_each(pool)
        return
    if not force and not all(p.is_alive() for p in pool.processes):
        force = True
    if force:
        _terminate(pool.processes)
    try:
        pool.close(terminate=force)
    except Exception:  # a broken worker pipe must not keep the others alive
        _terminate(pool.processes)
        pool.closed = True


def _close_each(pool: VectorEnv) -> None:
    """Close every env of an in-process pool: one whose ``close()`` raises leaves none open.

    The pool is closed all the same, so a rebuild after a crash (and the actor's own close)
    goes on: a user's ``close()`` that raises would otherwise fail every later batch.
    """
    try:
        pool.close()
    except Exception:  # the user's env: its close, whatever it raises; then every other's
        for env in getattr(pool, "envs", ()):
            with contextlib.suppress(Exception):
                env.close()
        pool.closed = True


def kill_pool(pool: VectorEnv | None) -> int:
    """SIGKILL the pool's live subprocesses and reap them; safe from any thread.

    For a shutdown whose collection thread is stuck in a hung env step: it
    takes no lock and sends nothing to the workers. The pool is not usable
    afterwards. Reaping takes at most ``_KILL_JOIN`` seconds per process.

    Returns:
        How many subprocesses were alive.
    """
    if not isinstance(pool, AsyncVectorEnv):
        return 0
    alive = [p for p in pool.processes if p.is_alive()]
    for process in alive:
        process.kill()
    for process in alive:
        process.join(_KILL_JOIN)
    return len(alive)


def _terminate(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(_REAP_TIMEOUT)
        if process.is_alive():
            process.kill()
            process.join(_REAP_TIMEOUT)
