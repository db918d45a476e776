"""A small deterministic pixel env and the policies the TorchRL-env actor tests run on it.

The actors import them as ``rlfleet_test_pixels:<name>`` (this directory is on their
path). :class:`PixelEnv` draws ``uint8`` RGB frames from its own seeded generator, so
an actor and a TorchRL collector seeded alike see the same frames without any
renderer. :func:`atari_like` wraps it in the transforms TorchRL's Atari scripts use:
``ToTensorImage``, ``GrayScale``, ``Resize`` (which needs torchvision: left out
without it, see :data:`HAS_RESIZE`) and ``CatFrames``.
"""

from __future__ import annotations

import importlib.util

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, Composite, OneHot, Unbounded
from torchrl.envs import (
    CatFrames,
    Compose,
    EnvBase,
    GrayScale,
    Resize,
    RewardSum,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
)
from torchrl.modules import OneHotCategorical, ProbabilisticActor

#: Whether TorchRL's ``Resize`` can run here (it calls torchvision).
HAS_RESIZE = importlib.util.find_spec("torchvision") is not None

SIZE, ACTIONS, STACK = 12, 3, 4


class PixelEnv(EnvBase):
    """``SIZE`` by ``SIZE`` RGB frames (``uint8``, ``[H, W, 3]``); episodes of 4 to 9 steps.

    Each step shifts the frame by the action and draws new pixels in one column; the
    reward is the mean of the red channel. All draws come from the env's own
    generator, seeded by ``set_seed``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(
            pixels=Bounded(0, 255, shape=(SIZE, SIZE, 3), dtype=torch.uint8)
        )
        self.action_spec = OneHot(ACTIONS, dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(1,))
        self._rng = torch.Generator().manual_seed(0)
        self._frame = torch.zeros(SIZE, SIZE, 3, dtype=torch.uint8)
        self._count, self._horizon = 0, 4

    def _draw(self, *shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=self._rng, dtype=torch.uint8)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: object) -> TensorDictBase:
        self._frame = self._draw(SIZE, SIZE, 3)
        self._count = 0
        self._horizon = int(torch.randint(4, 10, (), generator=self._rng))
        done = torch.zeros(1, dtype=torch.bool)
        return TensorDict(pixels=self._frame.clone(), done=done, terminated=done.clone())

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        shift = int(tensordict.get("action").argmax(-1))
        self._frame = self._frame.roll(shift + 1, dims=1)
        self._frame[:, 0] = self._draw(SIZE, 3)
        self._count += 1
        done = torch.tensor([self._count >= self._horizon])
        reward = self._frame[..., 0].float().mean().reshape(1) / 255
        return TensorDict(
            pixels=self._frame.clone(), reward=reward, done=done, terminated=done.clone()
        )

    def _set_seed(self, seed: int | None) -> None:
        self._rng.manual_seed(0 if seed is None else seed)


def pixels() -> EnvBase:
    """The raw pixel env: ``uint8`` frames, no transforms."""
    return PixelEnv()


def atari_like(resize: bool = HAS_RESIZE) -> EnvBase:
    """:class:`PixelEnv` as TorchRL's Atari scripts transform it: float, gray, resized, stacked.

    ``pixels`` becomes ``[STACK, 8, 8]`` with ``Resize`` (``[STACK, SIZE, SIZE]`` without),
    plus ``episode_reward`` and ``step_count``.
    """
    transforms = [ToTensorImage(), GrayScale()]
    if resize:
        transforms.append(Resize(8, 8))
    transforms += [CatFrames(N=STACK, dim=-3), RewardSum(), StepCounter()]
    return TransformedEnv(PixelEnv(), Compose(*transforms))


def _conv_net(env: EnvBase, seed: int) -> nn.Module:
    channels, height, width = env.observation_spec["pixels"].shape[-3:]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        conv = nn.Conv2d(channels, 4, 3)
        return nn.Sequential(
            conv, nn.Flatten(-3), nn.Linear(4 * (height - 2) * (width - 2), ACTIONS)
        )


def _one_hot(logits: torch.Tensor) -> torch.Tensor:
    return nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])


def pixel_policy(env: EnvBase, seed: int = 0) -> TensorDictSequential:
    """A greedy conv policy: stacked gray ``pixels`` → ``logits`` → one-hot ``action``."""
    net = TensorDictModule(_conv_net(env, seed), in_keys=["pixels"], out_keys=["logits"])
    greedy = TensorDictModule(_one_hot, in_keys=["logits"], out_keys=["action"])
    return TensorDictSequential(net, greedy)


def pixel_sampling_policy(env: EnvBase, seed: int = 0) -> ProbabilisticActor:
    """A ``ProbabilisticActor`` on the conv net: a sampled one-hot action and its log-prob."""
    net = TensorDictModule(_conv_net(env, seed), in_keys=["pixels"], out_keys=["logits"])
    return ProbabilisticActor(
        net,
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )


class _RawConv(nn.Module):
    """The conv net on raw ``uint8`` ``[H, W, 3]`` frames (scaled and channels first)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.conv = nn.Conv2d(3, 4, 3)
            self.head = nn.Linear(4 * (SIZE - 2) ** 2, ACTIONS)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = frames.to(torch.float32).movedim(-1, -3) / 255
        logits = self.head(self.conv(x).flatten(-3))
        return logits, _one_hot(logits)


def raw_pixel_policy(env: EnvBase, seed: int = 0) -> TensorDictModule:
    """A greedy conv policy on :func:`pixels`' raw ``uint8`` frames."""
    return TensorDictModule(_RawConv(seed), in_keys=["pixels"], out_keys=["logits", "action"])
