"""Push forms end to end (learner -> real actor over loopback gRPC): tied parameters sent once
and still tied on the actor, wire dtypes, subset and trainable-only pushes, each bit-exact
against a full push of the same state, and their refusals (nothing applied, actor SERVING)."""

from __future__ import annotations

import functools

import grpc
import gymnasium
import pytest
import torch
from push_policies import (
    BroadcastScalePolicy,
    SharedLinearPolicy,
    actor_weights,
    assert_bit_identical,
    in_process_actor,
    serving,
    shared_linear_policy,
)

from actor_service import ModelSpec
from common.errors import WeightsError
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import (
    DEFAULT_MAX_WEIGHT_BYTES,
    default_max_weight_bytes,
    encode_delta,
    encode_weights,
    state_nbytes,
    to_state_dict,
)
from learner_client import GrpcCollector, WeightPushError

pytestmark = pytest.mark.usefixtures("loopback_only")


@pytest.fixture(scope="module")
def actor():
    with in_process_actor(
        models=(ModelSpec("policy", "push_policies:shared_linear_policy"),)
    ) as handle:
        yield handle


@pytest.fixture
def collector(actor):
    with GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=2) as collector:
        yield collector


def _learner_policy(seed: int) -> SharedLinearPolicy:
    env = gymnasium.make("CartPole-v1")
    torch.manual_seed(seed)
    policy = shared_linear_policy(env.observation_space, env.action_space)
    with torch.no_grad():
        policy.norm.running_mean.uniform_(-0.5, 0.5)
        policy.norm.running_var.uniform_(0.5, 2.0)
        policy.norm.num_batches_tracked.fill_(seed + 11)
    return policy


def _actor_module(actor) -> SharedLinearPolicy:
    return actor.server.runtime.core.models.module("policy")


def test_full_push_sends_the_shared_linear_once_and_keeps_it_tied(actor, collector) -> None:
    policy = _learner_policy(1)
    blob = encode_weights(policy)
    unique = {id(t): t for t in policy.state_dict(keep_vars=True).values()}
    assert len(blob) - (8 + int.from_bytes(blob[:8], "little")) == sum(
        t.numel() * t.element_size() for t in unique.values()
    )
    version = collector.update_policy_weights_(policy)[0]
    module = _actor_module(actor)
    assert module.blocks[1].weight.data_ptr() == module.shared.weight.data_ptr()  # still one tensor
    observation = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(module.logits(observation), policy.logits(observation))
    got_version, weights = actor_weights(collector)
    assert got_version == version
    assert_bit_identical(weights, {k: v.clone() for k, v in policy.state_dict().items()})


def test_bf16_push_equals_a_full_push_of_the_rounded_state(collector) -> None:
    policy = _learner_policy(2)
    before = collector.policy_version
    assert collector.update_policy_weights_(policy, dtype=torch.bfloat16)[0] == before + 1
    _, via_bf16 = actor_weights(collector)
    assert collector.update_policy_weights_()[0] == before + 2  # a re-send keeps the form
    assert_bit_identical(actor_weights(collector)[1], via_bf16)
    rounded = {
        k: v.to(torch.bfloat16).float() if v.is_floating_point() else v.clone()
        for k, v in policy.state_dict().items()
    }
    assert not torch.equal(rounded["head.weight"], policy.head.weight)  # bf16 did round
    collector.update_policy_weights_(rounded)
    _, via_full = actor_weights(collector)
    assert_bit_identical(via_bf16, via_full)
    assert via_bf16["norm.num_batches_tracked"].dtype == torch.int64
    assert int(via_bf16["norm.num_batches_tracked"]) == 13  # integers are never cast


def test_subset_and_trainable_pushes_equal_a_full_push_of_the_same_state(collector) -> None:
    base, update = _learner_policy(3), _learner_policy(4)
    collector.update_policy_weights_(base)
    before = collector.policy_version
    subset = {k: v for k, v in update.state_dict().items() if k.startswith(("head.", "norm."))}
    assert collector.update_policy_weights_(subset)[0] == before + 1  # a subset bumps the version
    update.shared.requires_grad_(False)
    update.norm.requires_grad_(False)
    assert collector.update_policy_weights_(update, only_trainable=True)[0] == before + 2
    _, via_subsets = actor_weights(collector)
    merged = (
        dict(base.state_dict())
        | subset
        | {"head.weight": update.head.weight.detach(), "head.bias": update.head.bias.detach()}
    )
    collector.update_policy_weights_({k: v.clone() for k, v in merged.items()})
    version, via_full = actor_weights(collector)
    assert version == before + 3
    assert_bit_identical(via_subsets, via_full)


def _refused(collector, actor, push, message: str) -> None:
    version, weights = actor_weights(collector)
    with pytest.raises(WeightPushError) as info:
        push()
    error = info.value.failed[0]
    assert isinstance(error, WeightsError)  # INVALID_ARGUMENT on the wire
    assert message in str(error)
    assert actor_weights(collector)[0] == version  # nothing applied
    assert_bit_identical(actor_weights(collector)[1], weights)
    assert serving(actor.port)


