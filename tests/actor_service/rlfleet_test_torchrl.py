"""TorchRL env and policy factories the TorchRL-env actor tests load by ``module:function``.

The actors import them as ``rlfleet_test_torchrl:<name>`` (this directory is on their path).
Every policy initialises its weights from its own ``seed``, so an actor and a TorchRL
collector built from the same factory hold the same weights.
"""

from __future__ import annotations

from typing import Any

import rlfleet_test_envs
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs import (
    CatFrames,
    Compose,
    DoubleToFloat,
    DTypeCastTransform,
    EnvBase,
    GymEnv,
    GymWrapper,
    InitTracker,
    ObservationNorm,
    RewardScaling,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    VecNorm,
)
from torchrl.envs.transforms import EndOfLifeTransform, RNDTransform
from torchrl.modules import (
    MLP,
    EGreedyModule,
    LSTMModule,
    OneHotCategorical,
    OrnsteinUhlenbeckProcessModule,
    ProbabilisticActor,
    QValueActor,
)
from torchrl.testing.mocking_classes import (
    CountingEnv,
    CountingEnvWithString,
    EnvWithDynamicSpec,
    EnvWithMetadata,
    HeterogeneousCountingEnv,
    MultiAgentCountingEnv,
    MultiKeyCountingEnv,
    NestedCountingEnv,
)


def cartpole() -> EnvBase:
    """CartPole-v1 with the transforms TorchRL's scripts add: episode reward, step count."""
    return TransformedEnv(
        GymEnv("CartPole-v1"), Compose(RewardSum(), StepCounter(), DoubleToFloat())
    )


def stacked_cartpole(frames: int = 4) -> EnvBase:
    """CartPole-v1 with its last ``frames`` observations stacked (64 bytes a frame for 4)."""
    cat = CatFrames(N=frames, dim=-1, in_keys=["observation"])
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(DoubleToFloat(), cat, RewardSum()))


def many_norms_cartpole(norms: int = 180) -> EnvBase:
    """CartPole-v1 through ``norms`` ``ObservationNorm``s: 3 env state entries each, per env."""
    chain = [ObservationNorm(loc=0.0, scale=1.0, in_keys=["observation"]) for _ in range(norms)]
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(DoubleToFloat(), *chain))


def batched_cartpole(envs: int = 2) -> EnvBase:
    """An env batched itself: ``envs`` CartPoles in a ``SerialEnv``."""
    return SerialEnv(envs, cartpole)


def crashing_cartpole(steps: int = 3) -> EnvBase:
    """CartPole whose gymnasium ``step`` raises after ``steps`` steps (the probe takes one)."""
    return GymWrapper(rlfleet_test_envs.crashing_cartpole(steps))


_WIDENING_BUILDS = [0]


def widening_cartpole(steps: int = 3) -> EnvBase:
    """The first build is :func:`crashing_cartpole`; every later one adds a ``step_count`` key."""
    _WIDENING_BUILDS[0] += 1
    if _WIDENING_BUILDS[0] == 1:
        return crashing_cartpole(steps)
    return TransformedEnv(crashing_cartpole(steps=10**9), StepCounter())  # never crashes


def close_raising_crashing_cartpole(steps: int = 3) -> EnvBase:
    """:func:`crashing_cartpole` whose gymnasium ``close`` raises (after closing)."""
    return GymWrapper(rlfleet_test_envs.close_raising_crashing_cartpole(steps))


def unbuildable_after_crash_cartpole(steps: int = 3) -> EnvBase:
    """:func:`crashing_cartpole`, after whose crash no env can be built (process-wide)."""
    return GymWrapper(rlfleet_test_envs.unbuildable_after_crash_cartpole(steps))


def uint16_counting() -> EnvBase:
    """TorchRL's ``CountingEnv`` with a uint16 observation, a dtype no packet carries."""
    cast = DTypeCastTransform(torch.int32, torch.uint16, in_keys=["observation"])
    return TransformedEnv(CountingEnv(), cast)


def end_of_life_cartpole() -> EnvBase:
    """CartPole with lives and TorchRL's ``EndOfLifeTransform``: ``end-of-life`` and ``lives``."""
    lives = EndOfLifeTransform(eol_attribute="lives")
    return TransformedEnv(
        GymWrapper(rlfleet_test_envs.cartpole_with_lives()),
        Compose(lives, RewardSum(), DoubleToFloat()),
    )


def string_counting() -> EnvBase:
    """TorchRL's mock ``CountingEnvWithString``: a ``string`` key that holds text."""
    return CountingEnvWithString()


