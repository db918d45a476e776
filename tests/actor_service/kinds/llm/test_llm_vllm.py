"""An LLM actor whose engine is vLLM, served in-process: tokens, log-probs, pushes, refusals.

One actor (one vLLM engine start, the costly part) serves the whole module; every test
pushes the weights it compares against first, so the order of tests does not matter. No
other engine may run in this process meanwhile: vLLM's engines share its process-global
state (shutting one down breaks the others), so an actor holds exactly one.
Run by ``make test-vllm`` (in ``.venv-vllm``); skipped where vLLM is not installed.
"""

from __future__ import annotations

import os

import grpc
import pytest
import torch
from actor_harness import RawCollect, open_request, small_config
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actor_service import ModelSpec, create_server
from actor_service._kinds.llm.settings import LLMActorSettings
from common.llm import (
    GenerationSettings,
    LoraSpec,
    build_policy,
    cached_forward,
    check_padded,
    generate,
    response_distributions,
    response_log_probs,
)
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import encode_weights, iter_blob_chunks, sha256_hex

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.usefixtures("loopback_only"),
    # vLLM's import and start warn through torch and its own modules; not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]

#: Head size 64: vLLM's CPU attention takes 32, 64, 80, ... (not the default tiny model's 16).
TINY = {"hidden": 128, "heads": 2, "layers": 2, "dtype": "float32"}
SLOTS = 4


class VLLMActor:
    """The module's actor: its stub, channel, core, and the version it holds."""

    def __init__(self, lora: LoraSpec | None = None) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        config = small_config(
            kind="llm",
            llm=LLMActorSettings(engine="vllm", task="arith", max_new_tokens_cap=32, lora=lora),
            models=(ModelSpec("policy", "rlfleet:tiny-qwen2", {**TINY, "seed": 0}),),
            num_envs=SLOTS,
        )
        self.handle = create_server(config).run_in_thread()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.handle.port}")
        self.stub = pb_grpc.ActorServiceStub(self.channel)
        self.version = 0

    @property
    def worker(self):
        return self.handle.server.runtime.core

    def push(self, state, **options):
        """A raw push of ``state`` (``encode_weights`` options) at the next version."""
        blob = encode_weights(state, **options)
        header = pb.WeightsHeader(
            model_id="policy",
            version=self.version + 1,
            total_bytes=len(blob),
            sha256=sha256_hex(blob),
        )
        requests = [pb.PushWeightsRequest(header=header)]
        requests += [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob)]
        reply = self.stub.PushWeights(iter(requests), timeout=120)
        self.version = reply.version
        return reply

    def batch(self, generation, *, frames=SLOTS, **llm):
        """One steps-mode batch with ``generation`` settings."""
        settings = pb.LLMSettings(generation=pb.GenerationSettings(**generation), **llm)
        session = RawCollect.open(
            self.stub, open_request(frames_per_batch=frames, credits=1, llm=settings)
        )
        session.opened()
        _, td = session.batch()
        session.cancel()
        check_padded(td)
        return td.reshape(-1)


@pytest.fixture(scope="module")
def vllm_actor():
    actor = VLLMActor()
    yield actor
    actor.channel.close()
    actor.handle.stop(grace=1.0)


def _model(seed: int):
    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": seed})
    return model


def _loop_greedy(model, td) -> list[list[int]]:
    """What our own decode loop answers, greedily, to every prompt of ``td``."""
    out = []
    for row in range(td.shape[0]):
        prompt = td["tokens"][row, : int(td["prompt_len"][row])].tolist()
        result = generate(
            lambda i, m, p, past: (*cached_forward(model, i, m, p, past), 0),
            [prompt],
            GenerationSettings(max_new_tokens=8, temperature=0.0),
            budgets=[8],
            stop_ids=[int(model.config.eos_token_id)],
            pad_id=0,
        )
        out.append(result.tokens[0, : int(result.lengths[0])].tolist())
    return out


def _responses(td) -> list[list[int]]:
    return [
        td["tokens"][row, int(p) : int(p) + int(r)].tolist()
        for row, (p, r) in enumerate(zip(td["prompt_len"], td["response_len"], strict=True))
    ]


GREEDY = {"max_new_tokens": 8, "temperature": 0.0}


def _assert_serves(actor: VLLMActor, model) -> None:
    """The actor's greedy responses are our loop's under ``model``, at the actor's version."""
    td = actor.batch(GREEDY)
    assert (td["policy_version"] == actor.version).all()
    assert _responses(td) == _loop_greedy(model, td)


def test_describe_reports_an_llm_actor_on_the_vllm_engine(vllm_actor) -> None:
    reply = vllm_actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert (reply.kind, reply.env_backend, reply.policy) == ("llm", "vllm", "rlfleet:tiny-qwen2")
    assert (reply.num_envs, reply.max_new_tokens_cap) == (SLOTS, 32)
    names = {p.name for p in reply.models[0].parameters}
    assert {"model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight"} <= names


def test_greedy_tokens_and_log_probs_equal_our_decode_loop(vllm_actor) -> None:
    model = _model(0)
    vllm_actor.push(model.state_dict())
    td = vllm_actor.batch(GREEDY, frames=2 * SLOTS)
    assert _responses(td) == _loop_greedy(model, td)
    with torch.no_grad():
        recomputed = response_log_probs(
            model, td["tokens"], td["prompt_len"], td["response_len"], GenerationSettings(**GREEDY)
        )
        chosen = response_distributions(
            model, td["tokens"], td["prompt_len"], td["response_len"], GenerationSettings(**GREEDY)
        ).argmax(-1)
    span = recomputed.shape[1]
    torch.testing.assert_close(td["log_probs"][:, :span], recomputed, atol=1e-4, rtol=0)
    for row, response in enumerate(_responses(td)):
        assert chosen[row, : len(response)].tolist() == response


