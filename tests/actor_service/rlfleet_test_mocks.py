"""TorchRL's mock envs and policies of its collector tests, as actor factories.

The actors import them as ``rlfleet_test_mocks:<name>`` (this directory is on their
path); ``test_torchrl_collector_port.py`` runs TorchRL's own collector tests
(``test/test_collector.py``) on actors with them. ``batch`` > 0 builds the env batched
itself (``batch_size=(batch,)``), which the actor then takes as its pool.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase, SerialEnv, StepCounter, TransformedEnv
from torchrl.testing.mocking_classes import (
    CountingBatchedEnv,
    CountingEnv,
    MultiKeyCountingEnv,
    MultiKeyCountingEnvPolicy,
    NestedCountingEnv,
)


def _batch(batch: int) -> tuple[int, ...]:
    return (batch,) if batch else ()


def nested(
    nest_reward: bool = True,
    nest_done: bool = True,
    nest_obs_action: bool = True,
    nested_dim: int = 3,
    batch: int = 0,
) -> EnvBase:
    """``NestedCountingEnv`` with its keys under ``"data"`` or not, one row per agent."""
    return NestedCountingEnv(
        nest_reward=nest_reward,
        nest_done=nest_done,
        nest_obs_action=nest_obs_action,
        nested_dim=nested_dim,
        batch_size=_batch(batch),
    )


def nested_2d() -> EnvBase:
    """``NestedCountingEnv`` batched over two dims (``[5, 2]``): not a pool of one dim."""
    return NestedCountingEnv(batch_size=(5, 2), nested_dim=5)


class CountPolicy(TensorDictModuleBase):
    """TorchRL's ``CountingEnvCountPolicy`` (the action ``1``) for any batch of the env.

    TorchRL's returns the spec's own shape, so it fits only the env it was built on; an
    actor's policy acts on the pool (``num_envs`` of those envs).
    """

    def __init__(self, env: EnvBase) -> None:
        super().__init__()
        self.action_key = env.action_key
        spec = env.full_action_spec[env.action_key]
        self.shape, self.dtype = spec.shape[env.batch_dims :], spec.dtype  # one env's action
        self.in_keys: list[str] = []
        self.out_keys = [self.action_key]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        ones = torch.ones((*tensordict.batch_size, *self.shape), dtype=self.dtype)
        return tensordict.set(self.action_key, ones)


def count_policy(env: EnvBase) -> TensorDictModuleBase:
    """:class:`CountPolicy`: always the action ``1`` on the env's action key."""
    return CountPolicy(env)


def multi_key(max_steps: int = 3, batch: int = 0) -> EnvBase:
    """``MultiKeyCountingEnv``: nested action keys, one done key per group."""
    return MultiKeyCountingEnv(max_steps=max_steps, batch_size=_batch(batch))


def multi_key_policy(
    env: EnvBase, deterministic: bool = False, envs: int = 0
) -> TensorDictModuleBase:
    """TorchRL's ``MultiKeyCountingEnvPolicy`` (counts, at random unless ``deterministic``).

    It acts on its spec's batch: ``envs`` > 0 expands the one env's spec to a pool of them.
    """
    spec = env.input_spec["full_action_spec"]
    if envs:
        spec = spec.expand(envs, *spec.shape)
    return MultiKeyCountingEnvPolicy(spec, deterministic=deterministic)


def _counting_limited(steps: int) -> EnvBase:
    return TransformedEnv(CountingEnv(), StepCounter(steps))


def mixed_limits() -> EnvBase:
    """Two ``CountingEnv`` s truncated after 2 and after 3 steps, in one ``SerialEnv``."""
    makers = [lambda: _counting_limited(2), lambda: _counting_limited(3)]
    return SerialEnv(2, makers, share_individual_td=True)


def counting_batched() -> EnvBase:
    """``CountingBatchedEnv`` counting from 10: its observations are never all zeros."""
    return CountingBatchedEnv(start_val=torch.tensor(10), max_steps=torch.tensor(100_000))


class NoZerosPolicy(TensorDictModuleBase):
    """A policy that raises on an all-zero observation (a step no env produced)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_keys = ["observation"]
        self.out_keys = ["action"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        observation = tensordict.get("observation")
        if not observation.any():
            raise AssertionError("the policy was called on zeros, not on an env's step")
        return tensordict.set("action", observation.clone())


def no_zeros_policy(env: EnvBase) -> TensorDictModuleBase:
    """:class:`NoZerosPolicy`."""
    return NoZerosPolicy()
