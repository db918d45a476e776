"""The LLM actor served in-process: Describe, Collect in the three modes, bad settings, pushes."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
import torch
from actor_harness import RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actor_service import ModelSpec
from actor_service._kinds.llm.settings import LLMActorSettings
from common.llm import build_policy, check_padded, to_torchrl
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import encode_weights, iter_blob_chunks, sha256_hex

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 1, "seed": 0}


@pytest.fixture
def llm_actor(make_actor):
    return make_actor(
        kind="llm",
        llm=LLMActorSettings(task="arith", task_kwargs={"retries": 1}, max_new_tokens_cap=32),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
        num_envs=4,
    )


def _llm(**kw) -> pb.LLMSettings:
    generation = kw.pop("generation", {"max_new_tokens": 3})
    return pb.LLMSettings(generation=pb.GenerationSettings(**generation), **kw)


def test_describe_reports_an_llm_actor(llm_actor) -> None:
    reply = llm_actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert (reply.kind, reply.policy, reply.env_id, reply.num_envs) == (
        "llm", "rlfleet:tiny-qwen2", "arith", 4,
    )  # fmt: skip
    assert reply.max_new_tokens_cap == 32
    assert not reply.HasField("observation_spec")
    names = {p.name for p in reply.models[0].parameters}
    assert "model.embed_tokens.weight" in names


def test_collect_steps_mode_batches_check_and_score(llm_actor) -> None:
    session = RawCollect.open(
        llm_actor.stub, open_request(frames_per_batch=8, credits=2, llm=_llm(group_size=2))
    )
    session.opened()
    info, td = session.batch()
    check_padded(td)
    assert td.batch_size == (4, 2)
    assert info.frames == 8
    _, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    for b in range(4):
        for t in range(2):
            p, r = int(td["prompt_len"][b, t]), int(td["response_len"][b, t])
            assert tok.decode(td["tokens"][b, t, :p]) == td["text", "prompt"][b][t]
            assert 1 <= r <= 3
            content = td["history", "content"][b][t][int(td["history", "length"][b, t]) - 1]
            assert tok.decode(td["tokens"][b, t, p : p + r], skip_special_tokens=True).startswith(
                content
            )
            query = td["query"][b][t]
            want = float(content.strip() == str(eval(query[:-1]) % 10))
            assert float(td["next", "reward"][b, t]) == want
    groups = td["collector", "group_id"][:, 0]
    assert groups[0] == groups[1]
    assert groups[2] == groups[3]
    assert groups[0] != groups[2]
    session.cancel()


def test_a_turns_next_prompt_is_the_next_turns_prompt_with_the_tasks_reply(llm_actor) -> None:
    """TorchRL's ChatEnv: ``next.history.prompt`` of turn t is ``history.prompt`` of t + 1."""
    session = RawCollect.open(
        llm_actor.stub, open_request(frames_per_batch=8, credits=1, llm=_llm())
    )
    session.opened()
    _, td = session.batch()
    session.cancel()
    check_padded(td)
    out = to_torchrl(td)
    followed = 0
    for b in range(4):
        step, after = out[b, 0], out[b, 1]
        if bool(step["next", "done"]) or int(step["collector", "traj_ids"]) != int(
            after["collector", "traj_ids"]
        ):
            continue
        following = list(step["next", "history", "prompt", "content"])
        assert following == list(after["history", "prompt", "content"])
        assert following[-1] == "No. Try again."  # the task's reply to a wrong answer
        assert list(step["history", "full", "content"]) == following[:-1]
        followed += 1
    assert followed, "no dialog went on to a second turn: the tiny model answered right"


@pytest.mark.parametrize("mode", ["yield_completed_trajectories", "yield_only_last_steps"])
def test_collect_trajectory_modes_yield_whole_groups(llm_actor, mode) -> None:
    session = RawCollect.open(
        llm_actor.stub,
        open_request(frames_per_batch=4, credits=1, llm=_llm(group_size=2, **{mode: True})),
    )
    session.opened()
    info, td = session.batch()
    check_padded(td)
    assert td.ndim == 1
    done = td["next", "done"].squeeze(-1)
    turns = td["collector", "dialog_turns"]
    if mode == "yield_only_last_steps":
        assert done.all()
        assert info.frames == int(turns.sum())  # dropped turns still count
    else:
        assert info.frames == td.numel() >= 4
        assert int(done.sum()) == len(set(td["collector", "traj_ids"].tolist()))
    groups = td["collector", "group_id"][done].tolist()
    assert all(groups.count(g) == 2 for g in groups)
    session.cancel()


