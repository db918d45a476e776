"""TorchRL's mock envs and policies of its collector tests, as actor factories.

The actors import them as ``rlfleet_test_mocks:<name>`` (this directory is on their
path); ``test_torchrl_collector_port.py`` and ``test_torchrl_collector_port_more.py`` run
TorchRL's own collector tests (``test/test_collectors.py``) on actors with them. ``batch``
> 0 builds the env batched itself (``batch_size=(batch,)``), which the actor then takes as
its pool.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import Composite, NonTensor, Unbounded
from torchrl.envs import (
    EnvBase,
    GymEnv,
    InitTracker,
    SerialEnv,
    StepCounter,
    Transform,
    TransformedEnv,
)
from torchrl.modules import OrnsteinUhlenbeckProcessModule, SafeModule
from torchrl.testing import LSTMNet
from torchrl.testing.mocking_classes import (
    ContinuousActionVecMockEnv,
    CountingBatchedEnv,
    CountingEnv,
    DiscreteActionVecMockEnv,
    DiscreteActionVecPolicy,
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


def counting_step_counter(steps: int = 2) -> EnvBase:
    """``CountingEnv`` with a ``StepCounter`` of its own (``test_maxframes_error``'s env)."""
    return _counting_limited(steps)


def nested_truncated() -> EnvBase:
    """``NestedCountingEnv`` with ``is_init`` and nested truncated keys (``test_set_truncated``)."""
    return TransformedEnv(NestedCountingEnv(), InitTracker()).add_truncated_keys()


def discrete_vec() -> EnvBase:
    """TorchRL's ``DiscreteActionVecMockEnv``, seeded 0 (its reset draws from its own generator)."""
    env = DiscreteActionVecMockEnv()
    env.set_seed(0)
    return env


def counting_batched_initial(start_val: int = 4) -> EnvBase:
    """``test_initial_obs_consistency``'s ``CountingBatchedEnv``: horizons 17 and 18 from 4."""
    return CountingBatchedEnv(
        batch_size=[2], max_steps=torch.arange(2) + 17, start_val=torch.ones([2]) * start_val
    )


class UnbatchedDoneEnv(EnvBase):
    """TorchRL's ``UnbatchedDoneEnv`` (``test_unbatched_env_traj_ids_shape_consistency``)."""

    def __init__(self, done_after_n_steps: int = 6) -> None:
        super().__init__(batch_size=torch.Size([]))
        self.done_after_n_steps = done_after_n_steps
        self._step_count = 0
        self.observation_spec = Composite(observation=Unbounded(shape=(3,)))
        self.action_spec = Composite(action=Unbounded(shape=(1,)))
        self.reward_spec = Composite(reward=Unbounded(shape=(1,)))
        flag = Unbounded(shape=(1,), dtype=torch.bool)
        self.full_done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone())

    def _flags(self, done: bool) -> dict[str, torch.Tensor]:
        return {
            "done": torch.tensor([done]),
            "terminated": torch.tensor([done]),
            "truncated": torch.tensor([False]),
        }

    def _reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        self._step_count = 0
        return TensorDict({"observation": torch.rand(3), **self._flags(False)}, [])

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._step_count += 1
        done = self._step_count >= self.done_after_n_steps
        values = {"observation": torch.rand(3), "reward": torch.tensor([1.0])}
        return TensorDict({**values, **self._flags(done)}, [])

    def _set_seed(self, seed: int | None) -> None:
        torch.manual_seed(seed)


def unbatched_done(done_after_n_steps: int = 6) -> EnvBase:
    """:class:`UnbatchedDoneEnv`: one env of no batch dims, done after ``done_after_n_steps``."""
    return UnbatchedDoneEnv(done_after_n_steps)


class _AddNonTensorData(Transform):
    """TorchRL's ``AddNontTensorData`` (``TestCollectorsNonTensor``): a string per step."""

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        step = next_tensordict.get("step_count").item()
        next_tensordict["nt"] = f"a string! - {step}"
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return tensordict_reset.set("nt", NonTensorData("reset!"))

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        observation_spec["nt"] = NonTensor(shape=())
        return observation_spec


