"""Built-in policies, the model registry (inference, versions, all-or-nothing pushes), codecs."""

from __future__ import annotations

import contextlib
import math
import pathlib
import re

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, set_interaction_type

from actor_service._config import ModelSpec
from actor_service._core._frames import interaction_of
from actor_service._kinds.env.models import ModelRegistry
from actor_service._kinds.env.spaces import ActionCodec, ObservationCodec
from common.config import ExplorationType
from common.errors import InternalError, StaleVersionError, UnknownModelError, WeightsError
from common.import_paths import load_callable
from common.policies import make_policy, make_value_mlp

CARTPOLE = gymnasium.make("CartPole-v1")
PENDULUM = gymnasium.make("Pendulum-v1")
SCALAR = "rlfleet_test_policies:scalar_extra_policy"
REWARD = "rlfleet_test_policies:td_policy_writing_reward"
HERE = str(pathlib.Path(__file__).resolve().parents[2])  # the helpers of tests/actor_service


@pytest.fixture(autouse=True)
def _test_factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(HERE)


def _registry(*specs: ModelSpec, env: gymnasium.Env = CARTPOLE) -> ModelRegistry:
    torch.manual_seed(0)
    return ModelRegistry(specs or (ModelSpec(),), env.observation_space, env.action_space, "cpu")


def _obs(batch: int = 16, dim: int = 4) -> torch.Tensor:
    return torch.randn(batch, dim, generator=torch.Generator().manual_seed(1))


def _act(
    registry: ModelRegistry,
    model_id: str,
    observation: torch.Tensor,
    exploration_type: ExplorationType | None = None,
) -> TensorDict:
    """One step's forward pass as the rollout takes it (``act_compact``), in batch form on CPU."""
    mode = contextlib.nullcontext()
    if exploration_type is not None:
        mode = set_interaction_type(interaction_of(exploration_type))
    with torch.no_grad(), mode:
        version, action, extras = registry.act_compact(model_id, observation)
    batch = observation.shape[0]
    out = TensorDict({k: v.detach().cpu() for k, v in extras.items()}, batch_size=[batch])
    out.set("action", registry.action_codec.to_batch(action.cpu()))
    out.set("policy_version", torch.full((batch,), version, dtype=torch.int64))
    return out


def _deterministic(registry: ModelRegistry, model_id: str = "policy") -> torch.Tensor:
    return _act(registry, model_id, _obs(), ExplorationType.DETERMINISTIC)["action"]


@pytest.mark.parametrize("env", [CARTPOLE, PENDULUM], ids=["discrete", "box"])
def test_mlp_policy_fast_path_matches_tensordict_forward(env: gymnasium.Env) -> None:
    policy = make_policy("mlp", env.observation_space, env.action_space, hidden=(8,))
    obs = _obs(dim=env.observation_space.shape[0])
    for mode in (InteractionType.RANDOM, InteractionType.DETERMINISTIC, InteractionType.MEAN):
        with torch.no_grad(), set_interaction_type(mode):
            torch.manual_seed(5)
            td = policy(TensorDict({"observation": obs}, batch_size=[16]))
            torch.manual_seed(5)
            action, extras = policy.act_compact(obs)
        expected = td["action"].argmax(-1) if policy.discrete else td["action"]
        assert torch.equal(action, expected)
        assert torch.allclose(extras["action_log_prob"], td["action_log_prob"], atol=1e-6)
        log_prob = policy.get_dist(td).log_prob(td["action"])
        assert torch.allclose(log_prob, td["action_log_prob"], atol=1e-6)


def test_mlp_policy_samples_one_hot_int64_with_the_softmax_frequencies() -> None:
    policy = make_policy("mlp", CARTPOLE.observation_space, CARTPOLE.action_space)
    obs = torch.zeros(20_000, 4)
    with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
        td = policy(TensorDict({"observation": obs}, batch_size=[20_000]))
    assert td["action"].dtype == torch.int64
    frequency = td["action"].float().mean(0)
    assert torch.allclose(frequency, td["logits"][0].softmax(-1), atol=0.02)


