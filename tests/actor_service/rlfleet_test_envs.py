"""Env factories for the collection-core tests, importable by spawned env workers.

Tests put this directory on ``sys.path`` and name the factories as
``"rlfleet_test_envs:<function>"``; spawned subprocesses inherit that path. No torch
import here, so env subprocesses start fast.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import gymnasium
import numpy as np


class _HangAfter(gymnasium.Wrapper):
    """Steps normally ``steps`` times, then sleeps forever inside ``step``."""

    def __init__(self, env: gymnasium.Env, steps: int) -> None:
        super().__init__(env)
        self._left = steps

    def step(self, action: Any) -> Any:
        if self._left <= 0:
            while True:
                time.sleep(3600)
        self._left -= 1
        return self.env.step(action)


def hanging_cartpole(steps: int = 0) -> gymnasium.Env:
    """CartPole whose ``step`` hangs forever after ``steps`` steps."""
    return _HangAfter(gymnasium.make("CartPole-v1"), steps)


class _HangOnReset(gymnasium.Wrapper):
    """Sleeps forever inside ``reset``."""

    def reset(self, **kwargs: Any) -> Any:
        while True:
            time.sleep(3600)


def reset_hanging_cartpole() -> gymnasium.Env:
    """CartPole whose ``reset`` hangs forever."""
    return _HangOnReset(gymnasium.make("CartPole-v1"))


def sigterm_deaf_hanging_cartpole(steps: int = 0) -> gymnasium.Env:
    """``hanging_cartpole`` whose env subprocess ignores SIGTERM (the test process does not)."""
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return hanging_cartpole(steps)


class _CrashAfter(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, steps: int, message: str = "simulator crashed") -> None:
        super().__init__(env)
        self._left, self._message = steps, message

    def step(self, action: Any) -> Any:
        if self._left <= 0:
            raise RuntimeError(self._message)
        self._left -= 1
        return self.env.step(action)


def crashing_cartpole(steps: int = 0, message: str = "simulator crashed") -> gymnasium.Env:
    """CartPole whose ``step`` raises ``RuntimeError(message)`` after ``steps`` steps."""
    return _CrashAfter(gymnasium.make("CartPole-v1"), steps, message)


class _UserBaseError(BaseException):
    """A user's exception outside ``Exception`` (a framework's abort signal)."""


class _UnprintableError(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no text")


def _odd_exception(kind: str) -> BaseException:
    """An exception a user's env may raise that is awkward to report."""
    odd: dict[str, BaseException] = {
        "surrogates": RuntimeError("path b'\\xff' decoded: \udcff"),  # surrogateescape's
        "huge": RuntimeError("x" * 3_000_000),  # over the learner's 4 MiB message cap
        "unprintable": _UnprintableError(),
        "base_exception": _UserBaseError("abort"),
        "system_exit": SystemExit(3),
        "keyboard_interrupt": KeyboardInterrupt(),
    }
    return odd[kind]


class _OddCrash(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, kind: str, call: str) -> None:
        super().__init__(env)
        self._kind, self._call = kind, call

    def reset(self, **kwargs: Any) -> Any:
        if self._call == "reset":
            raise _odd_exception(self._kind)
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        raise _odd_exception(self._kind)


def oddly_crashing_cartpole(kind: str, call: str = "step") -> gymnasium.Env:
    """CartPole whose ``step`` (or, ``call="reset"``, ``reset`` too) raises an awkward
    exception (``_odd_exception``'s kinds)."""
    return _OddCrash(gymnasium.make("CartPole-v1"), kind, call)


class _CloseMarker(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, marker: str) -> None:
        super().__init__(env)
        self._marker = marker

    def close(self) -> None:
        with open(self._marker, "a") as out:
            out.write("closed\n")
        super().close()


def close_marking_cartpole(marker: str) -> gymnasium.Env:
    """CartPole whose ``close`` appends a line to the file ``marker``."""
    return _CloseMarker(gymnasium.make("CartPole-v1"), marker)


def crashing_pendulum(steps: int = 0) -> gymnasium.Env:
    """Pendulum whose ``step`` raises after ``steps`` steps."""
    return _CrashAfter(gymnasium.make("Pendulum-v1"), steps)


def vector_cartpole(num_envs: int = 2) -> Any:
    """CartPole already vectorized: a factory that returns a pool, not one env."""
    return gymnasium.make_vec("CartPole-v1", num_envs=num_envs)


