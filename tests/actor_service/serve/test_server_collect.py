"""Collect end to end on an in-process actor: batches, credits, acks, resume, take-over, ends."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import rlfleet_test_envs
from actor_harness import Actor, RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until

from actor_service._core._frames import SPLIT_MASK
from actor_service._core._settings import EnvPoolSettings
from actor_service._serve import _collect
from actor_service._serve._logging import MAX_FIELD_CHARS, configure_logging, get_logger
from common.config import MAX_WIRE_LEARNER_ID, MIN_PEER_PROTOCOL, PROTOCOL_VERSION, CollectSettings
from common.errors import RlfleetError
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client._collect_stream import CollectStream, EndEvent
from learner_client._transport import ActorChannel, translate_errors


def _slow_actor(make_actor: Callable[..., Actor], delay: float) -> Actor:
    """An in-process actor whose CartPole steps each take ``delay`` seconds."""
    return make_actor(
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:slow_cartpole", env_kwargs={"delay": delay}
        )
    )


def _still(predicate: object, seconds: float = 0.3) -> bool:
    """True if ``predicate()`` holds for the whole window (checks something does NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.02)
    return True


def test_collect_batches_decode_with_expected_shape_and_seq(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=3))
    opened = session.opened()
    assert opened.next_seq == 1
    assert opened.max_credits == 4
    assert not opened.resumed
    infos = []
    for _ in range(3):
        info, td = session.batch()
        infos.append(info)
        assert td.batch_size == (2, 5)
        assert td.names[-1] == "time"
        assert info.frames == 10
        assert info.epoch == opened.epoch
        assert info.model_id == "policy"
        assert ("next", "observation") in td.keys(include_nested=True)
    assert [i.seq for i in infos] == [1, 2, 3]
    session.close()
    end, _ = session.end()
    assert end.reason == pb.END_REASON_CLOSED
    assert end.last_seq == 3


def test_collect_credits_bound_how_far_ahead_the_actor_collects(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
    session.opened()
    poll_until(lambda: actor.worker.batches == 2, message="two batches for two credits")
    assert _still(lambda: actor.worker.batches == 2), "collected without a credit"
    session.credit(1)
    poll_until(lambda: actor.worker.batches == 3, message="one more batch for one more credit")
    assert _still(lambda: actor.worker.batches == 3)
    assert [session.batch()[0].seq for _ in range(3)] == [1, 2, 3]
    session.cancel()


def test_collect_credits_above_max_credits_are_ignored(make_actor: object) -> None:
    actor = make_actor(max_credits=2)
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=50))
    assert session.opened().max_credits == 2
    poll_until(lambda: actor.worker.batches == 2)
    assert _still(lambda: actor.worker.batches == 2), "credits above the cap were honoured"
    session.cancel()


@pytest.mark.parametrize("acked_by", ["ack", "credit"])
def test_collect_resume_resends_unacked_batches_first(actor: Actor, acked_by: str) -> None:
    """Batch 1 is acknowledged by an ``ack``, or by a ``credit``'s ``ack_seq`` (no credit)."""
    first = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=3))
    opened = first.opened()
    epoch = opened.epoch
    assert opened.acks_in_credit
    sent = {info.seq: (info.crc32c, td) for info, td in (first.batch() for _ in range(3))}
    if acked_by == "ack":
        first.ack(1)
    else:
        first.send(pb.CollectRequest(credit=pb.Credit(batches=0, ack_seq=1)))
    first.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")

    second = RawCollect.open(
        actor.stub,
        open_request(frames_per_batch=10, credits=1, resume_epoch=epoch, resume_after_seq=1),
    )
    opened = second.opened()
    assert opened.resumed
    assert opened.next_seq == 4
    resent = [second.batch() for _ in range(2)]
    assert [info.seq for info, _ in resent] == [2, 3]
    for info, td in resent:
        assert info.crc32c == sent[info.seq][0]
        assert (td["observation"] == sent[info.seq][1]["observation"]).all()
    info, _ = second.batch()
    assert info.seq == 4
    second.close()
    assert second.end()[0].reason == pb.END_REASON_CLOSED


def test_collect_a_resumed_session_continues_its_trajectories(actor: Actor) -> None:
    first = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=1, learner_id="A")
    )
    epoch = first.opened().epoch
    _, before = first.batch()
    first.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    again = RawCollect.open(
        actor.stub,
        open_request(
            frames_per_batch=10, credits=1, learner_id="A", resume_epoch=epoch, resume_after_seq=1
        ),
    )
    assert again.opened().resumed
    _, after = again.batch()
    again.cancel()
    assert not before["next", "done"][:, -1].any()  # 5 steps: no CartPole episode ends
    assert (after["observation"][:, 0] == before["next", "observation"][:, -1]).all()