def test_make_value_mlp_maps_observations_to_one_value() -> None:
    value = make_value_mlp(CARTPOLE.observation_space, hidden=[16])
    assert value(torch.zeros(3, 7, 4)).shape == (3, 7, 1)


@pytest.mark.parametrize(
    "spec",
    [
        "nope",
        "no_colon.module",
        "a:b:c",
        ":f",
        "m:",
        "not_a_module_xyz:f",
        "rlfleet_test_envs:nope",
    ],
)
def test_load_callable_raises_if_spec_is_bad(spec: str) -> None:
    with pytest.raises(ValueError, match=r"module|expected"):
        load_callable(spec)


def test_make_policy_raises_if_name_unknown_or_kwargs_wrong() -> None:
    with pytest.raises(ValueError, match="'random', 'mlp'"):
        make_policy("transformer", CARTPOLE.observation_space, CARTPOLE.action_space)
    with pytest.raises(ValueError, match="hidden and activation"):
        make_policy("mlp", CARTPOLE.observation_space, CARTPOLE.action_space, width=3)
    with pytest.raises(ValueError, match="activation"):
        make_policy("mlp", CARTPOLE.observation_space, CARTPOLE.action_space, activation="x")
    with pytest.raises(ValueError, match="'random' policy takes no arguments"):
        make_policy("random", CARTPOLE.observation_space, CARTPOLE.action_space, hidden=(8,))
    with pytest.raises(TypeError, match=r"not an nn\.Module"):
        make_policy(
            "rlfleet_test_policies:not_a_module", CARTPOLE.observation_space, CARTPOLE.action_space
        )


def test_registry_act_returns_torchrl_form_and_extras() -> None:
    td = _act(_registry(), "policy", _obs())
    assert td["action"].shape == (16, 2)
    assert td["action"].dtype == torch.int64
    assert td["logits"].shape == (16, 2)
    assert td["action_log_prob"].shape == (16,)
    assert td["policy_version"].eq(0).all()