def nontensor_cartpole() -> EnvBase:
    """CartPole-v1 with a ``StepCounter`` and a string ``nt`` naming each step (or ``reset!``)."""
    env = GymEnv("CartPole-v1").append_transform(StepCounter())
    return env.append_transform(_AddNonTensorData())


def vec_policy(env: EnvBase) -> TensorDictModuleBase:
    """TorchRL's ``DiscreteActionVecPolicy`` (deterministic, ``test_traj_len_consistency``)."""
    return DiscreteActionVecPolicy()


def counting_ladder(envs: int = 4) -> EnvBase:
    """``envs`` ``CountingEnv`` s done after 10, 11, ... steps, in one ``SerialEnv``."""
    makers = [functools.partial(CountingEnv, 10 + i) for i in range(envs)]
    return SerialEnv(envs, makers)


def _ones_action(tensordict: TensorDictBase) -> torch.Tensor:
    return torch.ones((*tensordict.shape, 1))


def _policy_inplace(tensordict: TensorDictBase) -> TensorDictBase:
    tensordict.set("action", _ones_action(tensordict))
    return tensordict


def _policy_outplace(tensordict: TensorDictBase) -> TensorDictBase:
    return tensordict.empty().set("action", _ones_action(tensordict))


class FunctionPolicy(TensorDictModuleBase):
    """A plain function as a policy module (an actor takes modules; TorchRL's collector both)."""

    def __init__(self, function: Callable[[TensorDictBase], TensorDictBase]) -> None:
        super().__init__()
        self.function = function
        self.in_keys: list[str] = []
        self.out_keys = ["action"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.function(tensordict)


def inplace_policy(env: EnvBase) -> TensorDictModuleBase:
    """``test_collector_outplace_policy``'s ``policy_inplace``: writes the action into its input."""
    return FunctionPolicy(_policy_inplace)


def outplace_policy(env: EnvBase) -> TensorDictModuleBase:
    """``test_collector_outplace_policy``'s ``policy_outplace``: a new TensorDict of the action."""
    return FunctionPolicy(_policy_outplace)


def pendulum() -> EnvBase:
    """TorchRL's ``_pendulum_env_maker``: Pendulum-v1 as it is (``test_collector_output_keys``)."""
    return GymEnv("Pendulum-v1")


def lstm_net_policy(env: EnvBase, explicit_spec: bool = False, seed: int = 0) -> SafeModule:
    """``test_collector_output_keys``'s ``SafeModule`` over TorchRL's ``LSTMNet``.

    It reads ``hidden1``/``hidden2`` and writes them, and their ``("next", ...)`` copies.
    """
    hidden = 12
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = LSTMNet(1, {"input_size": hidden, "hidden_size": hidden}, {"out_features": hidden})
    kwargs: dict[str, Any] = {
        "module": net,
        "in_keys": ["observation", "hidden1", "hidden2"],
        "out_keys": ["action", "hidden1", "hidden2", ("next", "hidden1"), ("next", "hidden2")],
    }
    if explicit_spec:
        hidden_spec = Unbounded((1, hidden))
        kwargs["spec"] = Composite(
            action=Unbounded(),
            hidden1=hidden_spec,
            hidden2=hidden_spec,
            next=Composite(hidden1=hidden_spec, hidden2=hidden_spec),
        )
    policy = SafeModule(**kwargs)
    policy(pendulum().reset())  # as TorchRL's test, before the collector is built
    return policy


def continuous_vec_init() -> EnvBase:
    """TorchRL's ``ContinuousActionVecMockEnv`` with ``is_init`` (``test_excluded_keys``)."""
    return TransformedEnv(ContinuousActionVecMockEnv(), InitTracker())


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def private_key_policy(
    env: EnvBase, out_key: str | list[str] = "_dummy", seed: int = 0
) -> TensorDictSequential:
    """``test_excluded_keys``'s policy: linear, a copy of the observation at ``out_key``, OU.

    ``out_key`` is a private key (``"_dummy"``) or a nested one (a list, as JSON carries it).
    """
    key = out_key if isinstance(out_key, str) else tuple(out_key)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        linear = nn.Linear(env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1])
    policy = TensorDictModule(linear, in_keys=["observation"], out_keys=["action"])
    copier = TensorDictModule(_identity, in_keys=["observation"], out_keys=[key])
    noise = OrnsteinUhlenbeckProcessModule(spec=Composite({k: None for k in policy.out_keys}))
    return TensorDictSequential(policy, copier, noise)