def test_subset_push_naming_an_unknown_key_is_refused(actor, collector) -> None:
    policy = _learner_policy(5)
    bad = {"head.weight": policy.head.weight.detach(), "head.wieght": torch.zeros(2, 4)}
    _refused(
        collector,
        actor,
        lambda: collector.update_policy_weights_(bad),
        "unexpected keys ['head.wieght']",
    )


def test_bf16_push_into_an_integer_buffer_is_refused(actor, collector) -> None:
    bad = {
        "head.bias": torch.zeros(2),
        "norm.num_batches_tracked": torch.tensor(5.0, dtype=torch.bfloat16),
    }
    _refused(
        collector,
        actor,
        lambda: collector.update_policy_weights_(bad, dtype=torch.bfloat16),
        "never loads into an integer or bool buffer",
    )


def test_fp16_push_beyond_its_range_is_refused_naming_the_wire_dtype(actor, collector) -> None:
    """Values float16 cannot hold arrive as Inf: the refusal names the wire dtype and the fix,
    not the actor's (widening) cast into float32."""
    policy = _learner_policy(12)
    with torch.no_grad():
        policy.head.weight[0, 0] = 1e5  # beyond float16's 65504
    _refused(
        collector,
        actor,
        lambda: collector.update_policy_weights_(policy, dtype=torch.float16),
        "the push travelled in torch.float16, whose values end at ±65504",
    )


def test_a_float64_push_is_refused_naming_the_dtype_argument_that_fits_it(actor, collector) -> None:
    policy = _learner_policy(13).double()  # the integer buffer stays int64
    _refused(
        collector,
        actor,
        lambda: collector.update_policy_weights_(policy),
        "update_policy_weights_(..., dtype=torch.float32)",
    )
    collector.update_policy_weights_(policy, dtype=torch.float32)
    state = policy.state_dict()
    expected = {k: v.float() if v.is_floating_point() else v.clone() for k, v in state.items()}
    assert_bit_identical(actor_weights(collector)[1], expected)


def test_push_raises_if_only_trainable_is_given_a_mapping(collector) -> None:
    before = collector.policy_version
    with pytest.raises(TypeError, match="only_trainable"):
        collector.update_policy_weights_(_learner_policy(6).state_dict(), only_trainable=True)
    with pytest.raises(ValueError, match="dtype must be None or one of"):
        collector.update_policy_weights_(_learner_policy(6), dtype=torch.int8)
    assert collector.policy_version == before


def test_default_push_cap_is_sized_from_the_model_and_refuses_beyond(actor) -> None:
    models = actor.server.runtime.core.models
    cap = default_max_weight_bytes(state_nbytes(models.parameters_info("policy")))
    assert cap == DEFAULT_MAX_WEIGHT_BYTES  # a small model keeps the 1 GiB floor
    header = pb.WeightsHeader(
        model_id="policy",
        version=models.policy_version("policy") + 1,
        total_bytes=cap + 1,
        sha256="0" * 64,
    )
    with grpc.insecure_channel(f"127.0.0.1:{actor.port}") as channel:
        stub = pb_grpc.ActorServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.PushWeights(iter([pb.PushWeightsRequest(header=header)]), timeout=10)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"cap of {cap} bytes" in error.value.details()
    assert serving(actor.port)


def _shared_changed(policy: SharedLinearPolicy) -> None:
    with torch.no_grad():
        policy.shared.weight[0, :2] += 0.25


def test_delta_pushes_send_the_shared_linear_once_and_keep_it_tied(actor, collector) -> None:
    policy = _learner_policy(7)
    collector.update_policy_weights_(policy)
    plain = collector.stats()["last_push_bytes"]
    collector.update_policy_weights_(policy, delta=True)  # nothing held in this form: full
    assert collector.stats()["last_push_bytes"] == plain  # the tied tensor once, as plain
    _shared_changed(policy)
    collector.update_policy_weights_(policy, delta=True)
    stats = collector.stats()
    assert stats["delta_pushes"] == 1
    one_key = encode_delta(
        {"w": torch.zeros(4, 4)}, {"w": policy.shared.weight.detach().clone()}
    )  # the change of one key, for scale: the tied keys' changes travel once
    assert stats["last_push_bytes"] < 2 * len(one_key)
    module = _actor_module(actor)
    assert module.blocks[1].weight.data_ptr() == module.shared.weight.data_ptr()
    assert_bit_identical(actor_weights(collector)[1], dict(policy.state_dict()))


def test_delta_giving_tied_keys_different_changes_is_refused(actor, collector) -> None:
    policy = _learner_policy(8)
    untied = {k: v.clone() for k, v in policy.state_dict().items()}  # equal values, own tensors
    collector.update_policy_weights_(untied, delta=True)
    with torch.no_grad():
        untied["blocks.1.weight"][0, 0] += 0.5  # only one of the keys the actor ties
    _refused(
        collector,
        actor,
        lambda: collector.update_policy_weights_(untied, delta=True),
        "keys this model ties",
    )