def test_registry_parameters_info_lists_state_dict_shapes_and_dtypes() -> None:
    registry = _registry(ModelSpec(kwargs={"hidden": [8]}))
    info = registry.parameters_info("policy")
    state = registry.module("policy").state_dict()
    assert info == {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    assert info["module.0.module.1.weight"] == ((8, 4), torch.float32)


def test_registry_deterministic_exploration_gives_the_same_actions() -> None:
    registry = _registry()
    assert torch.equal(_deterministic(registry), _deterministic(registry))


def test_registry_load_weights_changes_deterministic_actions_and_version() -> None:
    registry = _registry()
    before = _deterministic(registry)
    state = {k: v.clone() for k, v in registry.module("policy").state_dict().items()}
    last_bias = [k for k in state if k.endswith("bias")][-1]
    state[last_bias] = torch.tensor([10.0, -10.0])  # always action 0
    assert registry.load_weights("policy", 3, state) == 3
    after = _deterministic(registry)
    assert registry.policy_version("policy") == 3
    assert after[:, 0].eq(1).all()
    assert not torch.equal(before, after)


def _bad_pushes(state: dict) -> dict:
    first = next(iter(state))
    wrong_shape = {**state, first: torch.zeros(3, 3)}
    nan = {**state, first: torch.full_like(state[first], float("nan"))}
    wrong_dtype = {**state, first: state[first].double()}
    unknown = {**state, "extra.weight": torch.zeros(1)}
    missing = {k: v for k, v in state.items() if k != first}
    return {
        "shape": (WeightsError, "policy", 3, wrong_shape, "shape mismatch"),
        "nan": (WeightsError, "policy", 3, nan, "non-finite"),
        "dtype": (WeightsError, "policy", 3, wrong_dtype, "dtype mismatch"),
        "unknown_key": (WeightsError, "policy", 3, unknown, "unexpected keys"),
        "missing_key": (WeightsError, "policy", 3, missing, "missing keys"),
        "unknown_model": (UnknownModelError, "critic", 3, state, "known model_ids"),
        "stale": (StaleVersionError, "policy", 2, state, "not newer"),
    }


@pytest.mark.parametrize(
    "case", ["shape", "nan", "dtype", "unknown_key", "missing_key", "unknown_model", "stale"]
)
def test_registry_load_weights_raises_and_changes_nothing_if_push_is_bad(case: str) -> None:
    registry = _registry()
    good = {k: v.clone() + 0.5 for k, v in registry.module("policy").state_dict().items()}
    registry.load_weights("policy", 2, good)
    before_actions, before_state = _deterministic(registry), registry.state_dict()
    error, model_id, version, state, message = _bad_pushes(good)[case]
    with pytest.raises(error, match=message):
        registry.load_weights(model_id, version, state)
    assert registry.policy_version("policy") == 2
    assert torch.equal(_deterministic(registry), before_actions)
    after_state = registry.state_dict()["policy"]["weights"]
    assert all(torch.equal(v, after_state[k]) for k, v in before_state["policy"]["weights"].items())


def test_registry_unknown_model_error_names_the_known_ids() -> None:
    registry = _registry(ModelSpec("policy"), ModelSpec("explorer", "random"))
    with pytest.raises(UnknownModelError, match=r"\['policy', 'explorer'\]"):
        registry.policy_version("critic")


def test_registry_random_model_has_no_parameters_and_accepts_empty_pushes() -> None:
    registry = _registry(ModelSpec("policy", "random"))
    assert registry.parameters_info("policy") == {}
    assert registry.load_weights("policy", 1, {}) == 1
    action = _act(registry, "policy", _obs())["action"]
    assert action.dtype == torch.int64
    assert action.sum(-1).eq(1).all()


@pytest.mark.parametrize("factory", ["plain_index_policy", "plain_one_hot_policy"])
def test_registry_wraps_plain_modules_into_one_hot_actions(factory: str) -> None:
    registry = _registry(ModelSpec(factory=f"rlfleet_test_policies:{factory}"))
    td = _act(registry, "policy", _obs())
    assert td["action"].dtype == torch.int64
    assert td["action"].sum(-1).eq(1).all()
    assert set(td.keys()) == {"action", "policy_version"}


def test_registry_sizes_a_lazy_policy_and_takes_pushes_into_it() -> None:
    registry = _registry(ModelSpec(factory="rlfleet_test_policies:lazy_index_policy"))
    assert registry.parameters_info("policy")["0.0.weight"] == ((8, 4), torch.float32)
    state = {k: torch.zeros_like(v) for k, v in registry.module("policy").state_dict().items()}
    state["0.2.bias"] = torch.tensor([0.0, 1.0])
    registry.load_weights("policy", 1, state)
    assert _act(registry, "policy", _obs())["action"][:, 1].eq(1).all()


def test_registry_keeps_extra_outputs_of_tensordict_modules() -> None:
    registry = _registry(ModelSpec(factory="rlfleet_test_policies:td_policy_with_extras"))
    assert registry.output_specs("policy")["score"] == ((), torch.float32)
    assert _act(registry, "policy", _obs())["score"].shape == (16,)


def test_registry_acts_in_eval_mode_and_drops_private_outputs_under_public_keys() -> None:
    registry = _registry(ModelSpec(factory="rlfleet_test_policies:private_nested_extra_policy"))
    assert not any(m.training for m in registry.module("policy").modules())
    assert set(registry.output_specs("policy")) == {"action"}
    assert ("critic", "_cache") not in _act(registry, "policy", _obs()).keys(True)


@pytest.mark.parametrize(
    ("differ", "path"), [("dtype", "tensordict"), ("shape", "tensordict"), ("nothing", "tensors")]
)
def test_the_probe_takes_the_tensor_path_only_if_outputs_match_in_dtype_shape_and_nan_values(
    differ: str, path: str
) -> None:
    spec = ModelSpec(factory="rlfleet_test_policies:flipping_policy", kwargs={"differ": differ})
    registry = _registry(spec)
    assert registry.forward_path("policy") == path
    if differ == "nothing":
        assert registry.output_specs("policy")["extra"] == ((), torch.float64)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((ModelSpec(factory="rlfleet_test_policies:td_policy_writing_reward"),), "rollout writes"),
        ((ModelSpec("p"), ModelSpec("p", "random")), "registered twice"),
        ((ModelSpec(factory="rlfleet_test_policies:not_a_module"),), "not an nn.Module"),
        ((ModelSpec(factory="rlfleet_test_policies:wrong_input_policy"),), "placeholder"),
        ((ModelSpec(factory="rlfleet_test_policies:scalar_extra_policy"),), "one row per env"),
        ((ModelSpec(factory=SCALAR, kwargs={"shape": [1]}),), "one row per env"),
        ((ModelSpec(factory=REWARD, kwargs={"key": "step_count"}),), "rollout writes"),
        ((ModelSpec(factory=REWARD, kwargs={"key": "collector"}),), "rollout writes"),
        ((ModelSpec(factory="rlfleet_test_policies:actionless_policy"),), "wrote no 'action'"),
        ((), "at least one model"),
    ],
)
def test_registry_raises_if_models_are_misconfigured(specs: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelRegistry(specs, CARTPOLE.observation_space, CARTPOLE.action_space, "cpu")


@pytest.mark.parametrize("model_id", ["a/b", ".hidden", "-neg", "actor v1", "m" * 65, ""])
def test_a_model_id_no_learner_could_address_is_refused_when_the_actor_is_configured(
    model_id: str,
) -> None:
    """Every kind's models (a TorchRL actor's in-process ones too): the learner's rule, at once.

    A TorchRL actor took ``actor/v1`` and then no learner could use it at all: its Describe
    named a model the learner refuses.
    """
    with pytest.raises(ValueError, match="model_id must be 1 to 64 letters"):
        ModelSpec(model_id, "random")
    assert ModelSpec("actor.v1-2_b", "random").model_id == "actor.v1-2_b"


def test_registry_state_dict_round_trips_weights_and_versions() -> None:
    source, target = _registry(), _registry(ModelSpec(kwargs={"hidden": [64, 64]}))
    torch.nn.init.constant_(next(source.module("policy").parameters()), 0.25)
    source.load_weights("policy", 7, source.module("policy").state_dict())
    target.load_state_dict(source.state_dict())
    assert target.policy_version("policy") == 7
    assert torch.equal(_deterministic(target), _deterministic(source))


def test_registry_load_state_dict_raises_and_changes_nothing_if_state_is_bad() -> None:
    registry = _registry()
    state = registry.state_dict()
    state["policy"]["version"] = 5
    next(iter(state["policy"]["weights"].values())).fill_(float("inf"))
    with pytest.raises(WeightsError, match="non-finite"):
        registry.load_state_dict(state)
    assert registry.policy_version("policy") == 0
    with pytest.raises(UnknownModelError):
        registry.load_state_dict({**state, "critic": state["policy"]})


def test_action_codec_clips_box_actions_for_the_env_only() -> None:
    codec = ActionCodec(PENDULUM.action_space)
    sampled = torch.tensor([[3.5], [-0.5], [-9.0]])
    assert np.array_equal(codec.to_env(sampled), np.array([[2.0], [-0.5], [-2.0]], np.float32))
    assert torch.equal(codec.to_batch(sampled), sampled)


def test_action_codec_batches_a_scalar_box_as_one_element_and_steps_the_env_with_its_shape() -> (
    None
):
    """TorchRL's GymEnv makes a Box of shape () a (1,) spec: batches hold [B, 1], the env
    gets [B] (gymnasium's shape); a policy may answer [B, 1] or the space's [B]."""
    codec = ActionCodec(gymnasium.spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32))
    assert (codec.shape, codec.compact_shape) == ((1,), (1,))
    for answer in (torch.tensor([[0.5], [3.0]]), torch.tensor([0.5, 3.0])):
        compact = codec.from_policy(answer, 2)
        assert compact.shape == (2, 1)
        assert codec.to_env(compact).tolist() == [0.5, 1.0]
    with pytest.raises(InternalError, match=r"shape \[2, 2\], expected \[2, 1\]"):
        codec.from_policy(torch.zeros(2, 2), 2)
    policy = make_policy("random", gymnasium.spaces.Box(-1, 1, (), np.float32), codec.space)
    assert policy.sample_compact(3).shape == (3, 1)