def test_collect_a_fresh_session_starts_its_envs_from_a_reset(actor: Actor) -> None:
    first = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=1, learner_id="A")
    )
    first.opened()
    _, before = first.batch()
    first.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    again = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=1, learner_id="A")
    )
    assert not again.opened().resumed
    _, after = again.batch()
    again.cancel()
    assert not before["next", "done"][:, -1].any()  # 5 steps: no CartPole episode ends
    start = after["observation"][:, 0]
    assert (start != before["next", "observation"][:, -1]).any(dim=-1).all()
    assert (start.abs() <= 0.05).all()  # CartPole's reset draws each value in [-0.05, 0.05]


def test_collect_fresh_open_continues_seqs_without_resending(actor: Actor) -> None:
    first = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
    first.opened()
    first.batch(), first.batch()
    first.close()
    first.end()
    second = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1))
    opened = second.opened()
    assert not opened.resumed
    assert second.batch()[0].seq == opened.next_seq == 3
    second.cancel()


def test_collect_second_learner_is_refused_with_resource_exhausted(actor: Actor) -> None:
    first = RawCollect.open(actor.stub, open_request(credits=0, learner_id="learner-A"))
    first.opened()
    second = RawCollect.open(actor.stub, open_request(credits=0, learner_id="learner-B"))
    error = second.error()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "learner-A" in error.details()
    assert "take_over" in error.details()
    first.credit(1)
    assert first.batch()[0].seq == 1  # the first session is unharmed
    first.cancel()


def test_collect_learners_without_an_id_are_told_apart_by_their_address(actor: Actor) -> None:
    first = RawCollect.open(actor.stub, open_request(credits=0))
    epoch = first.opened().epoch
    holder = actor.stub.Describe(pb.DescribeRequest(), timeout=10).learner_id
    assert holder.startswith("ipv")  # the learner's address stands for its id
    # Another connection (channels of one process share theirs unless told not to).
    channel = grpc.insecure_channel(
        f"127.0.0.1:{actor.port}", [("grpc.use_local_subchannel_pool", 1)]
    )
    try:
        stub = pb_grpc.ActorServiceStub(channel)
        other = RawCollect.open(stub, open_request(credits=1, resume_epoch=epoch))
        error = other.error()
    finally:
        channel.close()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert holder in error.details()
    first.credit(1)
    assert first.batch()[0].seq == 1  # the first session is unharmed
    first.cancel()


def test_collect_refuses_a_learner_id_over_its_bound_and_logs_no_more_than_a_line(
    actor: Actor,
) -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "text", stream=stream)
    try:
        huge = RawCollect.open(actor.stub, open_request(credits=0, learner_id="L" * 4_000_000))
        error = huge.error()
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"1 to {MAX_WIRE_LEARNER_ID} characters" in error.details()
        assert len(error.details()) < 300
        longest = "A" * MAX_WIRE_LEARNER_ID
        first = RawCollect.open(actor.stub, open_request(credits=0, learner_id=longest))
        first.opened()
        assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).learner_id == longest
        for _ in range(5):  # each refusal quotes the holder's id: bounded, so is the log
            refused = RawCollect.open(actor.stub, open_request(credits=0, learner_id="B"))
            assert refused.error().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        first.credit(1)
        assert first.batch()[0].seq == 1  # the session is unharmed
        first.cancel()
    finally:
        get_logger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert sum("rpc.failed" in line for line in lines) == 6
    assert max(map(len, lines)) < 3 * MAX_FIELD_CHARS


def test_collect_a_learner_resumes_its_own_half_open_session_without_take_over(
    actor: Actor,
) -> None:
    old = RawCollect.open(actor.stub, open_request(credits=1, learner_id="A"), read=False)
    poll_until(lambda: actor.worker.batches >= 1, message="A's session runs")
    epoch = actor.worker.epoch
    # A's connection looks alive to the actor; A reconnects and resumes (no take_over).
    again = RawCollect.open(actor.stub, open_request(credits=2, learner_id="A", resume_epoch=epoch))
    opened = again.opened(timeout=10)
    assert opened.resumed
    assert [again.batch()[0].seq for _ in range(2)] == [1, 2]  # batch 1 re-sent, then new
    again.cancel()
    old.cancel()