def test_delta_parts_giving_tied_keys_different_changes_are_refused(actor, collector) -> None:
    policy = _learner_policy(9)
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    first = {k: v for k, v in state.items() if not k.startswith("blocks.1.")}
    second = {k: v for k, v in state.items() if k.startswith("blocks.1.")}
    address = [f"127.0.0.1:{actor.port}"]
    with GrpcCollector(address, frames_per_batch=2) as other:
        version = collector.policy_version + 1
        collector.update_policy_weights_(first, version=version, part=(0, 2), delta=True)
        other.update_policy_weights_(second, version=version, part=(1, 2), delta=True)
        before = actor_weights(collector)
        assert before[0] == version
        with torch.no_grad():
            first["shared.weight"][0, 0] += 0.5  # blocks.1.weight, in the other part, stays
        collector.update_policy_weights_(first, version=version + 1, part=(0, 2), delta=True)
        with pytest.raises(WeightPushError, match="keys this model ties"):
            other.update_policy_weights_(second, version=version + 1, part=(1, 2), delta=True)
    assert actor_weights(collector)[0] == version  # nothing applied
    assert_bit_identical(actor_weights(collector)[1], before[1])
    assert serving(actor.port)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_trainable_push_of_a_compiled_module_goes_under_the_keys_of_the_module_as_built(
    collector,
) -> None:
    base, update = _learner_policy(10), _learner_policy(11)
    collector.update_policy_weights_(base)
    update.shared.requires_grad_(False)
    update.norm.requires_grad_(False)
    before = collector.policy_version
    assert collector.update_policy_weights_(torch.compile(update), only_trainable=True) == {
        0: before + 1
    }
    version, weights = actor_weights(collector)
    assert version == before + 1
    trained = {"head.weight": update.head.weight.detach(), "head.bias": update.head.bias.detach()}
    assert_bit_identical(weights, dict(base.state_dict()) | trained)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_an_actor_whose_factory_compiles_the_policy_takes_pushes_and_its_own_checkpoint() -> None:
    """Its module names its weights ``_orig_mod.*``; pushes (of the module, compiled or not)
    and its own GetState name them as built, and all three load into it."""
    models = (ModelSpec("policy", "push_policies:compiled_shared_linear_policy"),)
    with (
        in_process_actor(models=models) as actor,
        GrpcCollector([f"127.0.0.1:{actor.port}"], frames_per_batch=2) as collector,
    ):
        first, second = _learner_policy(14), _learner_policy(15)
        collector.update_policy_weights_(first)
        assert_bit_identical(actor_weights(collector)[1], dict(first.state_dict()))
        checkpoint = collector.state_dict()
        version = collector.update_policy_weights_(torch.compile(second, backend="eager"))[0]
        assert actor_weights(collector)[0] == version
        assert_bit_identical(actor_weights(collector)[1], dict(second.state_dict()))
        collector.load_state_dict(checkpoint)
        assert actor_weights(collector)[0] == version - 1
        assert_bit_identical(actor_weights(collector)[1], dict(first.state_dict()))


@pytest.fixture(scope="module")
def broadcast_actor():
    with in_process_actor(
        models=(ModelSpec("policy", "push_policies:broadcast_scale_policy"),)
    ) as handle:
        yield handle


def _as_part(collector: GrpcCollector, policy: BroadcastScalePolicy, delta: bool) -> None:
    version = collector.policy_version + 1
    collector.update_policy_weights_(policy.state_dict(), version=version, part=(0, 1), delta=delta)


@pytest.mark.parametrize(
    "push",
    [
        lambda collector, policy: collector.update_policy_weights_(policy),
        lambda collector, policy: collector.update_policy_weights_(policy, delta=True),
        functools.partial(_as_part, delta=True),
    ],
    ids=["full", "delta", "delta-part"],
)
def test_push_into_a_broadcast_buffer_keeps_its_values_or_is_refused_whole(
    broadcast_actor, push
) -> None:
    """A buffer the actor holds as ``expand()``'s view (stride 0) takes no copy: a push giving
    it its own values applies the rest; other values (whole, a delta, a part) change nothing."""
    policy = BroadcastScalePolicy(4, 2)
    with GrpcCollector([f"127.0.0.1:{broadcast_actor.port}"], frames_per_batch=2) as collector:
        push(collector, policy)
        assert actor_weights(collector)[0] == collector.policy_version
        assert_bit_identical(actor_weights(collector)[1], to_state_dict(policy))
        with torch.no_grad():
            policy.head.weight[0, 0] += 1.0  # one element: small enough to go as a delta
        policy.scale = torch.tensor([2.0]).expand(2)
        _refused(
            collector,
            broadcast_actor,
            functools.partial(push, collector, policy),
            "holds as broadcast views",
        )