def test_action_codec_clips_a_float_action_before_casting_it_to_an_integer_box() -> None:
    """A cast first wrapped -1.28 to 255 for a uint8 Box (the env and the batch got 255)."""
    codec = ActionCodec(gymnasium.spaces.Box(0, 255, (3,), np.uint8))
    compact = codec.from_policy(torch.tensor([[-1.28, -2.09, 300.0]]), 1)
    assert compact.tolist() == [[0, 0, 255]]
    assert codec.to_env(compact).tolist() == [[0, 0, 255]]
    flags = ActionCodec(gymnasium.spaces.Box(0, 1, (2,), bool))
    assert flags.from_policy(torch.tensor([[0.0, 3.0]]), 1).tolist() == [[False, True]]


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, bool])
def test_mlp_policy_refuses_integer_and_bool_box_actions(dtype: type) -> None:
    """Its Gaussian samples are floats: cast, their stored log-probs were of other actions."""
    space = gymnasium.spaces.Box(0, 1, (3,), dtype)
    with pytest.raises(ValueError, match=r"float Box action spaces.*policy 'random'"):
        make_policy("mlp", CARTPOLE.observation_space, space)


def test_random_policy_draws_integer_and_bool_boxes_uniformly() -> None:
    """Every integer of [low, high] alike, both ends included (truncating a uniform float
    never drew high and drew 0 twice as often), and fair bools (every one was True)."""
    torch.manual_seed(0)
    for low, high, dtype in ((-5, 5, np.int32), (0, 255, np.uint8)):
        space = gymnasium.spaces.Box(low, high, (100_000,), dtype)
        drawn = make_policy("random", CARTPOLE.observation_space, space).sample_compact(4)
        counts = torch.bincount(drawn.long().flatten() - low, minlength=high - low + 1)
        assert len(counts) == high - low + 1  # nothing outside [low, high]
        expected = drawn.numel() / (high - low + 1)
        assert counts.min() > 0.85 * expected
        assert counts.max() < 1.15 * expected
    bools = gymnasium.spaces.Box(0, 1, (100_000,), bool)
    bits = make_policy("random", CARTPOLE.observation_space, bools).sample_compact(1)
    assert bits.dtype == torch.bool
    assert 0.48 < bits.float().mean() < 0.52


