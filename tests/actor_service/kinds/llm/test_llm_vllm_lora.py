"""A vLLM-engine LLM actor with a LoRA adapter (``--lora``): tokens, adapter pushes, refusals.

The actor holds the decode loop's peft model as its host copy and serves it from vLLM
(the base model, plus one adapter replaced in place by every push that touches it). Each
test compares what vLLM serves with what our decode loop computes under the same peft
model. One actor serves the module (vLLM engines share process-wide state: this module's
starts after ``test_llm_vllm``'s is shut down); every test pushes what it compares against
first, so their order does not matter.
"""

from __future__ import annotations

import grpc
import pytest
import torch
from test_llm_vllm import GREEDY, SLOTS, TINY, VLLMActor, _loop_greedy, _responses

from common.llm import (
    GenerationSettings,
    LoraSpec,
    apply_lora,
    build_policy,
    cached_forward,
    generate,
    response_log_probs,
)
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import PushForm

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.usefixtures("loopback_only"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]

LORA = LoraSpec(r=4, targets=("q_proj", "v_proj"), alpha=8)


@pytest.fixture(scope="module")
def lora_actor():
    pytest.importorskip("peft")
    actor = VLLMActor(lora=LORA)
    yield actor
    actor.channel.close()
    actor.handle.stop(grace=1.0)


def _learner(seed: int, *, base_seed: int = 0):
    """The learner's peft model: the actor's base with a trained-looking adapter."""
    model = apply_lora(build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": base_seed})[0], LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval()


def _adapter(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".lora_" in k}


def _assert_serves(actor: VLLMActor, model) -> None:
    td = actor.batch(GREEDY)
    assert (td["policy_version"] == actor.version).all()
    assert _responses(td) == _loop_greedy(model, td)


def test_describe_lists_the_peft_models_keys_as_with_our_loop(lora_actor) -> None:
    from actor_service._kinds.llm.models import LLMModels

    reply = lora_actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    got = {p.name: tuple(p.shape) for p in reply.models[0].parameters}
    ours = LLMModels("rlfleet:tiny-qwen2", {**TINY, "seed": 0}, torch.device("cpu"), LORA)
    assert got == {k: shape for k, (shape, _) in ours._slot.parameters_info.items()}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in got


def test_vllm_serves_the_host_copys_adapter_bit_for_bit(lora_actor) -> None:
    models = lora_actor.worker.models
    with models._slot.lock:
        held = {k: v.clone() for k, v in models._slot.reference.items() if ".lora_" in k}
        expected = models._adapter._expected(held)
        assert expected
        assert models.engine.read_adapter(expected) == []
        key = next(k for k in held if "lora_A" in k)
        held[key] = held[key] + 1.0  # the read-back sees a difference
        assert models.engine.read_adapter(models._adapter._expected(held)) != []


def test_greedy_tokens_with_the_adapter_equal_our_decode_loop(lora_actor) -> None:
    learner = _learner(1)
    lora_actor.push(learner.state_dict())  # a full push: base and adapter
    td = lora_actor.batch(GREEDY, frames=2 * SLOTS)
    assert _responses(td) == _loop_greedy(learner, td)
    with torch.no_grad():
        recomputed = response_log_probs(
            learner,
            td["tokens"],
            td["prompt_len"],
            td["response_len"],
            GenerationSettings(**GREEDY),
        )
    span = recomputed.shape[1]
    torch.testing.assert_close(td["log_probs"][:, :span], recomputed, atol=1e-4, rtol=0)
    with learner.disable_adapter():  # the adapter matters: without it, other tokens
        assert _responses(td) != _loop_greedy(learner, td)


def test_an_adapter_push_changes_the_served_tokens_to_our_loops(lora_actor) -> None:
    before = _learner(2)
    lora_actor.push(before.state_dict())
    after = _learner(3)
    reply = lora_actor.push(after, only_trainable=True)  # the adapter alone
    assert reply.version == lora_actor.version
    _assert_serves(lora_actor, after)
    models = lora_actor.worker.models
    held = {k: v for k, v in models._slot.reference.items() if ".lora_" in k}
    torch.testing.assert_close(held, _adapter(after), atol=0, rtol=0)


def _refused(actor: VLLMActor, state, code: grpc.StatusCode, **options) -> str:
    version = actor.version
    with pytest.raises(grpc.RpcError) as info:
        actor.push(state, **options)
    assert info.value.code() == code, info.value.details()
    assert actor.version == version
    return info.value.details()


def test_a_bad_adapter_push_is_refused_and_the_old_adapter_serves(lora_actor) -> None:
    serving = _learner(4)
    lora_actor.push(serving.state_dict())
    bad = _adapter(_learner(5))
    key = next(k for k in bad if "lora_A" in k)
    bad[key] = torch.zeros(LORA.r + 1, bad[key].shape[1])
    details = _refused(lora_actor, bad, grpc.StatusCode.INVALID_ARGUMENT, subset=True)
    assert "shape mismatch" in details
    assert key in details
    unknown = {**_adapter(_learner(5)), "base_model.model.x.lora_A.default.weight": torch.ones(1)}
    _refused(lora_actor, unknown, grpc.StatusCode.INVALID_ARGUMENT, subset=True)
    _assert_serves(lora_actor, serving)


def _first_load_instead(engine, first):
    """vLLM's adapter loader, with its first call replaced by ``first``."""
    load, calls = engine.load_adapter, []

    def load_adapter(path):
        calls.append(path)
        return first(path) if len(calls) == 1 else load(path)

    return load_adapter


def test_an_adapter_vllm_refuses_or_does_not_serve_leaves_the_old_one(lora_actor) -> None:
    serving = _learner(6)
    lora_actor.push(serving.state_dict())
    engine = lora_actor.worker.models.engine

    def refuses(path):
        raise RuntimeError("simulated load failure")

    engine.load_adapter = _first_load_instead(engine, refuses)
    try:  # then the old adapter is reloaded, by the real loader
        details = _refused(lora_actor, _learner(7), grpc.StatusCode.INVALID_ARGUMENT)
    finally:
        del engine.load_adapter
    assert "simulated load failure" in details
    engine.load_adapter = _first_load_instead(engine, lambda path: None)
    try:  # vLLM "loads" and serves the old adapter still: the field's silent no-op
        details = _refused(lora_actor, _learner(8), grpc.StatusCode.INTERNAL, only_trainable=True)
    finally:
        del engine.load_adapter
    assert "did not serve the pushed LoRA adapter" in details
    _assert_serves(lora_actor, serving)


def test_a_full_push_whose_base_vllm_refuses_puts_the_old_adapter_back(lora_actor) -> None:
    serving = _learner(15)
    lora_actor.push(serving.state_dict())
    engine = lora_actor.worker.models.engine
    reload, calls = engine.reload, []

    def refuses_once(weights, columns):  # after the new adapter went in
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated base load failure")
        return reload(weights, columns)

    engine.reload = refuses_once
    try:
        details = _refused(
            lora_actor, _learner(16, base_seed=1).state_dict(), grpc.StatusCode.INVALID_ARGUMENT
        )
    finally:
        del engine.reload
    assert "simulated base load failure" in details
    _assert_serves(lora_actor, serving)


def test_a_plain_models_push_is_refused_with_the_lora_hint(lora_actor) -> None:
    serving = _learner(9)
    lora_actor.push(serving.state_dict())
    plain, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 0})
    details = _refused(lora_actor, plain.state_dict(), grpc.StatusCode.INVALID_ARGUMENT)
    assert "holds a LoRA adapter" in details
    _assert_serves(lora_actor, serving)