def test_collect_a_learner_never_resumes_or_ends_another_learners_session(
    actor: Actor, caplog: pytest.LogCaptureFixture
) -> None:
    a = RawCollect.open(actor.stub, open_request(credits=2, learner_id="A"))
    epoch = a.opened().epoch
    a.batch(), a.batch()
    a.cancel()  # A's link breaks with seqs 1, 2 unacknowledged
    poll_until(lambda: not actor.handle.server.runtime.busy, message="A's session released")
    b = RawCollect.open(actor.stub, open_request(credits=1, learner_id="B"))
    assert not b.opened().resumed
    assert b.batch()[0].seq == 3
    # A reconnects, resuming its epoch, while B streams: refused, B unharmed.
    a_again = RawCollect.open(
        actor.stub, open_request(credits=1, learner_id="A", resume_epoch=epoch, resume_after_seq=2)
    )
    error = a_again.error()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'B'" in error.details()
    b.credit(1)
    assert b.batch()[0].seq == 4
    b.close()
    assert b.end()[0].reason == pb.END_REASON_CLOSED  # B's seqs 3, 4 stay unacknowledged
    # A's resume now finds B's leftovers: it gets a fresh session, never B's batches.
    a_later = RawCollect.open(
        actor.stub, open_request(credits=1, learner_id="A", resume_epoch=epoch, resume_after_seq=2)
    )
    assert not a_later.opened().resumed
    assert a_later.batch()[0].seq == 5
    # An explicit take-over is the operator's choice, logged as a warning with the peer.
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        c = RawCollect.open(actor.stub, open_request(credits=1, learner_id="C", take_over=True))
        assert a_later.end()[0].reason == pb.END_REASON_TAKEN_OVER
        c.opened()
    taken = [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "session.taken_over"]
    assert [r.levelname for r in taken] == ["WARNING"]
    assert taken[0].rlfleet_fields["old"] == "A"
    assert taken[0].rlfleet_fields["new"] == "C"
    assert taken[0].rlfleet_fields["peer"].startswith("ipv")
    c.cancel()


def test_collect_take_over_ends_the_first_session(actor: Actor) -> None:
    first = RawCollect.open(actor.stub, open_request(credits=1, learner_id="old"))
    first.opened()
    first.batch()
    second = RawCollect.open(actor.stub, open_request(credits=1, take_over=True, learner_id="new"))
    end, _ = first.end()
    assert end.reason == pb.END_REASON_TAKEN_OVER
    assert end.last_seq == 1
    assert second.opened().next_seq == 2
    assert second.batch()[0].seq == 2
    second.cancel()


def test_collect_the_end_of_a_taken_over_session_leaves_the_new_one_collecting(
    actor: Actor,
) -> None:
    first = RawCollect.open(actor.stub, open_request(credits=1, learner_id="old"))
    first.opened()
    first.batch()
    second = RawCollect.open(actor.stub, open_request(credits=1, take_over=True, learner_id="new"))
    assert second.opened().next_seq == 2
    end, _ = first.end()  # its call answered OK: the old session's handler has returned
    assert end.reason == pb.END_REASON_TAKEN_OVER
    assert second.batch()[0].seq == 2
    second.credit(2)
    assert [second.batch(timeout=5)[0].seq for _ in range(2)] == [3, 4]
    second.close()
    assert second.end()[0].reason == pb.END_REASON_CLOSED


@pytest.mark.parametrize(
    ("refused", "code"),
    [
        ({"model_id": "nope"}, grpc.StatusCode.NOT_FOUND),
        ({"llm": pb.LLMSettings(group_size=1)}, grpc.StatusCode.INVALID_ARGUMENT),  # env actor
        ({"policy_device": "cuda:0"}, grpc.StatusCode.FAILED_PRECONDITION),  # not its device
    ],
    ids=["model_id", "llm", "policy_device"],
)
def test_collect_a_take_over_with_refused_settings_leaves_the_session_in_force(
    actor: Actor, refused: dict, code: grpc.StatusCode
) -> None:
    first = RawCollect.open(actor.stub, open_request(credits=1, learner_id="A"))
    first.opened()
    assert first.batch()[0].seq == 1
    taker = RawCollect.open(
        actor.stub, open_request(credits=1, learner_id="B", take_over=True, **refused)
    )
    assert taker.error().code() == code
    first.credit(1)  # A's session goes on: its next batch, not an end
    assert first.batch()[0].seq == 2
    assert actor.handle.server.runtime.busy
    first.cancel()


def test_collect_take_over_replaces_a_learner_that_stopped_reading(actor: Actor) -> None:
    stuck = RawCollect.open(actor.stub, open_request(frames_per_batch=4000, credits=4), read=False)
    poll_until(lambda: actor.worker.batches >= 1, message="the stuck learner's session runs")
    taker = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=1, take_over=True)
    )
    opened = taker.opened(timeout=10)
    info, td = taker.batch(timeout=10)
    assert info.seq >= opened.next_seq
    assert td.batch_size == (2, 5)
    taker.cancel()
    stuck.cancel()