def test_random_policy_draws_each_bounded_dim_of_a_partly_bounded_box_uniformly() -> None:
    """A Box bounded in one dim and not in others: the bounded dim is uniform (it was a
    clipped normal, 32% of draws at its bounds)."""
    torch.manual_seed(0)
    space = gymnasium.spaces.Box(
        np.array([0.0, -np.inf, -1.0], np.float32), np.array([np.inf, 0.0, 1.0], np.float32)
    )
    drawn = make_policy("random", CARTPOLE.observation_space, space).sample_compact(50_000)
    assert bool((drawn[:, 0] >= 0).all() and (drawn[:, 1] <= 0).all())
    assert (drawn[:, 2].abs() > 0.999).float().mean() < 0.01
    assert abs(drawn[:, 2].mean()) < 0.02
    assert abs(drawn[:, 2].var() - 1 / 3) < 0.02


def test_mlp_policy_refuses_zero_width_hidden_layers_and_multi_dim_box_actions() -> None:
    """A zero-wide layer outputs only its next bias; a [2, 2] Box would act as [2]."""
    with pytest.raises(ValueError, match="hidden sizes must be positive"):
        make_policy("mlp", CARTPOLE.observation_space, CARTPOLE.action_space, hidden=(8, 0))
    with pytest.raises(ValueError, match="hidden sizes must be positive"):
        make_value_mlp(CARTPOLE.observation_space, hidden=(0,))
    square = gymnasium.spaces.Box(-1.0, 1.0, (2, 2), np.float32)
    with pytest.raises(ValueError, match=r"1-D \(or scalar\) float Box"):
        make_policy("mlp", CARTPOLE.observation_space, square)