def _loop_with_push_after(old, new, td, tokens: int) -> list[list[int]]:
    """Our decode loop's greedy answers when the adapter changes after ``tokens`` tokens."""
    out = []
    for row in range(td.shape[0]):
        calls: list[int] = []

        def forward(i, m, p, past, calls=calls):
            calls.append(1)
            return (*cached_forward(old if len(calls) <= tokens else new, i, m, p, past), 0)

        prompt = td["tokens"][row, : int(td["prompt_len"][row])].tolist()
        result = generate(
            forward,
            [prompt],
            GenerationSettings(max_new_tokens=16, temperature=0.0),
            budgets=[16],
            stop_ids=[int(old.config.eos_token_id)],
            pad_id=0,
        )
        out.append(result.tokens[0, : int(result.lengths[0])].tolist())
    return out


def test_an_adapter_push_during_a_turn_continues_on_the_new_adapter(lora_actor) -> None:
    old, new = _learner(10), _learner(11)
    lora_actor.push(old.state_dict())
    start = lora_actor.version
    models = lora_actor.worker.models
    inner, calls = models._locked, []

    def locked(call):  # runs between scheduler steps, outside the model lock
        if getattr(call, "__name__", "") == "step":
            calls.append(1)
            if len(calls) == 5:  # 4 steps (4 tokens per request), then the push
                models.load_weights("policy", start + 1, _adapter(new), PushForm(subset=True))
        return inner(call)

    models._locked = locked
    try:
        td = lora_actor.batch({"max_new_tokens": 16, "temperature": 0.0}, token_versions=True)
    finally:
        del models._locked
    lora_actor.version = start + 1
    lengths = td["response_len"].tolist()
    assert max(lengths) > 5, "every response stopped before the push"
    for row, length in enumerate(lengths):
        seen = td["collector", "token_policy_version"][row, :length].tolist()
        assert seen == [start] * min(length, 4) + [start + 1] * max(length - 4, 0)
    old_copy = _learner(10)  # our loop's reference: same KV cache across the swap
    assert _responses(td) == _loop_with_push_after(old_copy, new, td, 4)


def test_a_restored_state_puts_its_adapter_back_into_vllm(lora_actor) -> None:
    model = _learner(12)
    lora_actor.push(model.state_dict())
    state = lora_actor.worker.state_dict()
    lora_actor.push(_learner(13), only_trainable=True)
    lora_actor.worker.load_state_dict(state, allow_rollback=True)
    lora_actor.version = state["models"]["policy"]["version"]
    _assert_serves(lora_actor, model)


def test_a_delta_push_to_the_adapter_is_served(lora_actor) -> None:
    from learner_client import GrpcLLMCollector

    learner = _learner(14)
    address = f"127.0.0.1:{lora_actor.handle.port}"
    with GrpcLLMCollector([address], dialog_turns_per_batch=SLOTS, total_dialog_turns=-1) as c:
        c.update_policy_weights_(learner, delta=True)  # the first push of a delta tracker: full
        with torch.no_grad():
            layer = learner.base_model.model.model.layers[1].self_attn
            layer.v_proj.lora_B.default.weight[:5] *= -3.0
        versions = c.update_policy_weights_(learner, delta=True)
        assert c.stats()["delta_pushes"] >= 1
    lora_actor.version = max(versions.values())
    td = lora_actor.batch(GREEDY)
    assert (td["policy_version"] == lora_actor.version).all()
    assert _responses(td) == _loop_greedy(learner, td)
    assert _responses(td) != _loop_greedy(_learner(14), td)  # the delta changed the tokens
