"""User TensorDict policies on the tensor path: the same batches as the TensorDict path.

Each policy factory is built twice with one seed: as is (the actor calls its inner
modules on tensors) and with a no-op forward hook (the actor calls it on a TensorDict,
as TorchRL does). Both actors must collect identical batches, sampling included.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn

from actor_service._config import ActorConfig, ModelSpec
from actor_service._kinds.env.core import EnvCore
from actor_service._kinds.env.tensor_forward import tensor_forward
from common.config import CollectSettings, ExplorationType

HERE = str(pathlib.Path(__file__).resolve().parents[2])  # the helpers of tests/actor_service
USER_POLICIES = [
    "user_sequential",
    "user_chain",
    "user_dict_output",
    "td_policy_with_extras",
    "user_probabilistic_actor",
    "torchrl_probabilistic_actor",
]


@pytest.fixture(autouse=True)
def _test_factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(HERE)


def _worker(factory: str, **kwargs: object) -> EnvCore:
    spec = ModelSpec(factory=f"rlfleet_test_policies:{factory}", kwargs=dict(kwargs))
    return EnvCore(ActorConfig(num_envs=3, seed=7, models=(spec,)))


def _batches(worker: EnvCore, count: int = 3) -> list[TensorDict]:
    """Collect right after the worker seeded torch's (process-wide) RNG."""
    worker.configure(
        CollectSettings(frames_per_batch=3 * 40, exploration_type=ExplorationType.RANDOM)
    )
    return [worker.collect_batch() for _ in range(count)]


def _assert_identical(a: TensorDict, b: TensorDict) -> None:
    """Every entry equal; trajectory ids up to the actor's random epoch tag (their low bits)."""
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if key == ("collector", "traj_ids"):
            x, y = x & 0xFFFFFFFF, y & 0xFFFFFFFF
        assert x.dtype == y.dtype, key
        assert x.shape == y.shape, key
        assert torch.equal(x, y), key


@pytest.mark.parametrize("factory", USER_POLICIES)
def test_tensor_path_and_tensordict_path_give_identical_batches(factory: str) -> None:
    with _worker(factory) as fast:
        assert fast.models.forward_path("policy") == "tensors"
        fast_batches = _batches(fast)
    with _worker(factory, general=True) as general:
        assert general.models.forward_path("policy") == "tensordict"
        general_batches = _batches(general)
    for a, b in zip(fast_batches, general_batches, strict=True):
        _assert_identical(a, b)
    ends = torch.cat([b["next", "done"].flatten() for b in fast_batches])
    assert ends.any(), "no episode ended: resets were not exercised"


def test_sampling_policies_draw_from_the_seeded_stream_on_both_paths() -> None:
    with _worker("user_chain") as fast:
        first = _batches(fast, 1)[0]
    with _worker("user_chain", general=True) as general:
        again = _batches(general, 1)[0]
    assert first.get(("critic", "v")).shape == (3, 40)
    assert "sample_log_prob" in first
    assert "_" not in first
    _assert_identical(first, again)
    logits = first["logits"]
    # Sampled, not argmax: with seed 7 some actions are not the greedy choice.
    assert (first["action"].argmax(-1) != logits.argmax(-1)).any()


@pytest.mark.parametrize("factory", ["user_probabilistic_actor", "torchrl_probabilistic_actor"])
def test_probabilistic_actors_sample_and_log_their_probability_on_the_tensor_path(
    factory: str,
) -> None:
    with _worker(factory) as worker:
        assert worker.models.forward_path("policy") == "tensors"
        batch = _batches(worker, 1)[0]
    assert batch["action"].sum(-1).eq(1).all()
    log_prob = batch["action_log_prob"]
    expected = batch["logits"].log_softmax(-1).gather(-1, batch["action"].argmax(-1, True))
    torch.testing.assert_close(log_prob, expected.squeeze(-1))
    assert (batch["action"].argmax(-1) != batch["logits"].argmax(-1)).any()  # sampled


def test_a_policy_the_tensor_path_cannot_take_still_collects_on_the_tensordict_path() -> None:
    with _worker("user_overridden_forward") as worker:
        assert worker.models.forward_path("policy") == "tensordict"
        batch = _batches(worker, 1)[0]
    assert batch["action"].sum(-1).eq(1).all()
    assert batch.batch_size == (3, 40)


def test_built_in_and_plain_policies_keep_their_own_paths() -> None:
    with EnvCore(ActorConfig(num_envs=2, seed=0)) as worker:
        assert worker.models.forward_path("policy") == "compact"
    with _worker("plain_index_policy") as worker:
        assert worker.models.forward_path("policy") == "module"


class _Overridden(TensorDictModule):
    def forward(self, tensordict, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().forward(tensordict, *args, **kwargs)
        out.set("action", out.get("action") * 2)
        return out


class _OwnCall(TensorDictModule):
    def _call_module(self, tensors: Any, **kwargs: Any) -> Any:
        return tuple(t * 2 for t in super()._call_module(tensors, **kwargs))


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 2))