def test_mlp_policy_and_value_flatten_multi_dim_observations() -> None:
    grid = gymnasium.spaces.Box(0, 255, (2, 3), np.uint8)
    policy = make_policy("mlp", grid, CARTPOLE.action_space, hidden=(8,))
    observation = torch.randint(0, 256, (5, 2, 3), dtype=torch.uint8)
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        action, extras = policy.act_compact(observation)
    assert action.shape == (5,)
    assert extras["logits"].shape == (5, 2)
    assert make_value_mlp(grid, hidden=(8,))(observation).shape == (5, 1)


def test_mlp_policy_fast_path_samples_box_actions_with_the_learned_scale() -> None:
    """At init the scale is 1, so only a trained log_std tells a dropped scale apart."""
    policy = make_policy("mlp", PENDULUM.observation_space, PENDULUM.action_space, hidden=(8,))
    state = policy.state_dict()
    state["module.1.module.log_std"] = torch.full_like(
        state["module.1.module.log_std"], math.log(3)
    )
    policy.load_state_dict(state)
    obs = torch.zeros(20_000, 3)
    with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
        torch.manual_seed(5)
        td = policy(TensorDict({"observation": obs}, batch_size=[20_000]))
        torch.manual_seed(5)
        action, extras = policy.act_compact(obs)
    assert torch.allclose(action, td["action"])
    assert torch.allclose(extras["action_log_prob"], td["action_log_prob"], atol=1e-5)
    assert abs(float((action - extras["loc"]).std()) - 3.0) < 0.1


def test_random_policy_draws_every_multi_discrete_value_and_int8_multi_binary_bits() -> None:
    """MultiDiscrete indices cover [0, n) evenly (the env adds ``start``); MultiBinary bits
    are ``int8`` like gymnasium's and TorchRL's MultiBinary spec."""
    torch.manual_seed(0)
    space = gymnasium.spaces.MultiDiscrete([2, 5], start=[3, -1])
    drawn = make_policy("random", CARTPOLE.observation_space, space).sample_compact(20_000)
    assert drawn.dtype == torch.int64
    for column, n in enumerate((2, 5)):
        counts = torch.bincount(drawn[:, column], minlength=n)
        assert len(counts) == n  # nothing outside [0, n)
        assert counts.min() > 0.9 * drawn.shape[0] / n
    bits = make_policy("random", CARTPOLE.observation_space, gymnasium.spaces.MultiBinary(4))
    sample = bits.sample_compact(1_000)
    assert sample.dtype == torch.int8
    assert sample.shape == (1_000, 4)
    assert 0.45 < sample.float().mean() < 0.55