def test_collect_a_take_over_gives_the_batch_under_way_up_at_its_next_step(
    make_actor: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old session's learner stopped reading and never closes its side: its status would
    # wait _LEARNER_CLOSE_S for it (made 30 s here), and the batch under way was given up
    # only then. Steps of 0.05 s, 200 a batch: the take-over waits one step, not the close.
    monkeypatch.setattr(_collect, "_LEARNER_CLOSE_S", 30.0)
    actor = _slow_actor(make_actor, 0.05)
    runtime = actor.handle.server.runtime
    stuck = RawCollect.open(
        actor.stub, open_request(frames_per_batch=400, credits=1, learner_id="A"), read=False
    )
    poll_until(lambda: runtime.book.in_flight, message="batch 1 in collection")
    taker = RawCollect.open(
        actor.stub, open_request(frames_per_batch=2, credits=1, learner_id="B", take_over=True)
    )
    assert taker.opened(timeout=10).next_seq == 1  # batch 1 was given up: no seq taken
    taker.cancel()
    stuck.cancel()


def test_collect_close_stops_after_the_batch_being_written_and_keeps_the_rest(
    actor: Actor,
) -> None:
    runtime = actor.handle.server.runtime
    # Without BDP probing the stream's window stays 64 KiB, less than a batch: the write of
    # batch 1 waits for the learner to read, so batches 2 and 3 are still queued at the close.
    channel = grpc.insecure_channel(f"127.0.0.1:{actor.port}", [("grpc.http2.bdp_probe", 0)])
    try:
        stub = pb_grpc.ActorServiceStub(channel)
        request = open_request(frames_per_batch=2000, credits=3, learner_id="A")
        session = RawCollect.open(stub, request, read=False)
        poll_until(lambda: actor.worker.batches == 3, message="three batches collected")
        session.close()
        poll_until(lambda: not runtime.current.collecting, message="the close was read")
        session.start_reading()
        epoch = session.opened().epoch
        end, seqs = session.end()
    finally:
        channel.close()
    assert (end.reason, seqs, end.last_seq) == (pb.END_REASON_CLOSED, [1], 1)
    resumed = RawCollect.open(
        actor.stub,
        open_request(frames_per_batch=2000, learner_id="A", resume_epoch=epoch, resume_after_seq=1),
    )
    assert resumed.opened().resumed
    assert [resumed.batch()[0].seq for _ in range(2)] == [2, 3]
    resumed.cancel()


def test_collect_take_over_waits_for_the_batch_in_collection(actor: Actor) -> None:
    """A take-over while the first session's long batch is being collected: the new session
    opens once that collection stops, and its first batch is its own, whole."""
    first = RawCollect.open(actor.stub, open_request(frames_per_batch=100_000, credits=1))
    first.opened()
    time.sleep(0.5)  # the 100,000-frame batch is being collected
    taker = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=1, take_over=True)
    )
    opened = taker.opened(timeout=20)
    info, td = taker.batch(timeout=20)
    assert info.seq >= opened.next_seq
    assert td.batch_size == (2, 5)
    end, _ = first.end()
    assert end.reason == pb.END_REASON_TAKEN_OVER
    taker.cancel()


@pytest.mark.parametrize("seq", [2, 5, 2**64 - 1])
@pytest.mark.parametrize("acked_by", ["ack", "credit"])
def test_collect_raises_if_ack_names_a_batch_never_produced(
    actor: Actor, acked_by: str, seq: int
) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=1))
    session.opened()
    session.batch()
    if acked_by == "ack":
        session.ack(seq)
    else:
        session.send(pb.CollectRequest(credit=pb.Credit(batches=1, ack_seq=seq)))
    error = session.error()
    assert error.code() == grpc.StatusCode.ABORTED
    assert f"seq {seq} " in error.details()
    assert actor.worker.batches == 1, "the credit sent with a bad ack was not honoured"


def test_collect_raises_if_data_comes_before_open(actor: Actor) -> None:
    session = RawCollect(actor.stub, pb.CollectRequest(credit=pb.Credit(batches=1)))
    error = session.error()
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "open" in error.details()


def test_collect_raises_if_open_comes_twice(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=0))
    session.opened()
    session.send(pb.CollectRequest(open=open_request()))
    assert session.error().code() == grpc.StatusCode.FAILED_PRECONDITION
    # The actor accepts the next learner at once.
    again = RawCollect.open(actor.stub, open_request(credits=1))
    again.opened()
    again.batch()
    again.cancel()


def test_collect_names_an_empty_message_first_or_after_open(actor: Actor) -> None:
    """A message with no ``kind`` (empty, or a kind of a newer build) is named as such."""
    first = RawCollect(actor.stub, pb.CollectRequest()).error()
    assert first.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "must start with `open`, got an empty message" in first.details()
    session = RawCollect.open(actor.stub, open_request(credits=0))
    session.opened()
    session.send(pb.CollectRequest())
    later = session.error()
    assert later.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "an empty message (or one of a kind this build does not know) after open" in (
        later.details()
    )