def metadata_env() -> EnvBase:
    """TorchRL's mock ``EnvWithMetadata``: a ``non_tensor`` key that holds a Python int."""
    return EnvWithMetadata()


def raising_env() -> EnvBase:
    """A factory that fails."""
    raise RuntimeError("no env today")


def not_an_env() -> Any:
    """A factory that returns something else than an env."""
    return "CartPole-v1"


class _Greedy(nn.Module):
    """Logits of a linear layer plus a buffer; the one-hot argmax as the action."""

    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.linear = nn.Linear(observations, actions)
        self.register_buffer("offset", torch.zeros(actions))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(observation) + self.offset
        action = nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])
        return logits, action


def _sizes(env: EnvBase) -> tuple[int, int]:
    return env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]


def greedy_policy(env: EnvBase, seed: int = 0) -> TensorDictModule:
    """A deterministic policy: ``observation`` → ``logits``, one-hot ``action``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = _Greedy(*_sizes(env))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["logits", "action"])


def sampling_policy(env: EnvBase, seed: int = 0) -> ProbabilisticActor:
    """A ``ProbabilisticActor`` sampling a one-hot action, with its log-probability."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        linear = nn.Linear(*_sizes(env))
    return ProbabilisticActor(
        TensorDictModule(linear, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )


class _CountingGreedy(_Greedy):
    """:class:`_Greedy` that counts its calls by replacing its buffer (``n = n + 1``)."""

    def __init__(self, observations: int, actions: int) -> None:
        super().__init__(observations, actions)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls = self.calls + 1  # a new tensor each call: not the one built
        return super().forward(observation)


def counting_greedy_policy(env: EnvBase) -> TensorDictModule:
    """A greedy policy whose forward replaces a buffer, as a hand-written counter does."""
    module = _CountingGreedy(*_sizes(env))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["logits", "action"])


def lazy_policy(env: EnvBase, seed: int = 0) -> ProbabilisticActor:
    """TorchRL's tutorials' policy: an ``MLP`` without ``in_features`` (lazy layers)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = MLP(out_features=env.action_spec.shape[-1], num_cells=[8])
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
    )


class _SharedScale(nn.Module):
    """Greedy actions and one learnt scale for every env: ``log_std.exp().expand(...)``."""

    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.linear = nn.Linear(observations, actions)
        self.log_std = nn.Parameter(torch.zeros(()))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(observation)
        action = nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])
        return action, self.log_std.exp().expand(*observation.shape[:-1], 1)  # stride 0


def shared_scale_policy(env: EnvBase) -> TensorDictModule:
    """A policy whose ``scale`` output is one element with stride 0 on a one-env actor."""
    module = _SharedScale(*_sizes(env))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action", "scale"])


def linear_policy(env: EnvBase, seed: int = 0) -> TensorDictModule:
    """A deterministic continuous policy: ``observation`` -> ``action`` (any batch, none too)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = nn.Sequential(nn.Linear(*_sizes(env)), nn.Tanh())
    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def raising_policy(env: EnvBase) -> TensorDictModule:
    """A policy factory that fails."""
    raise ValueError("no policy today")


def keyerror_policy(*spaces: Any, **kwargs: Any) -> nn.Module:
    """A policy factory that fails as user code does: a missing kwarg."""
    return nn.Linear(4, kwargs["hidden"])


class _BreaksAfterProbe(_Greedy):
    """:class:`_Greedy` that acts once (the actor's probe step), then raises every time."""

    def __init__(self, observations: int, actions: int) -> None:
        super().__init__(observations, actions)
        self.calls = 0

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("the policy broke after its first step")
        return super().forward(observation)


def breaks_after_probe_policy(env: EnvBase) -> TensorDictModule:
    """A policy that passes the actor's probe step and fails every batch after it."""
    module = _BreaksAfterProbe(*_sizes(env))
    return TensorDictModule(module, in_keys=["observation"], out_keys=["logits", "action"])


def wrong_key_policy(env: EnvBase) -> TensorDictModule:
    """A policy that reads a key the env does not write."""
    return TensorDictModule(nn.Linear(4, 2), in_keys=["pixels"], out_keys=["action"])


def pendulum(steps: int = 20) -> EnvBase:
    """Pendulum-v1 cut at ``steps`` steps, with ``is_init`` (what OU noise resets on)."""
    base = GymEnv("Pendulum-v1", max_episode_steps=steps)
    return TransformedEnv(base, Compose(InitTracker(), DoubleToFloat(), RewardSum()))