def _to_float(x: torch.Tensor) -> torch.Tensor:
    return x.float()


def _to_int8(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int8)


def zero_linear_policy(env: EnvBase) -> TensorDictSequential:
    """``TestAsyncCollection.test_start_update_policy``'s policy: a zeroed linear, int8 action.

    Its action is the bias (``module.1.module.bias``) while the weight stays 0.
    """
    linear = nn.Linear(env.observation_spec["observation"].shape[-1], 1)
    linear.weight.data.fill_(0)
    linear.bias.data.fill_(0)
    return TensorDictSequential(
        TensorDictModule(_to_float, in_keys=["observation"], out_keys=["action"]),
        TensorDictModule(linear, in_keys=["action"], out_keys=["action"]),
        TensorDictModule(_to_int8, in_keys=["action"], out_keys=["action"]),
    )


def frame_skip_cartpole() -> EnvBase:
    """``test_collector_env_reset``'s env: CartPole-v1, ``frame_skip=4``, a ``StepCounter``."""
    return TransformedEnv(GymEnv("CartPole-v1", frame_skip=4), StepCounter())


class ParamSyncEnv(EnvBase):
    """``TestUpdateParams.DummyEnv``: the state adds up the actions, zero reward, never done."""

    def __init__(self) -> None:
        super().__init__(batch_size=())
        self.state = torch.zeros(())
        self.observation_spec = Composite(state=Unbounded(shape=()))
        self.action_spec = Unbounded(shape=())
        self.reward_spec = Unbounded(shape=(1,))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.state += tensordict.get("action")
        return TensorDict(
            {"state": self.state.clone(), "reward": self.reward_spec.zero()}
            | dict(self.full_done_spec.zero().items()),
            self.batch_size,
        )

    def _reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        self.state.zero_()
        return TensorDict({"state": self.state.clone()}, self.batch_size)

    def _set_seed(self, seed: int | None) -> None:
        pass


def param_sync_env() -> EnvBase:
    """``TestUpdateParams``' env (:class:`ParamSyncEnv`)."""
    return ParamSyncEnv()


class ParamSyncPolicy(TensorDictModuleBase):
    """``TestUpdateParams.Policy``: the action is a parameter plus a buffer, both 0."""

    def __init__(self) -> None:
        super().__init__()
        self.param = nn.Parameter(torch.zeros(()))
        self.register_buffer("buf", torch.zeros(()))
        self.in_keys: list[Any] = []
        self.out_keys: list[Any] = ["action"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict["action"] = (self.param + self.buf).expand(tensordict.shape)
        return tensordict


def param_sync_policy(env: EnvBase) -> TensorDictModuleBase:
    """``TestUpdateParams``' policy (:class:`ParamSyncPolicy`)."""
    return ParamSyncPolicy()


def counting_steps(max_steps: int = 100) -> EnvBase:
    """``CountingEnv`` with a ``StepCounter`` (``TestCollectorRB``'s step-counted env)."""
    return TransformedEnv(CountingEnv(max_steps=max_steps), StepCounter())


def continuous_vec() -> EnvBase:
    """TorchRL's ``ContinuousActionVecMockEnv`` (``test_update_weights``' env)."""
    return ContinuousActionVecMockEnv()


def lazy_linear_policy(env: EnvBase, seed: int = 0) -> SafeModule:
    """``test_update_weights``' policy: a ``LazyLinear`` to the action, materialised on a reset."""
    torch.manual_seed(seed)
    n_actions = env.action_spec.shape[-1]
    policy = SafeModule(nn.LazyLinear(n_actions), in_keys=["observation"], out_keys=["action"])
    policy(env.reset())
    return policy