def text_env(role: str = "observation") -> gymnasium.Env:
    """An env with a Text observation (or, ``role="action"``, action) space, which actors
    do not support."""
    text, discrete = gymnasium.spaces.Text(8), gymnasium.spaces.Discrete(2)

    class _TextEnv(gymnasium.Env):
        observation_space = text if role == "observation" else discrete
        action_space = text if role == "action" else discrete

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return "a", {}

        def step(self, action: Any) -> Any:
            return "a", 0.0, False, False, {}

    return _TextEnv()


def dict_env(keys: int = 500) -> gymnasium.Env:
    """An env with a Dict observation space of ``keys`` Boxes, which actors do not support."""

    class _DictEnv(gymnasium.Env):
        observation_space = gymnasium.spaces.Dict(
            {f"k{i}": gymnasium.spaces.Box(-1, 1, (2,), np.float32) for i in range(keys)}
        )
        action_space = gymnasium.spaces.Discrete(2)

    return _DictEnv()


class _ScalarEnv(gymnasium.Env):
    """Scalar ``Box(())`` observations and actions (a walk the action steps), 7-step episodes."""

    observation_space = gymnasium.spaces.Box(-10.0, 10.0, shape=(), dtype=np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t, self._x = 0, np.float32(self.np_random.uniform(-1, 1))
        return np.array(self._x, dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        self._t += 1  # TorchRL's GymEnv steps it with shape (1,), an actor with ()
        self._x = np.float32(self._x + float(np.asarray(action).reshape(())) * 0.1)
        return np.array(self._x, dtype=np.float32), 1.0, self._t >= 7, False, {}


def scalar_env() -> gymnasium.Env:
    """An env whose observation and action spaces are scalar ``Box``es (shape ``()``)."""
    return _ScalarEnv()


gymnasium.register("RlfleetScalar-v0", entry_point="rlfleet_test_envs:scalar_env")


class _PlainNumberEnv(gymnasium.Env):
    """Observations as a python ``float``, whatever the ``Box`` it declares; 3-step episodes."""

    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 10, shape=shape, dtype=dtype)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return float(self._t), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        return float(self._t), 1.0, False, self._t >= 3, {}


def plain_number_env(shape: tuple[int, ...] = (1,), dtype: str = "float32") -> gymnasium.Env:
    """An env declaring ``Box(shape, dtype)`` observations that returns python floats."""
    return _PlainNumberEnv(tuple(shape), dtype)


_CRASHED = {"done": False}


def crash_once_cartpole(steps: int = 0) -> gymnasium.Env:
    """CartPole that raises once, process-wide, after ``steps`` steps (sync backend only)."""
    env = gymnasium.make("CartPole-v1")
    if _CRASHED["done"]:
        return env
    _CRASHED["done"] = True
    return _CrashAfter(env, steps)


class _CloseRaises(_CrashAfter):
    def close(self) -> None:
        super().close()
        raise RuntimeError("the simulator would not close")


def close_raising_crashing_cartpole(steps: int = 0) -> gymnasium.Env:
    """:func:`crashing_cartpole` whose ``close`` raises (after closing)."""
    return _CloseRaises(gymnasium.make("CartPole-v1"), steps)


class _CloseHangs(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, where: str, seconds: float) -> None:
        super().__init__(env)
        self._where, self._seconds = where, seconds

    def close(self) -> None:
        here = "worker" if multiprocessing.parent_process() is not None else "actor"
        if self._where in (here, "both"):
            time.sleep(self._seconds)
        super().close()


def close_hanging_cartpole(where: str = "both", seconds: float = 3600.0) -> gymnasium.Env:
    """CartPole whose ``close`` sleeps ``seconds`` first: in an env worker (``"worker"``), in
    the process that built the pool (``"actor"``), or in both."""
    return _CloseHangs(gymnasium.make("CartPole-v1"), where, seconds)


_UNBUILDABLE = {"crashed": False}


class _CrashForGood(_CrashAfter):
    def step(self, action: Any) -> Any:
        _UNBUILDABLE["crashed"] = self._left <= 0
        return super().step(action)


def unbuildable_after_crash_cartpole(steps: int = 0) -> gymnasium.Env:
    """CartPole whose ``step`` raises after ``steps`` steps; no env can be built after that,
    process-wide (sync only)."""
    if _UNBUILDABLE["crashed"]:
        raise OSError("the simulator's licence server is unreachable")
    return _CrashForGood(gymnasium.make("CartPole-v1"), steps)


class _MultiEnv(gymnasium.Env):
    """MultiBinary observations, MultiDiscrete actions (checked on every step), 5-step episodes."""

    observation_space = gymnasium.spaces.MultiBinary(3)
    action_space = gymnasium.spaces.MultiDiscrete([3, 2], start=[1, 0])

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> Any:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        self._t += 1
        return self.observation_space.sample(), float(action.sum()), self._t >= 5, False, {}


def multi_env() -> gymnasium.Env:
    """An env with MultiBinary observations and MultiDiscrete actions."""
    return _MultiEnv()


class _Slow(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, delay: float) -> None:
        super().__init__(env)
        self._delay = delay

    def step(self, action: Any) -> Any:
        time.sleep(self._delay)
        return self.env.step(action)


def chatty_cartpole() -> gymnasium.Env:
    """CartPole whose factory writes progress to stdout without ending its line."""
    print("building CartPole...", end="", flush=True)
    return gymnasium.make("CartPole-v1")


def slow_cartpole(delay: float = 0.2) -> gymnasium.Env:
    """CartPole whose every ``step`` takes ``delay`` seconds more."""
    return _Slow(gymnasium.make("CartPole-v1"), delay)


_START_ORDER: list[int] = []  # this process's place among the actors counted in a file


def staggered_cartpole(counter: str, step: float, hang_from: int = 2**31) -> gymnasium.Env:
    """CartPole built ``step`` seconds later per actor process started before this one.

    The processes sharing ``counter`` (a file) take places 0, 1, 2... in the order they
    first build an env; the process at place ``k`` sleeps ``k * step`` that first time,
    forever from place ``hang_from`` on.
    """
    if not _START_ORDER:
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")  # atomic: the offset after it is this write's end
            place = os.lseek(fd, 0, os.SEEK_CUR) - 1
        finally:
            os.close(fd)
        _START_ORDER.append(place)
        while place >= hang_from:
            time.sleep(3600)
        time.sleep(place * step)
    return gymnasium.make("CartPole-v1")


class _NaNAfter(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, every: int) -> None:
        super().__init__(env)
        self._every, self._count = every, 0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._count += 1
        if self._count % self._every == 0:
            obs = obs * float("nan")
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def nan_cartpole(every: int = 7) -> gymnasium.Env:
    """CartPole whose every ``every``-th step returns a NaN observation and reward."""
    return _NaNAfter(gymnasium.make("CartPole-v1"), every)


class _Lives(gymnasium.Wrapper):
    """An env with Atari-style lives: one is lost every ``every`` steps (``lives()``)."""

    def __init__(self, env: gymnasium.Env, lives: int = 3, every: int = 5) -> None:
        super().__init__(env)
        self._lives, self._every, self._steps = lives, every, 0

    def reset(self, **kwargs: Any) -> Any:
        self._steps = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self._steps += 1
        return super().step(action)

    def lives(self) -> int:
        """Lives left, as ALE's ``ale.lives()``."""
        return max(self._lives - self._steps // self._every, 0)


def cartpole_with_lives(lives: int = 3, every: int = 5) -> gymnasium.Env:
    """CartPole-v1 with ``lives()``, what TorchRL's ``EndOfLifeTransform`` reads."""
    return _Lives(gymnasium.make("CartPole-v1"), lives, every)


class _WrongShape(gymnasium.Wrapper):
    """CartPole whose observations after ``steps`` steps hold one number too many."""

    def __init__(self, env: gymnasium.Env, steps: int) -> None:
        super().__init__(env)
        self._left = steps

    def step(self, action: Any) -> Any:
        obs, *rest = self.env.step(action)
        self._left -= 1
        return (obs if self._left >= 0 else np.append(obs, np.float32(0))), *rest


def wrong_shape_cartpole(steps: int = 0) -> gymnasium.Env:
    """CartPole whose steps return a ``(5,)`` observation after ``steps`` good ones."""
    return _WrongShape(gymnasium.make("CartPole-v1"), steps)


class _OffsetDiscreteEnv(gymnasium.Env):
    """``Discrete(4, start=10)`` observations (a walk the action steps), 5-step episodes."""

    observation_space = gymnasium.spaces.Discrete(4, start=10)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t, self._x = 0, 10
        return self._x, {}

    def step(self, action: Any) -> Any:
        self._t += 1
        self._x = min(13, self._x + int(action))
        return self._x, 1.0, self._t >= 5, False, {}


def offset_discrete_env() -> gymnasium.Env:
    """An env whose Discrete observation space starts at 10, not 0."""
    return _OffsetDiscreteEnv()