def ou_policy(env: EnvBase, seed: int = 0) -> TensorDictSequential:
    """DDPG's exploration policy: a linear actor plus Ornstein-Uhlenbeck noise (stateful)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        actor = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    return TensorDictSequential(actor, OrnsteinUhlenbeckProcessModule(spec=env.action_spec.clone()))


def batch_norm_policy(env: EnvBase, seed: int = 0) -> TensorDictModule:
    """An actor with a batch-norm layer in eval mode (as CrossQ's): it needs batched steps."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 1), nn.Tanh())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"]).eval()


def _lstm(seed: int) -> LSTMModule:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="embed")


def lstm_cartpole() -> EnvBase:
    """CartPole-v1 with ``is_init`` and the primer of :func:`lstm_policy`'s recurrent state."""
    transforms = Compose(InitTracker(), DoubleToFloat(), RewardSum())
    env = TransformedEnv(GymEnv("CartPole-v1"), transforms)
    return env.append_transform(_lstm(0).make_tensordict_primer())


def _one_hot(logits: torch.Tensor) -> torch.Tensor:
    return nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])


def lstm_policy(env: EnvBase, seed: int = 0) -> TensorDictSequential:
    """A recurrent policy: an LSTM over observations (state carried per env), a greedy head."""
    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        head = TensorDictModule(nn.Linear(8, 2), in_keys=["embed"], out_keys=["logits"])
    greedy = TensorDictModule(_one_hot, in_keys=["logits"], out_keys=["action"])
    return TensorDictSequential(_lstm(seed), head, greedy)


def categorical_cartpole() -> EnvBase:
    """CartPole-v1 with index actions (a Categorical spec) and fixed observation statistics."""
    norm = ObservationNorm(
        loc=torch.tensor([0.0, 0.1, 0.0, -0.1]),
        scale=torch.tensor([2.0, 1.0, 4.0, 1.0]),
        in_keys=["observation"],
    )
    base = GymEnv("CartPole-v1", categorical_action_encoding=True)
    return TransformedEnv(base, Compose(DoubleToFloat(), norm, RewardSum(), StepCounter()))


def egreedy_policy(env: EnvBase, seed: int = 0, eps: float = 0.5) -> TensorDictSequential:
    """DQN's exploration policy: a ``QValueActor`` and an ``EGreedyModule`` (``eps`` a buffer)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = nn.Linear(4, 2)
    actor = QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    greedy = EGreedyModule(env.action_spec, eps_init=eps, eps_end=0.0, annealing_num_steps=10)
    return TensorDictSequential(actor, greedy)


def nested_counting(agents: int = 3) -> EnvBase:
    """TorchRL's own mock env whose keys are all nested under ``"data"``, one row per agent."""
    return NestedCountingEnv(max_steps=7, nested_dim=agents)


def crowded_counting() -> EnvBase:
    """:func:`nested_counting` with 32 agents: 128 bytes of nested observations a frame."""
    return nested_counting(32)


def normalized_pendulum() -> EnvBase:
    """Pendulum-v1 whose observations a ``VecNorm`` normalises with running statistics."""
    norm = VecNorm(in_keys=["observation"], new_api=True)
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), norm, RewardSum()))


def crashing_normalized_pendulum(crash_after: int = 15) -> EnvBase:
    """:func:`normalized_pendulum` whose simulator raises after ``crash_after`` steps."""
    norm = VecNorm(in_keys=["observation"], new_api=True)
    base = GymWrapper(rlfleet_test_envs.crashing_pendulum(crash_after))
    return TransformedEnv(base, Compose(DoubleToFloat(), norm, RewardSum()))


def vecnorm_v1_pendulum(max_steps: int | None = None) -> EnvBase:
    """Pendulum-v1 with ``ppo_mujoco.py``'s ``VecNorm`` (TorchRL's first API, sums and counts)."""
    norm = VecNorm(in_keys=["observation"], decay=0.99999, eps=1e-2)
    counter = StepCounter(max_steps=max_steps)
    return TransformedEnv(
        GymEnv("Pendulum-v1"), Compose(norm, RewardSum(), counter, DoubleToFloat())
    )


def rnd_networks(seed: int) -> tuple[nn.Module, nn.Module]:
    """``rnd_mujoco.py``'s target and predictor shapes for Pendulum (3 inputs, 8 features)."""
    torch.manual_seed(seed)
    target = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 8)).requires_grad_(False)
    predictor = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 8))
    return target, predictor