def test_collect_total_frames_ends_with_budget_reached(actor: Actor) -> None:
    session = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=4, total_frames=30)
    )
    session.opened()
    end, seqs = session.end()
    assert end.reason == pb.END_REASON_BUDGET_REACHED
    assert seqs == [1, 2, 3]
    assert end.last_seq == 3
    assert actor.worker.frames == 30


def test_collect_half_close_ends_with_closed(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=0))
    session.opened()
    session.half_close()
    end, seqs = session.end()
    assert end.reason == pb.END_REASON_CLOSED
    assert seqs == []


def test_collect_cancelled_stream_releases_the_session(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=200, credits=4))
    session.opened()
    session.batch()
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")
    released_at = actor.worker.batches
    assert _still(lambda: actor.worker.batches <= released_at + 1), "kept collecting"
    health = health_pb2_grpc.HealthStub(actor.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == (
        health_pb2.HealthCheckResponse.SERVING
    )
    again = RawCollect.open(actor.stub, open_request(credits=1))
    again.opened()
    again.batch()
    again.cancel()


@pytest.mark.parametrize(
    ("request_kw", "code", "needle"),
    [
        ({"frames_per_batch": 7}, grpc.StatusCode.INVALID_ARGUMENT, "7"),
        ({"frames_per_batch": 0}, grpc.StatusCode.INVALID_ARGUMENT, "frames_per_batch"),
        ({"model_id": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
    ],
)
def test_collect_raises_if_settings_are_bad(
    actor: Actor, request_kw: dict, code: grpc.StatusCode, needle: str
) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=1, **request_kw))
    error = session.error()
    assert error.code() == code
    assert needle in error.details()
    assert not actor.handle.server.runtime.busy


def test_a_refused_session_reaches_the_learner_as_its_refusal_every_time(actor: Actor) -> None:
    # The actor refuses from the open while the learner writes credits: grpcio's client then
    # read 269 of 300 such refusals as INTERNAL "Internal error from Core" (a transient
    # failure to the learner, which retried, or failed a strict round on a "down" actor).
    address = f"127.0.0.1:{actor.handle.port}"
    refused = pb.CollectRequest(open=open_request(frames_per_batch=7, credits=1))
    credit = pb.CollectRequest(credit=pb.Credit(batches=1))

    async def open_refused(n: int) -> list[str]:
        channel = ActorChannel(address)
        outcomes = []
        try:
            for _ in range(n):
                call = channel.start_collect(_requests([refused] + [credit] * 5))
                try:
                    with translate_errors(address):
                        await call.read()
                    outcomes.append("answered")
                except RlfleetError as exc:
                    outcomes.append(f"{type(exc).__name__}: {exc}"[:60])
                finally:
                    call.cancel()
        finally:
            await channel.close()
        return outcomes

    outcomes = asyncio.run(open_refused(100))
    assert len(outcomes) == 100
    assert {o.split(":")[0] for o in outcomes} == {"ProtocolError"}, set(outcomes)
    assert not actor.handle.server.runtime.busy


def test_an_end_the_actor_sends_reaches_a_learner_granting_credits_every_time(
    actor: Actor,
) -> None:
    # The actor answered its status right after its end while credits were on their way:
    # gRPC's asyncio client then lost the end (7 of 60 sessions read INTERNAL). Now the
    # status waits for the learner, which closes its side once it read the end.
    address = f"127.0.0.1:{actor.handle.port}"
    budget = CollectSettings(frames_per_batch=10, total_frames=20)

    async def granting(stream: CollectStream) -> None:
        while True:
            stream.grant(1)
            await asyncio.sleep(0.0005)

    async def sessions(n: int) -> list[str]:
        channel = ActorChannel(address)
        ends = []
        for _ in range(n):
            stream = CollectStream(
                channel, budget, credits=4, resume=(0, 0), take_over=False,
                learner_id="A", num_envs=2, worker_id=0,
            )  # fmt: skip
            grants = asyncio.ensure_future(granting(stream))
            try:
                await stream.opened(10)
                while not isinstance(event := await stream.next_event(10), EndEvent):
                    pass
                stream.close()  # as the learner's link does
                ends.append(event.reason)
            except RlfleetError as exc:
                ends.append(f"{type(exc).__name__}: {exc}"[:80])
            finally:
                grants.cancel()
                stream.cancel()
        await channel.close()
        return ends

    assert asyncio.run(sessions(50)) == ["BUDGET_REACHED"] * 50


def test_a_drain_answers_a_learner_that_never_closes_within_its_grace(make_actor) -> None:
    # After its end the status waits for the learner to close, but a drain's budget bounds
    # that wait: a learner that never closes (an older build, a hung one) still reads OK.
    actor = make_actor(grace_period=1.0)
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
    session.opened()
    session.batch()
    started = time.monotonic()
    actor.handle.stop()
    assert time.monotonic() - started < 0.5  # half the budget left to the drain, at most
    assert session.call.code() == grpc.StatusCode.OK  # answered, not cancelled by the stop


def test_a_drain_ignores_what_the_learner_sends_once_it_began(make_actor: object) -> None:
    # 2 steps of 0.4 s: the drain begins while batch 1 is in collection and waits for it.
    actor = _slow_actor(make_actor, 0.4)
    runtime = actor.handle.server.runtime
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=4, credits=1))
    session.opened()
    poll_until(lambda: runtime.book.in_flight, message="batch 1 in collection")
    stopping = threading.Thread(target=actor.handle.stop, args=(5.0,))
    stopping.start()
    try:
        poll_until(lambda: runtime.draining, message="the drain began")
        assert actor.stub.Describe(pb.DescribeRequest(), timeout=5).draining
        session.send(pb.CollectRequest())  # late: neither refused nor applied
        end, seqs = session.end()
    finally:
        stopping.join(30)
    assert (end.reason, seqs) == (pb.END_REASON_DRAINING, [1])
    assert session.call.code() == grpc.StatusCode.OK


