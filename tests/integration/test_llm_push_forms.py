"""LLM weight pushes end to end: the tied embedding sent once and still tied on the actor,
LoRA adapter-only pushes (small, bit-exact against a full push) and their refusals."""

from __future__ import annotations

import pytest
import torch
from push_policies import actor_weights, assert_bit_identical, in_process_actor, serving

from actor_service import ModelSpec
from actor_service._kinds.llm.settings import LLMActorSettings
from common.errors import WeightsError
from common.weights import encode_weights
from learner_client import GrpcLLMCollector, WeightPushError

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("loopback_only")

from common.llm import LoraSpec, apply_lora, build_policy  # noqa: E402

TINY = {"hidden": 32, "layers": 1, "seed": 0}
LORA = LoraSpec(r=4, targets=("q_proj", "v_proj"))
IDS = torch.tensor([[5, 17, 42, 3, 99, 7]])


def _llm_actor(lora: LoraSpec | None = None):
    return in_process_actor(
        kind="llm",
        llm=LLMActorSettings(task="arith", lora=lora),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
    )


@pytest.fixture(scope="module")
def plain_actor():
    with _llm_actor() as handle:
        yield handle


@pytest.fixture(scope="module")
def lora_actor():
    with _llm_actor(lora=LORA) as handle:
        yield handle


def _collector(actor) -> GrpcLLMCollector:
    return GrpcLLMCollector([f"127.0.0.1:{actor.port}"], dialog_turns_per_batch=2)


def _actor_model(actor):
    return actor.server.runtime.core.models.model


def _peft_learner(seed: int):
    """The learner's model: the actor's base (same spec and seed) with a trained-looking adapter."""
    model = apply_lora(build_policy("rlfleet:tiny-qwen2", **TINY)[0], LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def test_llm_full_push_keeps_the_embedding_tied_and_the_logits_equal(plain_actor) -> None:
    learner, _ = build_policy("rlfleet:tiny-qwen2", **(TINY | {"seed": 7}))
    with _collector(plain_actor) as collector:
        version = collector.update_policy_weights_(learner)[0]
        got_version, weights = actor_weights(collector)
    model = _actor_model(plain_actor)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, learner(IDS).logits)
    assert got_version == version
    assert_bit_identical(weights, {k: v.clone() for k, v in learner.state_dict().items()})


def test_lora_adapter_push_carries_only_the_adapter_and_equals_a_full_push(lora_actor) -> None:
    learner = _peft_learner(1)
    adapter = {n for n, p in learner.named_parameters() if p.requires_grad}
    blob = encode_weights(learner, only_trainable=True)
    adapter_bytes = sum(p.numel() * 4 for n, p in learner.named_parameters() if n in adapter)
    assert len(blob) - (8 + int.from_bytes(blob[:8], "little")) == adapter_bytes
    with _collector(lora_actor) as collector:
        before = collector.policy_version
        assert collector.update_policy_weights_(learner, only_trainable=True)[0] == before + 1
        _, via_adapter = actor_weights(collector)
        collector.update_policy_weights_({k: v.clone() for k, v in learner.state_dict().items()})
        _, via_full = actor_weights(collector)
    assert_bit_identical(via_adapter, via_full)
    assert_bit_identical(via_adapter, {k: v.clone() for k, v in learner.state_dict().items()})
    with torch.no_grad():
        assert torch.equal(
            _actor_model(lora_actor)(input_ids=IDS).logits, learner(input_ids=IDS).logits
        )


def test_lora_push_to_an_actor_without_lora_is_refused(plain_actor) -> None:
    with _collector(plain_actor) as collector:
        version, weights = actor_weights(collector)
        with pytest.raises(WeightPushError) as info:
            collector.update_policy_weights_(_peft_learner(2), only_trainable=True)
        error = info.value.failed[0]
        assert isinstance(error, WeightsError)  # INVALID_ARGUMENT
        assert "start the actor with --lora" in str(error)
        assert "lora_A" in str(error)
        got_version, after = actor_weights(collector)
    assert got_version == version
    assert_bit_identical(after, weights)
    assert serving(plain_actor.port)