def rnd_pendulum(seed: int = 1, crash_after: int = 0) -> EnvBase:
    """Pendulum-v1 as ``rnd_mujoco.py``'s ``make_env`` builds it: ``VecNorm``, then RND.

    The RND networks are initialised from ``seed`` (the learner's env uses another seed,
    so only a push makes them equal); the intrinsic reward is the raw prediction error.
    ``crash_after``: the simulator raises after that many steps (0: never).
    """
    target, predictor = rnd_networks(seed)
    rnd = RNDTransform(
        target_network=target,
        predictor_network=predictor,
        normalize_obs=False,
        normalize_reward=False,
    )
    norm = VecNorm(in_keys=["observation"], decay=0.99999, eps=1e-2)
    base = (
        GymWrapper(rlfleet_test_envs.crashing_pendulum(crash_after))
        if crash_after
        else GymEnv("Pendulum-v1")
    )
    return TransformedEnv(base, Compose(norm, DoubleToFloat(), rnd))


def stateful_pendulum() -> EnvBase:
    """Pendulum-v1 with a stateful transform of each kind TorchRL ships, ``VecNorm`` v2 first.

    ``ObservationNorm`` (its ``loc``/``scale`` buffers, set by ``init_stats`` here, as a
    script sets them), ``RewardScaling``, ``StepCounter``, ``InitTracker``, ``CatFrames``.
    """
    obs_norm = ObservationNorm(in_keys=["observation"], standard_normal=True)
    env = TransformedEnv(
        GymEnv("Pendulum-v1"),
        Compose(
            DoubleToFloat(),
            VecNorm(in_keys=["observation"], out_keys=["vn_observation"], new_api=True),
            obs_norm,
            RewardScaling(loc=0.5, scale=2.0),
            StepCounter(),
            InitTracker(),
            CatFrames(N=3, dim=-1, in_keys=["observation"], out_keys=["stacked"]),
        ),
    )
    torch.manual_seed(0)
    obs_norm.init_stats(num_iter=4, reduce_dim=0, cat_dim=0)
    return env


def _require_dictconfig(cfg: Any) -> None:
    from omegaconf import DictConfig

    if not isinstance(cfg, DictConfig):
        raise TypeError(f"cfg is a {type(cfg).__name__}, not the script's DictConfig")


def cfg_pendulum(cfg: Any) -> EnvBase:
    """A Hydra script's ``make_env(cfg)``: reads ``cfg.env.name`` as a ``DictConfig``."""
    _require_dictconfig(cfg)
    return TransformedEnv(GymEnv(cfg.env.name), Compose(DoubleToFloat(), StepCounter()))


def cfg_policy(env: EnvBase, cfg: Any) -> TensorDictSequential:
    """A Hydra script's ``make_policy(env, cfg)``: its seed from ``cfg.seed`` (a ``DictConfig``)."""
    _require_dictconfig(cfg)
    return ou_policy(env, seed=cfg.seed)


def gym_ou_policy(observation_space: Any, action_space: Any) -> TensorDictSequential:
    """:func:`ou_policy` with a gymnasium policy factory's signature (for a gymnasium actor)."""
    return ou_policy(pendulum())


def gym_lstm_policy(observation_space: Any, action_space: Any) -> TensorDictSequential:
    """:func:`lstm_policy` with a gymnasium policy factory's signature (for a gymnasium actor)."""
    return lstm_policy(lstm_cartpole())


def counting(max_steps: int = 7) -> EnvBase:
    """TorchRL's ``CountingEnv`` (its collector tests' workhorse): done after ``max_steps``."""
    return CountingEnv(max_steps=max_steps)


def multi_key_counting() -> EnvBase:
    """TorchRL's ``MultiKeyCountingEnv``: two nested action keys, several done keys."""
    return MultiKeyCountingEnv(max_steps=7)


def heterogeneous_counting() -> EnvBase:
    """TorchRL's ``HeterogeneousCountingEnv``: agents whose observations differ in shape."""
    return HeterogeneousCountingEnv(max_steps=7)


def dynamic_spec() -> EnvBase:
    """TorchRL's ``EnvWithDynamicSpec``: an observation whose shape varies (``[3, -1, 2]``)."""
    return EnvWithDynamicSpec()


def multi_agent_counting(agents: int = 3) -> EnvBase:
    """TorchRL's ``MultiAgentCountingEnv``: ``("agents", "agent_i", ...)`` keys, own reward/done."""
    return MultiAgentCountingEnv(n_agents=agents, max_steps=7)


class _UsersCountingEnv(CountingEnv):
    """A TorchRL env class of the user's own module (not under ``torchrl.``)."""


def users_torchrl_env() -> EnvBase:
    """A TorchRL env whose class the user defined."""
    return _UsersCountingEnv()