def test_a_learner_gone_during_a_drain_has_its_batch_given_up_at_the_next_step(
    make_actor: object,
) -> None:
    # 0.3 s per step, 40 steps: 12 s if the batch were finished for a learner that left.
    actor = _slow_actor(make_actor, 0.3)
    runtime = actor.handle.server.runtime
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=80, credits=1))
    session.opened()
    poll_until(lambda: runtime.book.in_flight, message="batch 1 in collection")
    stopping = threading.Thread(target=actor.handle.stop, args=(20.0,))
    stopping.start()
    try:
        poll_until(lambda: runtime.draining, message="the drain began")
        session.cancel()
        poll_until(lambda: not runtime.current.collecting, timeout=3, message="batch given up")
    finally:
        stopping.join(30)


def test_a_session_waiting_for_an_abandoned_batch_is_refused_once_a_drain_began(
    make_actor: object,
) -> None:
    # Steps of 1.5 s: the cancelled session's batch is given up at the end of its first step.
    actor = _slow_actor(make_actor, 1.5)
    runtime = actor.handle.server.runtime
    first = RawCollect.open(actor.stub, open_request(frames_per_batch=4, credits=1))
    first.opened()
    poll_until(lambda: runtime.book.in_flight, message="batch 1 in collection")
    time.sleep(0.5)  # into its first step
    first.cancel()
    poll_until(lambda: not runtime.current.active, message="the first session ended")
    assert runtime.current.collecting  # its batch is given up once the step ends
    waiting = RawCollect.open(actor.stub, open_request(frames_per_batch=4, credits=1))
    time.sleep(0.1)  # the new session waits for the first one's batch to be given up
    stopping = threading.Thread(target=actor.handle.stop, args=(5.0,))
    stopping.start()
    try:
        poll_until(lambda: runtime.draining, message="the drain began")
        refusal = waiting.next(timeout=10)
    finally:
        stopping.join(30)
    assert isinstance(refusal, grpc.RpcError), refusal
    assert refusal.code() == grpc.StatusCode.UNAVAILABLE
    assert "draining" in refusal.details()


async def _requests(messages: list[pb.CollectRequest]) -> AsyncIterator[pb.CollectRequest]:
    for message in messages:
        yield message
    await asyncio.Event().wait()  # a learner keeps its side open until it closes the session


def test_collect_raises_if_a_batch_cannot_fit_the_packet_cap(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=12_000_000, credits=1))
    error = session.error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    largest = int(error.details().rsplit("largest that fits is ", 1)[1])
    assert 0 < largest < 12_000_000
    assert largest % 2 == 0  # a multiple of num_envs
    assert not actor.handle.server.runtime.busy
    for too_many in (largest + 2, 2**40):
        refused = RawCollect.open(actor.stub, open_request(frames_per_batch=too_many))
        assert refused.error().code() == grpc.StatusCode.INVALID_ARGUMENT
    fits = RawCollect.open(actor.stub, open_request(frames_per_batch=largest, credits=0))
    fits.opened()  # accepted (no credit: nothing is collected)
    fits.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy, message="session released")


