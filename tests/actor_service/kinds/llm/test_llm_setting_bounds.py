"""An LLM actor refuses each out-of-range LLM setting a learner sends.

Each bound is reachable on the wire (uint32 / double fields): the value at it is taken, the one
past it refused as INVALID_ARGUMENT naming the field (test_llm_actor's table holds the rest).
"""

from __future__ import annotations

import grpc
import pytest
from actor_harness import RawCollect, open_request
from helpers import poll_until

from actor_service import ModelSpec
from actor_service._kinds.llm.settings import LLMActorSettings
from common.llm import MAX_TURNS
from common.rlfleet.v1 import actor_service_pb2 as pb

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 1, "seed": 0}
CAP = 32


@pytest.fixture(scope="module")
def llm_actor():
    import grpc as _grpc
    from actor_harness import Actor, small_config

    from actor_service import create_server
    from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

    handle = create_server(
        small_config(
            kind="llm",
            llm=LLMActorSettings(task="arith", task_kwargs={"retries": 1}, max_new_tokens_cap=CAP),
            models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
            num_envs=4,
        )
    ).run_in_thread()
    channel = _grpc.insecure_channel(f"127.0.0.1:{handle.port}")
    yield Actor(handle, channel, pb_grpc.ActorServiceStub(channel))
    channel.close()
    handle.stop(grace=1.0)


def _open(actor, **llm):
    generation = llm.pop("generation", {"max_new_tokens": 3})
    msg = pb.LLMSettings(generation=pb.GenerationSettings(**generation), **llm)
    return RawCollect.open(actor.stub, open_request(frames_per_batch=4, credits=0, llm=msg))


def _refused(actor, needle, **llm) -> None:
    session = _open(actor, **llm)
    error = session.next()
    if not isinstance(error, grpc.RpcError):  # accepted: release the shared actor first
        session.cancel()
        poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
        pytest.fail(f"{llm} was accepted: {error}")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    assert needle in error.details(), error.details()


def _accepted(actor, **llm) -> None:
    session = _open(actor, **llm)
    session.opened()
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")


def test_max_new_tokens_at_the_cap_is_taken_one_past_it_refused(llm_actor) -> None:
    _accepted(llm_actor, generation={"max_new_tokens": CAP})
    _refused(llm_actor, "max_new_tokens", generation={"max_new_tokens": CAP + 1})


def test_top_k_past_the_vocabulary_is_refused(llm_actor) -> None:
    vocab = llm_actor.worker.engine.vocab
    _accepted(llm_actor, generation={"max_new_tokens": 3, "top_k": vocab})
    _refused(llm_actor, "top_k", generation={"max_new_tokens": 3, "top_k": vocab + 1})


def test_a_stop_token_id_equal_to_the_vocabulary_size_is_refused(llm_actor) -> None:
    vocab = llm_actor.worker.engine.vocab
    _accepted(llm_actor, generation={"max_new_tokens": 3, "stop_token_ids": [vocab - 1]})
    _refused(
        llm_actor, "stop_token_ids", generation={"max_new_tokens": 3, "stop_token_ids": [vocab]}
    )


def test_more_than_64_stop_token_ids_are_refused(llm_actor) -> None:
    _accepted(llm_actor, generation={"max_new_tokens": 3, "stop_token_ids": [1] * 64})
    _refused(
        llm_actor, "stop_token_ids", generation={"max_new_tokens": 3, "stop_token_ids": [1] * 65}
    )


@pytest.mark.parametrize("temperature", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_temperature_is_refused(llm_actor, temperature) -> None:
    _refused(llm_actor, "temperature", generation={"max_new_tokens": 3, "temperature": temperature})


def test_max_turns_past_its_bound_is_refused(llm_actor) -> None:
    _accepted(llm_actor, max_turns=MAX_TURNS)
    _refused(llm_actor, "max_turns", max_turns=MAX_TURNS + 1)


def test_a_group_size_past_its_bound_is_refused_naming_it(llm_actor) -> None:
    # A uint32 on the wire: the conversion must not wrap or clamp it into a valid size.
    _refused(llm_actor, "group_size", group_size=65537)
    _refused(llm_actor, "group_size", group_size=2**32 - 1)


def test_a_learner_vocab_size_below_the_models_ids_is_refused_naming_it(llm_actor) -> None:
    # The learner's embedding rows: every id the actor's model draws must fit; 0 checks nothing.
    vocab = llm_actor.worker.models.token_ids
    for taken in (vocab, 2**32 - 1, 0):
        _accepted(llm_actor, vocab_size=taken)
    _refused(llm_actor, f"learner's vocab_size={vocab - 1}", vocab_size=vocab - 1)