def test_random_policy_tensordict_forward_writes_one_hot_discrete_actions_in_the_batch_shape() -> (
    None
):
    policy = make_policy("random", CARTPOLE.observation_space, CARTPOLE.action_space)
    td = policy(TensorDict({"observation": torch.zeros(3, 5, 4)}, batch_size=[3, 5]))
    assert td["action"].dtype == torch.int64
    assert td["action"].shape == (3, 5, 2)
    assert torch.equal(td["action"].sum(-1), torch.ones(3, 5, dtype=torch.int64))
    box = make_policy("random", CARTPOLE.observation_space, PENDULUM.action_space)
    td = box(TensorDict({"observation": torch.zeros(3, 5, 4)}, batch_size=[3, 5]))
    assert td["action"].shape == (3, 5, 1)
    assert bool((td["action"].abs() <= 2.0).all())


def test_action_codec_offsets_discrete_start_for_the_env() -> None:
    codec = ActionCodec(gymnasium.spaces.Discrete(3, start=-1))
    assert codec.to_env(torch.tensor([0, 2])).tolist() == [-1, 1]
    assert codec.to_batch(torch.tensor([0, 2])).tolist() == [[1, 0, 0], [0, 0, 1]]


MULTI = {
    "multidiscrete": gymnasium.spaces.MultiDiscrete([3, 4], start=[1, -2]),
    "multibinary": gymnasium.spaces.MultiBinary(3),
}
REFUSED_ACTIONS = {  # what a cast would have truncated, or what lies outside the space
    "multidiscrete fractions": ("multidiscrete", [[1.7, 2.9]], "not whole numbers"),
    "multidiscrete out of range": ("multidiscrete", [[-1, 7]], "[-1, 7]"),
    "multidiscrete one element past n": ("multidiscrete", [[3, 0]], "[3]"),
    "multibinary not binary": ("multibinary", [[0, 5, -3]], "[5, -3]"),
    "multibinary fractions": ("multibinary", [[0.7, 1.0, 0.0]], "not whole numbers"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_ACTIONS))
def test_action_codec_refuses_multi_actions_outside_the_space(case: str) -> None:
    space, action, needle = REFUSED_ACTIONS[case]
    with pytest.raises(InternalError, match=re.escape(needle)):
        ActionCodec(MULTI[space]).from_policy(torch.tensor(action), 1)


def test_action_codec_takes_multi_actions_in_the_space_whole_floats_included() -> None:
    discrete = ActionCodec(MULTI["multidiscrete"])
    compact = discrete.from_policy(torch.tensor([[2.0, 3.0], [0.0, 0.0]]), 2)
    assert compact.dtype == torch.int64
    assert discrete.to_env(compact).tolist() == [[3, 1], [1, -2]]  # plus the space's start
    binary = ActionCodec(MULTI["multibinary"])
    assert binary.from_policy(torch.tensor([[True, False, True]]), 1).tolist() == [[1, 0, 1]]


@pytest.mark.parametrize(
    ("factory", "env", "needs"),
    [
        ("rlfleet_test_torchrl:gym_ou_policy", PENDULUM, "['is_init']"),
        ("rlfleet_test_torchrl:gym_lstm_policy", CARTPOLE, "'recurrent_state_c'"),
    ],
    ids=["ou-noise", "lstm"],
)
def test_registry_raises_if_a_policy_reads_more_than_a_gymnasium_step_holds(
    factory: str, env: gymnasium.Env, needs: str
) -> None:
    pytest.importorskip("torchrl")
    with pytest.raises(ValueError, match="--kind torchrl") as info:
        _registry(ModelSpec(factory=factory), env=env)
    assert needs in str(info.value)


@pytest.mark.parametrize("space", [PENDULUM.action_space, gymnasium.spaces.Discrete(2)])
def test_mlp_policy_state_dict_holds_each_parameter_once(space) -> None:
    """The fast path's references add no key: a push carries each weight once, and a module
    of the same layers built without them loads the state strictly."""
    policy = make_policy("mlp", PENDULUM.observation_space, space, hidden=(8,))
    assert sorted(policy.state_dict()) == sorted(name for name, _ in policy.named_parameters())


