"""An actor whose replies do not parse, on every call: a ``ProtocolError`` naming the call.

A real gRPC server answers each rlfleet.v1 method with bytes no message parses from (a
varint cut short: a broken actor, or one whose build retyped a field). gRPC's client would
log the parser's traceback at ERROR and hand the learner None (a bare ``AttributeError``);
every call says which actor, which call and that its reply does not parse, and nothing is
logged by gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from helpers import ACTOR_METHODS, UNPARSABLE, serving_raw_replies
from learner_fleet import cartpole_policy

from common.errors import ProtocolError
from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client import GrpcCollector, GrpcLLMCollector, WeightPushError
from learner_client._transport import ActorChannel, push_messages

Call = Callable[[ActorChannel], Coroutine[Any, Any, Any]]
CALLS: dict[str, Call] = {
    "Describe": lambda c: c.describe(5.0),
    "SetSeed": lambda c: c.set_seed(1, False, 5.0),
    "PushWeights": lambda c: c.push_weights(
        "policy", 1, push_messages("policy", 1, b"w" * 8, ""), 5.0
    ),
    "ForwardWeights": lambda c: c.forward_weights(pb.ForwardRequest(), 5.0),
    "GetState": lambda c: c.get_state(5.0),
    "LoadState": lambda c: c.load_state(b"state", 5.0, allow_rollback=False),
}


async def _call(address: str, call: Call) -> Any:
    channel = ActorChannel(address)
    try:
        return await call(channel)
    finally:
        await channel.close()


@pytest.mark.parametrize("method", sorted(CALLS))
def test_actor_channel_raises_if_a_reply_does_not_parse(
    method: str, caplog: pytest.LogCaptureFixture
) -> None:
    replies = dict.fromkeys(ACTOR_METHODS, UNPARSABLE)
    with serving_raw_replies(replies) as address, pytest.raises(ProtocolError) as raised:
        asyncio.run(_call(address, CALLS[method]))
    assert str(raised.value).startswith(f"{address}: its {method} reply of 1 bytes does not parse")
    assert "Exception deserializing" not in caplog.text


COLLECTORS: dict[str, Callable[[str], object]] = {
    "GrpcCollector": lambda a: GrpcCollector([a], frames_per_batch=8, connect_timeout=5.0),
    "GrpcLLMCollector": lambda a: GrpcLLMCollector(
        [a], dialog_turns_per_batch=2, vocab_size=32, connect_timeout=5.0
    ),
}


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
def test_collector_raises_if_a_describe_reply_does_not_parse(
    collector: str, description: pb.DescribeResponse, caplog: pytest.LogCaptureFixture
) -> None:
    """A Describe whose ``observation_spec`` is cut short is refused at construction, as a
    Describe outside an actor's ranges is, naming the actor and the call: it was a bare
    ``AttributeError: 'NoneType' object has no attribute 'worker_id'``."""
    whole = description.SerializeToString()
    spec = description.observation_spec.SerializeToString()
    cut = whole[: whole.index(spec) + len(spec) // 2]
    with (
        serving_raw_replies({"Describe": cut}) as address,
        pytest.raises(ProtocolError, match=f"^{address}: its Describe reply of"),
    ):
        COLLECTORS[collector](address)
    assert "Exception deserializing" not in caplog.text


def test_a_push_whose_reply_does_not_parse_fails_for_that_worker(
    description: pb.DescribeResponse, caplog: pytest.LogCaptureFixture
) -> None:
    """Named in the ``WeightPushError`` as any push the actor did not confirm, by worker_id."""
    replies = {"Describe": description.SerializeToString(), "PushWeights": UNPARSABLE}
    with (
        serving_raw_replies(replies | {"Collect": UNPARSABLE}) as address,
        GrpcCollector([address], frames_per_batch=8, call_timeout=5.0) as collector,
        pytest.raises(WeightPushError) as raised,
    ):
        collector.update_policy_weights_(cartpole_policy())
    assert list(raised.value.failed) == [description.worker_id]
    assert "its PushWeights reply of 1 bytes does not parse" in str(raised.value)
    assert "Exception deserializing" not in caplog.text


CONTROL_CALLS: dict[str, Callable[[GrpcCollector], object]] = {
    "SetSeed": lambda c: c.set_seed(1),
    "GetState": lambda c: c.state_dict(),
}


@pytest.mark.parametrize("method", sorted(CONTROL_CALLS))
def test_a_control_call_whose_reply_does_not_parse_names_the_worker_id_and_address(
    method: str, description: pb.DescribeResponse
) -> None:
    """A collector knows its actors' worker_ids: the error names the actor by both, as every
    other error of a call to a known actor does (it named the address alone)."""
    replies = {"Describe": description.SerializeToString(), method: UNPARSABLE}
    with (
        serving_raw_replies(replies | {"Collect": UNPARSABLE}) as address,
        GrpcCollector([address], frames_per_batch=8, call_timeout=5.0) as collector,
    ):
        named = rf"^{address} \(worker_id {description.worker_id}\): its {method} reply of 1"
        with pytest.raises(ProtocolError, match=named):
            CONTROL_CALLS[method](collector)
