"""An env actor refuses each bad collect setting a learner sends, naming it.

Every case is a value only a hostile or broken learner sends (rlfleet's own collector
checks them first), so the actor's own checks are the last line: each must answer
INVALID_ARGUMENT naming the field, take no session, and leave the actor serving.
"""

from __future__ import annotations

import grpc
import pytest
from actor_harness import RawCollect, open_request

from common.rlfleet.v1 import actor_service_pb2 as pb


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"frames_per_batch": 0}, "frames_per_batch must be a positive int"),
        ({"exploration_type": 99}, "exploration_type"),  # no such enum value
        ({"reset_when_done": False}, "reset_when_done"),
        ({"model_id": "../policy"}, "model_id must be"),  # not an id: not merely unknown
        ({"model_id": "p" * 65}, "model_id must be"),  # one past MAX_MODEL_ID
        ({"policy_device": "c" * 33}, "at most 32 characters"),
        ({"env_device": "c" * 33}, "at most 32 characters"),
        ({"compile_policy": pb.CompileSettings(backend="bogus")}, "compile backend"),
        ({"compile_policy": pb.CompileSettings(mode="bogus")}, "compile mode"),
    ],
)
def test_a_bad_setting_is_refused_as_invalid_argument_naming_it(actor, fields, needle) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=1, **fields))
    error = session.next()
    if not isinstance(error, grpc.RpcError):
        session.cancel()
        pytest.fail(f"{fields} was accepted: {error}")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    assert needle in error.details()
    assert not actor.handle.server.runtime.busy
    good = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1))
    good.opened()
    good.batch()
    good.cancel()


def test_a_longest_model_id_is_an_id_the_actor_merely_lacks(actor) -> None:
    # MAX_MODEL_ID characters is a well-formed id: NOT_FOUND, not INVALID_ARGUMENT.
    error = RawCollect.open(actor.stub, open_request(credits=1, model_id="p" * 64)).error()
    assert error.code() == grpc.StatusCode.NOT_FOUND, (error.code(), error.details())