def test_observation_codec_batches_a_scalar_box_as_one_element() -> None:
    codec = ObservationCodec(gymnasium.spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32))
    assert codec.shape == (1,)
    assert codec.encode(np.array([0.5, -0.5], dtype=np.float32)).tolist() == [[0.5], [-0.5]]
    assert codec.placeholder(2).shape == (2,)


def test_observation_codec_placeholder_lies_inside_the_box() -> None:
    codec = ObservationCodec(gymnasium.spaces.Box(1.0, 2.0, shape=(2,), dtype=np.float32))
    assert codec.placeholder(1).tolist() == [[1.0, 1.0]]


def test_action_codec_refuses_an_action_that_is_not_a_tensor_as_the_policys_fault() -> None:
    with pytest.raises(InternalError, match="returned a list as action, not a tensor"):
        ActionCodec(PENDULUM.action_space).from_policy([[0.0]], 1)  # type: ignore[arg-type]


REFUSED_DISCRETE = {  # Discrete(3) for a batch of 2 unless the case names another n
    "index past n": (3, [0, 3], "indices in [0, 3], outside [0, 3)"),
    "negative index": (3, [-1, 2], "indices in [-1, 2], outside [0, 3)"),
    "bool index": (3, [True, False], "torch.bool action of shape [2]"),
    "two indices per env": (3, [[0, 1], [2, 0]], "shape [2, 2], expected one-hot [2, 3]"),
    "integer [B, 1] read as an index when n is 1": (1, [[5], [0]], "indices in [0, 5]"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_DISCRETE))
def test_action_codec_refuses_discrete_indices_outside_the_space(case: str) -> None:
    n, action, needle = REFUSED_DISCRETE[case]
    with pytest.raises(InternalError, match=re.escape(needle)):
        ActionCodec(gymnasium.spaces.Discrete(n)).from_policy(torch.tensor(action), 2)


def test_action_codec_takes_discrete_indices_of_any_integer_dtype_as_int64() -> None:
    codec = ActionCodec(gymnasium.spaces.Discrete(3))
    compact = codec.from_policy(torch.tensor([[2], [0]], dtype=torch.int32), 2)
    assert (compact.dtype, compact.tolist()) == (torch.int64, [2, 0])
    assert codec.from_policy(torch.zeros(0, dtype=torch.int64), 0).shape == (0,)
    one = ActionCodec(gymnasium.spaces.Discrete(1))
    assert one.from_policy(torch.tensor([[0.2], [0.9]]), 2).tolist() == [0, 0]  # one-hot


def test_action_codec_refuses_a_multi_binary_2_and_shows_four_bad_values_at_most() -> None:
    codec = ActionCodec(gymnasium.spaces.MultiBinary(6))
    with pytest.raises(InternalError, match=r": \[2, 2, 2, 2\] \(each") as info:
        codec.from_policy(torch.full((1, 6), 2), 1)
    assert "[2, 2, 2, 2, 2]" not in str(info.value)


def test_observation_codec_one_hots_a_discrete_observation_counted_from_its_start() -> None:
    codec = ObservationCodec(gymnasium.spaces.Discrete(3, start=-1))
    assert codec.encode(np.array([-1, 1])).tolist() == [[1, 0, 0], [0, 0, 1]]
    assert codec.placeholder(1).tolist() == [-1]


def test_observation_codec_keeps_an_integer_box_in_its_own_dtype() -> None:
    codec = ObservationCodec(gymnasium.spaces.Box(0, 255, shape=(2,), dtype=np.uint8))
    assert codec.raw_dtype == np.uint8
    assert codec.placeholder(1).dtype == np.uint8
    assert codec.encode(codec.placeholder(1)).dtype == torch.uint8