def test_collect_abandons_a_cancelled_sessions_batch_promptly_and_is_busy_until_then(
    make_actor: object, caplog: pytest.LogCaptureFixture
) -> None:
    # 0.3 s per step, 40 steps: 12 s if the batch were finished.
    actor = _slow_actor(make_actor, 0.3)
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=80, credits=1))
    session.opened()
    time.sleep(1.0)  # a few steps into the batch
    caplog.set_level("INFO", logger="rlfleet.actor")
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.current.active, message="session ended")
    # The batch is given up at its next step (<= 0.3 s): until then the actor says busy.
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=5).busy
    start = time.monotonic()
    again = RawCollect.open(actor.stub, open_request(frames_per_batch=2, credits=1))
    again.opened(timeout=5)
    assert time.monotonic() - start < 5, "waited for the abandoned batch"
    again.batch(timeout=5)
    again.cancel()
    assert actor.worker.batches == 1  # the abandoned batch produced nothing
    assert actor.worker.frames == 2
    events = [getattr(r, "rlfleet_event", "") for r in caplog.records]
    assert "session.batch_abandoned" in events
    assert "session.collect_failed" not in events  # giving a batch up is no failure


def test_health_answers_within_100ms_while_collecting(actor: Actor) -> None:
    health = health_pb2_grpc.HealthStub(actor.channel)
    request = health_pb2.HealthCheckRequest(service="rlfleet.v1.ActorService")
    health.Check(request, timeout=5)  # connect first
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=2000, credits=4))
    session.opened()
    poll_until(lambda: actor.worker.batches >= 1, message="collection running")
    latencies = []
    for _ in range(20):
        session.credit(1)
        start = time.perf_counter()
        response = health.Check(request, timeout=5)
        latencies.append(time.perf_counter() - start)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        time.sleep(0.01)
    assert actor.handle.server.runtime.busy
    session.cancel()
    assert max(latencies) < 0.1, f"health latencies {sorted(latencies)[-3:]}"


def test_collect_env_crash_ends_with_error_and_the_actor_recovers(make_actor: object) -> None:
    actor = make_actor(
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:crashing_cartpole", env_kwargs={"steps": 7}
        )
    )
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
    session.opened()
    end, seqs = session.end()
    assert seqs == [1]
    assert end.reason == pb.END_REASON_ERROR
    assert "simulator crashed" in end.message
    assert end.last_seq == 1
    failure = end.env_failure
    assert (failure.env, failure.exception_type) == (
        "rlfleet_test_envs:crashing_cartpole",
        "RuntimeError",
    )
    assert (failure.exception_message, failure.message_withheld) == ("simulator crashed", False)
    again = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1))
    assert again.opened().next_seq == 2
    assert again.batch()[0].seq == 2
    again.cancel()


def test_collect_env_factory_failing_to_rebuild_the_pool_ends_with_its_env_failure(
    make_actor: object,
) -> None:
    rlfleet_test_envs._UNBUILDABLE["crashed"] = False
    factory = "rlfleet_test_envs:unbuildable_after_crash_cartpole"
    actor = make_actor(env_pool=EnvPoolSettings(env_factory=factory, env_kwargs={"steps": 7}))
    crashed = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
    crashed.opened()
    assert crashed.end()[0].env_failure.exception_message == "simulator crashed"
    again = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1))
    again.opened()
    end, seqs = again.end()
    assert (seqs, end.reason) == ([], pb.END_REASON_ERROR)
    failure = end.env_failure  # the env's failure a learner counts, not an internal error
    assert failure.env == factory
    assert "licence server is unreachable" in failure.exception_message
    assert "licence server is unreachable" in end.message


def test_collect_env_crash_withholds_the_text_when_detail_is_type(make_actor: object) -> None:
    # The env's exception text can hold paths or data: an operator may keep it in the log.
    actor = make_actor(
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:crashing_cartpole", env_kwargs={"steps": 0}
        ),
        env_error_detail="type",
    )
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1))
    session.opened()
    end, seqs = session.end()
    assert (end.reason, seqs) == (pb.END_REASON_ERROR, [])
    failure = end.env_failure
    assert failure.exception_type == "RuntimeError"
    assert (failure.exception_message, failure.message_withheld) == ("", True)
    assert "simulator crashed" not in end.message
    assert "RuntimeError" in end.message


def test_collect_env_crash_still_sends_the_batches_queued_before_it(make_actor: object) -> None:
    # Each env crashes at its step 2,501: batches 1 and 2 (1,000 steps each) are finished first.
    actor = make_actor(
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:crashing_cartpole", env_kwargs={"steps": 2500}
        )
    )
    runtime = actor.handle.server.runtime
    # Without BDP probing the stream's window stays 64 KiB, less than a batch: the actor's
    # write of batch 1 waits for the learner to read, so batch 2 is queued when the env crashes.
    channel = grpc.insecure_channel(f"127.0.0.1:{actor.port}", [("grpc.http2.bdp_probe", 0)])
    try:
        stub = pb_grpc.ActorServiceStub(channel)
        request = open_request(frames_per_batch=2000, credits=4)
        session = RawCollect.open(stub, request, read=False)
        poll_until(
            lambda: actor.worker.batches == 2 and not runtime.current.collecting,
            message="the env crashed in batch 3",
        )
        session.start_reading()
        session.opened()
        end, seqs = session.end()
    finally:
        channel.close()
    assert (end.reason, seqs, end.last_seq) == (pb.END_REASON_ERROR, [1, 2], 2)