@pytest.mark.parametrize(
    "llm",
    [
        {"generation": {"max_new_tokens": 0}},
        {"generation": {"max_new_tokens": 33}},
        {"generation": {"temperature": -1.0}},
        {"generation": {"temperature": 1e-300}},  # gave NaN log-probs in every batch
        {"frames_per_batch": 2**64 - 2},  # grew the actor's memory without bound
        {"frames_per_batch": 2**64 - 1, "yield_completed_trajectories": True},
        {"generation": {"top_p": 0.0}},
        {"generation": {"top_p": 1.01}},
        {"generation": {"stop_token_ids": [10**6]}},
        {"group_size": 3},
        # env collection's knobs, which an LLM actor used to ignore silently
        {"settings": {"max_frames_per_traj": 3}},
        {"settings": {"split_trajs": True, "init_random_frames": 10}},
        {"settings": {"set_truncated": True}},
        {"settings": {"cudagraph_policy": True}},
    ],
)
def test_collect_raises_invalid_argument_on_bad_settings_and_stays_serving(llm_actor, llm) -> None:
    frames = llm.pop("frames_per_batch", 4)
    settings = llm.pop("settings", {})
    session = RawCollect.open(
        llm_actor.stub,
        open_request(frames_per_batch=frames, credits=1, llm=_llm(**llm), **settings),
    )
    error = session.error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    health = health_pb2_grpc.HealthStub(llm_actor.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    good = RawCollect.open(llm_actor.stub, open_request(frames_per_batch=4, credits=1, llm=_llm()))
    good.opened()
    check_padded(good.batch()[1])
    good.cancel()


def test_collect_without_llm_settings_is_refused(llm_actor) -> None:
    error = RawCollect.open(llm_actor.stub, open_request(frames_per_batch=4, credits=1)).error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "LLM settings" in error.details()


def test_env_actor_refuses_llm_settings(actor) -> None:
    error = RawCollect.open(
        actor.stub, open_request(frames_per_batch=4, credits=1, llm=_llm())
    ).error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--kind llm" in error.details()


def _push(actor, state, version):
    blob = encode_weights(state)
    header = pb.WeightsHeader(
        model_id="policy", version=version, total_bytes=len(blob), sha256=sha256_hex(blob)
    )
    requests = [pb.PushWeightsRequest(header=header)]
    requests += [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob)]
    return actor.stub.PushWeights(iter(requests), timeout=30)


def test_pushed_weights_change_greedy_tokens_and_versions(llm_actor) -> None:
    greedy = _llm(generation={"max_new_tokens": 4, "temperature": 0.0})
    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 1})
    assert _push(llm_actor, model.state_dict(), 3).version == 3
    session = RawCollect.open(
        llm_actor.stub, open_request(frames_per_batch=4, credits=1, llm=greedy)
    )
    session.opened()
    _, td = session.batch()
    assert (td["policy_version"] == 3).all()
    # the responses are the pushed model's greedy tokens
    p, r = int(td["prompt_len"][0, 0]), int(td["response_len"][0, 0])
    prompt = td["tokens"][0, 0, :p]
    ref = model.generate(prompt[None], max_new_tokens=4, do_sample=False)[0, p:]
    assert td["tokens"][0, 0, p : p + r].tolist() == ref[:r].tolist()
    session.cancel()
    bad = dict(model.state_dict())
    bad["model.norm.weight"] = torch.full_like(bad["model.norm.weight"], float("nan"))
    with pytest.raises(grpc.RpcError) as info:
        _push(llm_actor, bad, 4)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--policy", "rlfleet:nope"], "unknown model spec"),
        (["--policy", "hf:/no/such/dir"], "no such checkpoint directory"),
        (["--task", "arith", "--task-kwargs", '{"digits": 0}'], "digits"),
        (["--task", "no_such_module_x:make"], "no module named"),
    ],
)
def test_cli_exits_2_before_binding_on_bad_llm_flags(args, message) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "actor_service", "--kind", "llm", "--port", "0", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert message in out.stderr
    assert "ready" not in out.stdout


def test_cli_reads_llm_settings_from_env_vars() -> None:
    from actor_service import parse_config

    config = parse_config(
        [], {"RLFLEET_KIND": "llm", "RLFLEET_TASK": "reverse", "RLFLEET_NUM_ENVS": "6",
             "RLFLEET_POLICY": "rlfleet:tiny-gpt2", "RLFLEET_POLICY_KWARGS": '{"hidden": 32}'},
    )  # fmt: skip
    assert (config.kind, config.task, config.num_envs) == ("llm", "reverse", 6)
    assert config.models[0].factory == "rlfleet:tiny-gpt2"
    assert config.models[0].kwargs == {"hidden": 32}


@pytest.mark.parametrize(
    "generation",
    [
        {"max_new_tokens": 5, "temperature": 0.0},
        {"max_new_tokens": 5, "temperature": 0.7},
        {"max_new_tokens": 5, "temperature": 1.0, "top_p": 0.9},
    ],
    ids=["greedy", "temperature", "top_p"],
)
def test_a_learner_forward_pass_reproduces_the_batch_log_probs(llm_actor, generation) -> None:
    from common.llm import GenerationSettings, response_log_probs

    session = RawCollect.open(
        llm_actor.stub,
        open_request(frames_per_batch=8, credits=1, llm=_llm(generation=generation)),
    )
    session.opened()
    _, td = session.batch()
    session.cancel()
    model, _ = build_policy("rlfleet:tiny-qwen2", **TINY)  # the generating weights
    flat = td.reshape(-1)
    with torch.no_grad():
        recomputed = response_log_probs(
            model,
            flat["tokens"],
            flat["prompt_len"],
            flat["response_len"],
            GenerationSettings(**generation),
        )
    span = recomputed.shape[1]
    assert span > 0
    torch.testing.assert_close(recomputed, flat["log_probs"][:, :span], atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_static_cache_actor_serves_the_growing_cache_actors_batches(
    make_actor, temperature: float
) -> None:
    """``--decode static``: same seed, same model, same batches as the default decode."""
    batches = []
    for decode in ("eager", "static"):
        actor = make_actor(
            kind="llm",
            llm=LLMActorSettings(
                task="arith", task_kwargs={"retries": 1}, max_new_tokens_cap=32, decode=decode
            ),
            models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
            num_envs=4,
            seed=3,
        )
        generation = {"max_new_tokens": 6, "temperature": temperature}
        llm = _llm(group_size=2, generation=generation)
        session = RawCollect.open(actor.stub, open_request(frames_per_batch=8, credits=2, llm=llm))
        session.opened()
        batches.append(session.batch()[1])
    eager, static = batches
    assert torch.equal(eager["tokens"], static["tokens"])
    assert torch.allclose(eager["log_probs"], static["log_probs"], atol=1e-4)
