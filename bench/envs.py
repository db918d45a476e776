"""Synthetic gymnasium envs for the benchmarks, importable by actors (``--env-factory``).

:func:`make_pixel_env` builds an env whose observations are Atari-sized
``uint8`` frame stacks ``(4, 84, 84)`` and whose dynamics cost next to
nothing, so a collector's frames/s on it measures how fast it moves bytes. An
actor runs it with ``--env-factory bench.envs:make_pixel_env``. The module
imports only gymnasium and numpy.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

__all__ = ["PIXEL_SHAPE", "PixelEnv", "make_cartpole", "make_fresh_pixel_env", "make_pixel_env"]

PIXEL_SHAPE = (4, 84, 84)


class PixelEnv(gymnasium.Env):
    """Random-looking ``uint8`` frames, two actions, reward 1, truncated after ``episode_length``.

    The frames are slices of one noise buffer drawn at reset (so they do not
    compress to nothing and differ from step to step) and each step returns a
    fresh copy, as a real emulator does.

    Args:
        episode_length: Steps after which an episode is truncated.
        fresh: Every frame is new pseudo-random data (SFC64 output) instead of a
            window over one buffer, so consecutive frames share no bytes at all.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(self, episode_length: int = 200, fresh: bool = False) -> None:
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}")
        self.observation_space = gymnasium.spaces.Box(0, 255, PIXEL_SHAPE, dtype=np.uint8)
        self.action_space = gymnasium.spaces.Discrete(2)
        self._episode_length = episode_length
        self._noise = np.zeros(0, dtype=np.uint8)
        self._size = int(np.prod(PIXEL_SHAPE))
        self._t = 0
        self._fresh: np.random.SFC64 | None = None
        if fresh:
            self._fresh = np.random.SFC64()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; draws a new noise buffer from the env's RNG."""
        super().reset(seed=seed)
        if self._fresh is not None:
            self._fresh = np.random.SFC64(self.np_random.integers(2**63))
        self._noise = self.np_random.integers(0, 256, self._size * 2, dtype=np.uint8)
        self._t = 0
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance one step; the action does not matter."""
        self._t += 1
        return self._frame(), 1.0, False, self._t >= self._episode_length, {}

    def _frame(self) -> np.ndarray:
        if self._fresh is not None:
            return self._fresh.random_raw(self._size // 8).view(np.uint8).reshape(PIXEL_SHAPE)
        # A sliding window over the noise: a new frame each step for the cost of one copy.
        offset = (self._t * 4099) % self._size
        return self._noise[offset : offset + self._size].reshape(PIXEL_SHAPE).copy()


def make_cartpole(**kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make("CartPole-v1", **kwargs)``, as a factory named by its import path."""
    return gymnasium.make("CartPole-v1", **kwargs)


def make_pixel_env(**kwargs: Any) -> gymnasium.Env:
    """Build a :class:`PixelEnv` (the ``--env-factory`` entry point)."""
    return PixelEnv(**kwargs)


def make_fresh_pixel_env(**kwargs: Any) -> gymnasium.Env:
    """Build a :class:`PixelEnv` whose every frame is fresh random data."""
    return PixelEnv(fresh=True, **kwargs)