def test_collect_refuses_a_learner_of_a_protocol_revision_it_does_not_work_with(
    actor: Actor,
) -> None:
    described = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert (described.protocol_version, described.min_peer_protocol) == (
        PROTOCOL_VERSION,
        MIN_PEER_PROTOCOL,
    )
    # A learner of a later revision that needs actors of its own revision or newer.
    newest = 2**32 - 1
    refused = RawCollect.open(
        actor.stub, open_request(credits=0, protocol_version=newest, min_peer_protocol=newest)
    )
    error = refused.error()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"speaks protocol {newest} (works with {newest} and newer)" in error.details()
    assert "run the same rlfleet release" in error.details()
    # A client that does not say (grpcurl, a hand-written one) and one of this revision.
    for fields in [{}, {"protocol_version": PROTOCOL_VERSION, "min_peer_protocol": 1}]:
        session = RawCollect.open(actor.stub, open_request(credits=1, **fields))
        assert session.opened().worker_id == described.worker_id
        assert session.batch()[0].frames == 10
        session.cancel()


def test_collect_refuses_a_learner_of_another_revision_before_reading_its_settings(
    actor: Actor,
) -> None:
    """A newer learner's settings may mean what this build does not know (an exploration
    type it added, a field it made required): its revision is what the refusal names, not
    "unknown exploration_type 9" nor "reset_when_done=False"."""
    newer = PROTOCOL_VERSION + 1
    for settings in [{"exploration_type": 9}, {"reset_when_done": False}]:
        refused = RawCollect.open(
            actor.stub,
            open_request(credits=0, protocol_version=newer, min_peer_protocol=newer, **settings),
        )
        error = refused.error()
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"speaks protocol {newer} (works with {newer} and newer)" in error.details()
        assert f"this build speaks protocol {PROTOCOL_VERSION}" in error.details()


def test_collect_a_fresh_open_under_a_live_sessions_learner_id_is_refused(actor: Actor) -> None:
    """A second process under the same learner_id opening afresh (not resuming) is busy-refused:
    only take_over ends a live session; the first keeps streaming."""
    a = RawCollect.open(actor.stub, open_request(credits=1, learner_id="A"))
    epoch = a.opened().epoch
    fresh = RawCollect.open(
        actor.stub, open_request(credits=1, learner_id="A", resume_epoch=epoch + 1)
    )
    assert fresh.error().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    a.credit(1)
    a.batch()
    a.cancel()


def test_collect_own_resume_of_a_half_open_session_keeps_the_batch_under_way(
    make_actor: object,
) -> None:
    """A learner resuming its own half-open session (its stream broke, the actor did not see it)
    lost nothing: the batch under way (0.25 s of steps here) was finished and re-sent, and the
    resumed session continued its trajectories. Giving it up at once (97187b2) resets the envs,
    so the resumed batch starts new trajectories though the learner's last frame was not done."""
    actor = _slow_actor(make_actor, 0.05)
    runtime = actor.handle.server.runtime
    old = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=1, learner_id="A"))
    epoch = old.opened().epoch
    _, before = old.batch()
    old.credit(1)
    poll_until(lambda: runtime.book.in_flight, message="batch 2 in collection")
    again = RawCollect.open(
        actor.stub,
        open_request(
            frames_per_batch=10, credits=1, learner_id="A", resume_epoch=epoch, resume_after_seq=1
        ),
    )
    assert again.opened(timeout=10).resumed
    info, after = again.batch()
    again.cancel()
    old.cancel()
    assert info.seq == 2
    assert not before["next", "done"][:, -1].any()  # 5 steps: no CartPole episode ends
    assert (after["observation"][:, 0] == before["next", "observation"][:, -1]).all()


def test_collect_a_split_batch_counts_its_real_frames_not_its_padding(actor: Actor) -> None:
    # 100 random CartPole steps per env: episodes end inside, so the split pads trajectories.
    session = RawCollect.open(
        actor.stub, open_request(frames_per_batch=200, credits=1, split_trajs=True)
    )
    session.opened()
    info, td = session.batch()
    session.cancel()
    real = td.get(SPLIT_MASK)
    assert td.numel() > int(real.sum()) == 200
    assert info.frames == 200