@pytest.mark.parametrize(
    "generation",
    [
        {"max_new_tokens": 8, "temperature": 0.7},
        {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.9},
        {"max_new_tokens": 8, "temperature": 1.3, "top_k": 20},
    ],
    ids=["temperature", "top_p", "top_k"],
)
def test_sampled_log_probs_are_those_a_learner_pass_recomputes(vllm_actor, generation) -> None:
    model = _model(0)
    vllm_actor.push(model.state_dict())
    td = vllm_actor.batch(generation, frames=2 * SLOTS)
    settings = GenerationSettings(**generation)
    with torch.no_grad():
        recomputed = response_log_probs(
            model, td["tokens"], td["prompt_len"], td["response_len"], settings
        )
    span = recomputed.shape[1]
    assert span > 0
    torch.testing.assert_close(td["log_probs"][:, :span], recomputed, atol=1e-4, rtol=0)


def test_full_and_bf16_pushes_are_served(vllm_actor) -> None:
    model = _model(1)
    assert vllm_actor.push(model.state_dict()).version == vllm_actor.version
    _assert_serves(vllm_actor, model)
    model = _model(2)
    vllm_actor.push(model.state_dict(), dtype=torch.bfloat16)
    _assert_serves(vllm_actor, model.to(torch.bfloat16).to(torch.float32))


def test_a_delta_push_is_served(vllm_actor) -> None:
    from learner_client import GrpcLLMCollector

    model = _model(3)
    address = f"127.0.0.1:{vllm_actor.handle.port}"
    with GrpcLLMCollector([address], dialog_turns_per_batch=SLOTS, total_dialog_turns=-1) as c:
        c.update_policy_weights_(model, delta=True)  # the first push of a delta tracker: full
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight[:, :5] *= -2.0
            model.model.norm.weight[3] += 1.0
        versions = c.update_policy_weights_(model, delta=True)
        assert c.stats()["delta_pushes"] >= 1
    vllm_actor.version = max(versions.values())
    _assert_serves(vllm_actor, model)


def test_a_refused_push_leaves_the_old_weights_serving(vllm_actor) -> None:
    model = _model(4)
    vllm_actor.push(model.state_dict())
    bad = dict(_model(5).state_dict())
    bad["model.norm.weight"] = torch.full_like(bad["model.norm.weight"], float("nan"))
    with pytest.raises(grpc.RpcError) as info:
        vllm_actor.push(bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _assert_serves(vllm_actor, model)


def test_an_engine_that_does_not_take_a_push_is_caught_and_the_old_weights_serve(
    vllm_actor,
) -> None:
    from actor_service._kinds.llm.vllm_worker import verify_loaded

    model = _model(6)
    vllm_actor.push(model.state_dict())
    engine = vllm_actor.worker.models.engine

    def no_op(weights, columns):  # vLLM "reloads" and changes nothing: the field's worst bug
        return engine._llm.collective_rpc(verify_loaded, args=(weights, engine.packed, columns))[0]

    engine.reload = no_op
    try:
        with pytest.raises(grpc.RpcError) as info:
            vllm_actor.push(_model(7).state_dict())
    finally:
        del engine.reload
    assert info.value.code() == grpc.StatusCode.INTERNAL
    _assert_serves(vllm_actor, model)


def test_settings_vllm_refuses_are_invalid_argument_and_the_actor_stays_serving(
    vllm_actor,
) -> None:
    settings = pb.LLMSettings(generation=pb.GenerationSettings(max_new_tokens=4, temperature=2.5))
    session = RawCollect.open(
        vllm_actor.stub, open_request(frames_per_batch=SLOTS, credits=1, llm=settings)
    )
    error = session.error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "vLLM refuses" in error.details()
    assert "temperature" in error.details()
    health = health_pb2_grpc.HealthStub(vllm_actor.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    vllm_actor.batch({"max_new_tokens": 2})


def test_a_push_during_a_turn_shows_in_the_token_versions(vllm_actor) -> None:
    old, new = _model(8), _model(9)
    vllm_actor.push(old.state_dict())
    start = vllm_actor.version
    models = vllm_actor.worker.models
    inner, calls = models._locked, []

    def locked(call):  # runs between scheduler steps, outside the model lock
        if getattr(call, "__name__", "") == "step":
            calls.append(1)
            if len(calls) == 5:  # 4 steps (4 tokens per request), then the push
                models.load_weights("policy", start + 1, new.state_dict())
        return inner(call)

    models._locked = locked
    try:
        td = vllm_actor.batch({"max_new_tokens": 16, "temperature": 0.0}, token_versions=True)
    finally:
        del models._locked
    vllm_actor.version = start + 1
    lengths = td["response_len"].tolist()
    assert max(lengths) > 5, "every response stopped before the push"
    for row, length in enumerate(lengths):
        seen = td["collector", "token_policy_version"][row, :length].tolist()
        assert seen == [start] * min(length, 4) + [start + 1] * max(length - 4, 0)
    assert (td["policy_version"] == start).all()


def test_a_restored_state_is_what_vllm_serves(vllm_actor) -> None:
    model = _model(10)
    vllm_actor.push(model.state_dict())
    state = vllm_actor.worker.state_dict()
    vllm_actor.push(_model(11).state_dict())
    vllm_actor.worker.load_state_dict(state, allow_rollback=True)
    vllm_actor.version = state["models"]["policy"]["version"]
    _assert_serves(vllm_actor, model)