@pytest.mark.parametrize(
    ("lora", "declared"),
    [
        ("r=4,targets=q_proj,v_proj,alpha=16", "r=4, alpha=16"),
        ("r=8,targets=q_proj,v_proj", "r=8, alpha=8"),
    ],
    ids=["another-alpha", "another-r"],
)
@pytest.mark.parametrize("only_trainable", [True, False], ids=["adapter", "whole"])
def test_an_adapter_of_another_scale_or_rank_is_refused_and_nothing_changes(
    lora_actor, lora, declared, only_trainable
) -> None:
    """The push declares its adapter and the actor (r=4, alpha=4) refuses another one whole,
    naming both adapters and the fix, its weights and version kept. Another ``alpha`` has
    the same shapes (the actor would generate with another function than the learner
    trains: the scale alpha / r is no tensor); another ``r`` changes every adapter tensor's
    shape, and the refusal still names the adapters, not a list of shape mismatches."""
    learner = apply_lora(build_policy("rlfleet:tiny-qwen2", **TINY)[0], lora)
    with _collector(lora_actor) as collector:
        version, weights = actor_weights(collector)
        with pytest.raises(WeightPushError) as info:
            collector.update_policy_weights_(learner, only_trainable=only_trainable)
        error = info.value.failed[0]
        assert isinstance(error, WeightsError)  # INVALID_ARGUMENT
        assert f"{declared}; this actor's is r=4, alpha=4" in str(error)
        assert "apply_lora" in str(error)
        got_version, after = actor_weights(collector)
    assert got_version == version
    assert_bit_identical(after, weights)
    assert serving(lora_actor.port)


def test_plain_full_push_to_a_lora_actor_is_refused_with_a_hint(lora_actor) -> None:
    plain, _ = build_policy("rlfleet:tiny-qwen2", **TINY)
    with _collector(lora_actor) as collector:
        version = collector.policy_version
        with pytest.raises(WeightPushError, match="holds a LoRA adapter"):
            collector.update_policy_weights_(plain)
        assert actor_weights(collector)[0] == version
    assert serving(lora_actor.port)


def test_adapter_of_a_half_billion_parameter_shape_is_well_under_one_percent() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):  # shapes only
        model = apply_lora(Qwen2ForCausalLM(config), "r=16,targets=q_proj,v_proj")
    adapter = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert adapter / total < 0.005  # 1.08M of 495M parameters: 0.22%


def test_lora_actor_generates_with_the_pushed_adapter(lora_actor) -> None:
    learner = _peft_learner(3)
    with GrpcLLMCollector(
        [f"127.0.0.1:{lora_actor.port}"],
        dialog_turns_per_batch=2,
        total_dialog_turns=2,
        sync=True,
        track_policy_version=True,
        generation={"max_new_tokens": 2},
    ) as collector:
        version = collector.update_policy_weights_(learner, only_trainable=True)[0]
        batches = list(collector)
    assert len(batches) == 1
    assert bool((batches[0]["policy_version"] == version).all())


@pytest.mark.slow
def test_lora_flag_through_the_command_line_takes_adapter_pushes() -> None:
    from learner_client import LocalFleet

    learner = _peft_learner(4)
    with (
        LocalFleet(
            1,
            kind="llm",
            policy_kwargs=TINY,
            num_envs=2,
            seed=0,
            extra_args=["--lora", str(LORA)],
        ) as fleet,
        GrpcLLMCollector(fleet.addresses, dialog_turns_per_batch=2) as collector,
    ):
        collector.update_policy_weights_(learner, only_trainable=True)
        _, weights = actor_weights(collector)
    assert_bit_identical(weights, {k: v.clone() for k, v in learner.state_dict().items()})


def test_llm_parts_from_two_ranks_apply_whole_and_keep_the_tie_across_parts(plain_actor) -> None:
    learner, _ = build_policy("rlfleet:tiny-qwen2", **(TINY | {"seed": 9}))
    state = {k: v.clone() for k, v in learner.state_dict().items()}
    keys = sorted(state)  # lm_head.weight lands in part 0, the embedding it ties in part 1
    shards = [{k: state[k] for k in keys[r::2]} for r in (0, 1)]
    with _collector(plain_actor) as rank0, _collector(plain_actor) as rank1:
        version = max(rank0.update_policy_weights_(shards[0] | shards[1]).values()) + 1
        bad = dict(shards[0])  # a head that no longer equals the embedding it is tied to
        bad["lm_head.weight"] = bad["lm_head.weight"] + 1
        rank0.update_policy_weights_(bad, version=version, part=(0, 2))
        with pytest.raises(WeightPushError, match="ties") as error:
            rank1.update_policy_weights_(shards[1], version=version, part=(1, 2))
        assert isinstance(error.value.failed[0], WeightsError)
        assert actor_weights(rank0)[0] == version - 1  # nothing of the broken version
        rank0.update_policy_weights_(shards[0], version=version + 1, part=(0, 2))
        rank1.update_policy_weights_(shards[1], version=version + 1, part=(1, 2))
        got_version, weights = actor_weights(rank0)
    model = _actor_model(plain_actor)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, learner(IDS).logits)
    assert got_version == version + 1
    assert_bit_identical(weights, state)
