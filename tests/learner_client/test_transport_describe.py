"""``ActorDescription.from_response``: the one decoder of ``DescribeResponse``."""

from __future__ import annotations

import pytest

from common.config import (
    MAX_CREDITS,
    MAX_NUM_ENVS,
    MAX_WORKER_ID,
    MIN_PEER_PROTOCOL,
    PROTOCOL_VERSION,
)
from common.errors import ProtocolError
from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client import ActorDescription

# What every actor of this build says of its protocol revision.
REVISION = {"protocol_version": PROTOCOL_VERSION, "min_peer_protocol": MIN_PEER_PROTOCOL}


def test_actor_description_from_response_decodes_every_field() -> None:
    reply = pb.DescribeResponse(
        worker_id=3,
        epoch=17,
        env_id="CartPole-v1",
        models=[pb.ModelInfo(model_id="policy", version=4)],
        num_envs=8,
        max_credits=2,
        busy=True,
        kind="llm",
        max_new_tokens_cap=64,
        learner_id="trainer-7",
        draining=True,
        frames=1_000,
        uptime_seconds=12.5,
        **REVISION,
    )
    assert ActorDescription.from_response("a:1", reply) == ActorDescription(
        address="a:1",
        worker_id=3,
        epoch=17,
        num_envs=8,
        models={"policy": 4},
        max_credits=2,
        kind="llm",
        max_new_tokens_cap=64,
        env="CartPole-v1",
        busy=True,
        draining=True,
        learner_id="trainer-7",
        frames=1_000,
        uptime_seconds=12.5,
        protocol_version=PROTOCOL_VERSION,
        min_peer_protocol=MIN_PEER_PROTOCOL,
    )


def test_actor_description_from_response_reads_an_actor_without_kind_as_env() -> None:
    description = ActorDescription.from_response(
        "a:1", pb.DescribeResponse(worker_id=0, epoch=1, num_envs=1, **REVISION)
    )
    assert (description.kind, description.busy, description.learner_id) == ("env", False, "")


@pytest.mark.parametrize(
    ("field", "high"),
    [("max_credits", MAX_CREDITS), ("num_envs", MAX_NUM_ENVS), ("worker_id", MAX_WORKER_ID)],
)
def test_describe_ranges_end_at_their_largest_value(field: str, high: int) -> None:
    base = {"worker_id": 0, "epoch": 1, "num_envs": 1, "max_credits": 0, **REVISION}
    described = ActorDescription.from_response("a:1", pb.DescribeResponse(**base | {field: high}))
    assert getattr(described, field) == high
    with pytest.raises(ProtocolError, match=f"{field} {high + 1}, outside"):
        ActorDescription.from_response("a:1", pb.DescribeResponse(**base | {field: high + 1}))