def _sampled(
    in_key: str = "logits", out_keys: tuple = ("action",), sequence: dict | None = None, **kwargs
) -> nn.Module:
    """``observation -> logits`` then a one-hot sample; ``kwargs`` to the sampling module,
    ``sequence`` to the ``ProbabilisticTensorDictSequential`` around both."""
    sample = ProbabilisticTensorDictModule(
        in_keys=[in_key],
        out_keys=list(out_keys),
        distribution_class=torch.distributions.OneHotCategorical,
        **kwargs,
    )
    logits = TensorDictModule(_net(), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticTensorDictSequential(logits, sample, **(sequence or {}))


@pytest.mark.parametrize(
    "module",
    [
        _Overridden(_net(), in_keys=["observation"], out_keys=["action"]),
        _OwnCall(_net(), in_keys=["observation"], out_keys=["action"]),
        TensorDictModule(_net(), in_keys=["pixels"], out_keys=["action"]),
        TensorDictModule(_net(), in_keys={"observation": "x"}, out_keys=["action"]),
        TensorDictSequential(
            TensorDictModule(_net(), in_keys=["observation"], out_keys=["h"]),
            TensorDictModule(_net(), in_keys=["h"], out_keys=["action"]),
            selected_out_keys=["action"],
        ),
        TensorDictModule(_net(), in_keys=["observation"], out_keys=["a", "b"]).select_out_keys("a"),
        _sampled(sequence={"return_composite": True}),
        _sampled(sequence={"partial_tolerant": True}),
        _sampled(num_samples=2),
        _sampled(in_key="other"),
        _sampled(out_keys=()),
    ],
    ids=[
        "forward-override",
        "call-module-override",
        "unknown-input",
        "keyword-input",
        "selected-outputs",
        "select-hook",
        "composite-distribution",
        "partial-tolerant-actor",
        "several-samples",
        "sample-of-an-unknown-input",
        "nothing-sampled",
    ],
)
def test_modules_whose_behaviour_differs_are_left_to_the_tensordict_path(module) -> None:
    assert tensor_forward(module) is None


def test_an_unhooked_sequential_runs_layer_by_layer_and_a_hooked_one_through_call() -> None:
    seen: list[int] = []
    net = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    obs = torch.randn(5, 4)
    forward = tensor_forward(module)
    assert forward is not None
    torch.testing.assert_close(forward(obs)["action"], net(obs), rtol=0, atol=0)
    net[1].register_forward_hook(lambda *_: seen.append(1))
    forward = tensor_forward(module)
    assert forward is not None
    forward(obs)
    assert seen == [1]  # the hook ran: the sequential was called, not bypassed


def test_a_module_whose_two_paths_disagree_on_the_probe_keeps_the_tensordict_path() -> None:
    with _worker("counting_policy") as worker:
        assert worker.models.forward_path("policy") == "tensordict"
        batch = _batches(worker, 1)[0]
    calls = batch["calls"][0]
    assert torch.equal(calls, calls.sort().values)
    assert calls.unique().numel() == 40


class _Doubled(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class _Negated(nn.Linear):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return -super().__call__(*args, **kwargs)


class _Acting(nn.Linear):
    def act(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.forward(x) + scale


def _pre_hooked() -> TensorDictModule:
    module = TensorDictModule(_net(), in_keys=["observation"], out_keys=["action"])
    module.register_forward_pre_hook(lambda *_: None)
    return module


def test_a_pre_hooked_module_is_left_to_the_tensordict_path() -> None:
    assert tensor_forward(_pre_hooked()) is None


@pytest.mark.parametrize(
    ("inner", "kwargs"),
    [
        (_Doubled(nn.Linear(4, 2)), {}),
        (nn.Sequential(_Negated(4, 2)), {}),
        (_Acting(4, 2), {"method": "act", "method_kwargs": {"scale": 3.0}}),
    ],
    ids=["sequential-subclass", "layer-call-override", "method"],
)
def test_the_tensor_path_calls_what_the_module_would_call(inner: nn.Module, kwargs: dict) -> None:
    module = TensorDictModule(inner, in_keys=["observation"], out_keys=["action"], **kwargs)
    obs = torch.randn(5, 4)
    forward = tensor_forward(module)
    assert forward is not None
    expected = module(TensorDict({"observation": obs}, batch_size=[5]))["action"]
    torch.testing.assert_close(forward(obs)["action"], expected, rtol=0, atol=0)


def test_a_global_forward_hook_runs_on_the_tensor_path_too() -> None:
    seen: list[int] = []
    module = TensorDictModule(_net(), in_keys=["observation"], out_keys=["action"])
    handle = nn.modules.module.register_module_forward_hook(lambda *_: seen.append(1))
    try:
        forward = tensor_forward(module)
        assert forward is not None
        forward(torch.randn(5, 4))
    finally:
        handle.remove()
    assert seen  # the sequential went through nn.Module.__call__, hooks and all
