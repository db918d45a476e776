"""``ActorLink``'s reconnect decisions, driven over a fake channel (no server, no network).

Each test scripts what the actor says: Describe's answers (or errors) and, per
``Collect`` call, the responses it sends (or the error it breaks with); the fake
answers the learner's ``close`` with ``end(CLOSED)`` as an actor does. The
real-server fault tests (``test_fault_suite.py``, ``test_collector_faults.py``)
cover the same paths end to end. A scripted actor may also name shared-memory segments the
learner did not ask for, or cannot read (``test_collector_shm_batches.py`` runs real ones).
The last test routes acks and credits through ``OpenStreams`` to a stream on the fake channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest
import torch
from learner_fleet import connection_settings
from tensordict import TensorDict

from common.config import CollectSettings
from common.errors import ActorUnavailableError, EnvError
from common.packets import encode_packet, packet_crc32c
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import remove_segment, write_segment
from learner_client import _link
from learner_client._collect_stream import CollectStream, OpenStreams
from learner_client._description import ActorDescription
from learner_client._ledger import Ledger
from learner_client._link import ENV_FAILURE_ATTEMPTS, ActorLink, Backoff, LinkState
from learner_client._loop_thread import LoopThread
from learner_client._mailbox import Mailbox
from learner_client._shm import ShmRoute

ADDRESS = "fake:1"
SETTINGS = CollectSettings(frames_per_batch=6)

# What a scripted Collect call does: send a response, or break with an error.
Step = pb.CollectResponse | Exception


def described(epoch: int = 1, worker_id: int = 0) -> ActorDescription:
    return ActorDescription(ADDRESS, worker_id, epoch, num_envs=2, models={}, max_credits=2)


def opened(epoch: int = 1, next_seq: int = 1, resumed: bool = False) -> pb.CollectResponse:
    return pb.CollectResponse(
        opened=pb.SessionOpened(worker_id=0, epoch=epoch, next_seq=next_seq, resumed=resumed)
    )


def resumed_after(seq: int, epoch: int = 1) -> pb.CollectResponse:
    """The actor's reply to an ``open`` resuming its session after batch ``seq``."""
    return opened(epoch, next_seq=seq + 1, resumed=True)


def batch(seq: int, epoch: int = 1) -> pb.CollectResponse:
    packet = encode_packet(TensorDict({"observation": torch.zeros(2, 3, 4)}, batch_size=[2, 3]))
    info = pb.BatchInfo(
        worker_id=0,
        epoch=epoch,
        seq=seq,
        frames=6,
        total_bytes=packet.nbytes,
        crc32c=packet_crc32c(packet),
    )
    chunk = pb.BatchChunk(seq=seq, index=0, count=1, data=packet.tobytes(), info=info)
    return pb.CollectResponse(chunk=chunk)


def shm_batch(seq: int, name: str | None = None) -> pb.CollectResponse:
    """Batch ``seq`` as one chunk naming a segment: ``name``, or one written with its packet."""
    bytes_batch = batch(seq).chunk
    info, data = bytes_batch.info, bytes_batch.data
    segment = write_segment(data) if name is None else None
    shm = pb.ShmSegment(
        name=segment.name if segment else name, size=info.total_bytes, crc32c=info.crc32c
    )
    chunk = pb.BatchChunk(seq=seq, index=0, count=1, info=info, shm=shm)
    return pb.CollectResponse(chunk=chunk)


def local_route() -> ShmRoute:
    """A route on which worker 0 is proven local (batches through shared memory only)."""
    route = ShmRoute(enabled=False, identity="boot/host/1:2", batches=True)
    route.admit(0, "boot/host/1:2", probe_ok=True)
    return route


def end(reason: str, message: str = "", env_failure: pb.EnvFailure | None = None) -> Step:
    return pb.CollectResponse(
        end=pb.StreamEnd(reason=f"END_REASON_{reason}", message=message, env_failure=env_failure)
    )


class FakeCall:
    """One ``Collect`` call: sends its script, then stays silent until closed or cancelled."""

    def __init__(self, script: list[Step], requests: AsyncIterator[pb.CollectRequest]) -> None:
        self.requests: list[pb.CollectRequest] = []
        self.cancelled = False
        self._responses: asyncio.Queue[Step] = asyncio.Queue()
        for step in script:
            self._responses.put_nowait(step)
        self._reader = asyncio.ensure_future(self._read_requests(requests))

    async def _read_requests(self, requests: AsyncIterator[pb.CollectRequest]) -> None:
        async for request in requests:
            self.requests.append(request)
            if request.WhichOneof("kind") == "close":
                self._responses.put_nowait(end("CLOSED"))

    @property
    def open_request(self) -> pb.OpenSession:
        return self.requests[0].open

    async def read(self) -> pb.CollectResponse:
        step = await self._responses.get()
        if isinstance(step, Exception):
            raise step
        return step

    def cancel(self) -> bool:
        self.cancelled = True
        self._reader.cancel()
        return True

    async def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED if self.cancelled else grpc.StatusCode.OK


class FakeChannel:
    """Scripted answers to Describe (the last one repeats) and one script per Collect call."""

    def __init__(
        self,
        sessions: list[list[Step]],
        descriptions: list[ActorDescription | Exception] | None = None,
    ) -> None:
        self.address = ADDRESS
        self.calls: list[FakeCall] = []
        self.describes = 0
        self.closed = False
        self._sessions = list(sessions)
        self._descriptions = list(descriptions or [described()])

    async def describe(self, timeout: float, *, wait_for_ready: bool = False) -> ActorDescription:
        self.describes += 1
        answer = self._descriptions.pop(0) if len(self._descriptions) > 1 else self._descriptions[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def start_collect(self, requests: AsyncIterator[pb.CollectRequest]) -> FakeCall:
        call = FakeCall(self._sessions.pop(0) if self._sessions else [], requests)
        self.calls.append(call)
        return call

    async def close(self) -> None:
        self.closed = True


@dataclasses.dataclass(frozen=True)
class RecordingBackoff(Backoff):
    """Records the attempt of every delay it is asked for; waits ``wait`` seconds."""

    attempts: list[int] = dataclasses.field(default_factory=list)
    wait: float = 0.0

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return self.wait


class _Histogram:
    def observe(self, value: float) -> None:
        pass


@dataclasses.dataclass
class Rig:
    """A link over a fake channel and what it talks to."""

    link: ActorLink[FakeChannel]
    channel: FakeChannel
    mailbox: Mailbox
    ledger: Ledger
    backoff: RecordingBackoff
    admitted: list[int]


def rig(
    channel: FakeChannel,
    backoff: RecordingBackoff | None = None,
    batch_timeout: float = 30.0,
    shm: ShmRoute | None = None,
    mailbox: Mailbox | None = None,
) -> Rig:
    if mailbox is None:
        mailbox = Mailbox(2, send_credit=lambda w, n: None, send_ack=lambda w, e, s: None)
    mailbox.add_worker(0, 2)
    ledger = Ledger(_Histogram())  # type: ignore[arg-type]
    admitted: list[int] = []

    async def admit(link: ActorLink[FakeChannel], desc: ActorDescription) -> None:
        admitted.append(desc.epoch)

    backoff = RecordingBackoff() if backoff is None else backoff
    link = ActorLink(
        described(),
        channel,
        connection_settings(learner_id="learner-under-test"),
        batch_timeout=batch_timeout,
        mailbox=mailbox,
        streams=OpenStreams(None),  # type: ignore[arg-type]  # credits are not routed here
        ledger=ledger,
        admit=admit,
        backoff=backoff,
        shm=shm,
    )
    return Rig(link, channel, mailbox, ledger, backoff, admitted)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=20))


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def finished(r: Rig) -> bool:
    return r.link._task is not None and r.link._task.done()


def test_link_streams_batches_into_the_mailbox() -> None:
    r = rig(FakeChannel([[opened(), batch(1), batch(2)]]))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 2)
        assert r.link.state is LinkState.STREAMING
        assert (r.channel.describes, r.admitted) == (1, [1])
        await r.link.stop(1.0)

    run(scenario)
    assert r.link.state is LinkState.CLOSED
    assert r.channel.closed
    assert r.link.tracker.last == 2
    delivery = r.mailbox.take_any(0)
    assert delivery is not None
    assert delivery.batch["collector", "worker_id"].unique().tolist() == [0]
    assert r.backoff.attempts == []


def test_link_stops_when_another_learner_takes_the_session_over() -> None:
    r = rig(FakeChannel([[opened(), end("TAKEN_OVER")]]))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: finished(r))

    run(scenario)
    assert r.link.state is LinkState.LOST  # AfterSession.STOP: never retried
    assert len(r.channel.calls) == 1
    assert r.backoff.attempts == []
    assert r.mailbox.snapshot()[0].alive is False


def test_link_retries_after_the_backoff_when_the_actor_ends_the_session() -> None:
    r = rig(FakeChannel([[opened(), batch(1), end("ERROR", "env pool broke")], [resumed_after(1)]]))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    assert r.ledger.failures == {0: 1}
    assert r.ledger.reconnects == {0: 1}
    assert r.backoff.attempts == [0]  # AfterSession.RETRY, after the first delay
    # The same actor process: the new session resumes after the last batch received.
    second = r.channel.calls[1].open_request
    assert (second.resume_epoch, second.resume_after_seq) == (1, 1)
    assert second.learner_id == "learner-under-test"


def test_link_backoff_grows_over_failed_attempts_and_restarts_after_a_batch() -> None:
    unreachable = ActorUnavailableError(f"{ADDRESS}: connection refused")
    channel = FakeChannel(
        [[opened(), batch(1), ActorUnavailableError("stream broke")], [resumed_after(1)]],
        [unreachable, unreachable, unreachable, described()],
    )
    r = rig(channel)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    # Three refused connections grow the backoff; a stream that delivered starts over.
    assert r.backoff.attempts == [0, 1, 2, 0]
    assert r.ledger.failures == {0: 4}
    assert r.mailbox.snapshot()[0].buffered == 1


def test_link_backoff_restarts_when_a_stream_opened_before_it_broke() -> None:
    unreachable = ActorUnavailableError(f"{ADDRESS}: connection refused")
    channel = FakeChannel(
        [[opened(), ActorUnavailableError("stream broke")], [opened()]],
        [unreachable, unreachable, described()],
    )
    r = rig(channel)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    assert r.backoff.attempts == [0, 1, 0]  # the actor was back: a new outage began
    assert r.ledger.failures == {0: 3}


def test_link_retries_a_stream_that_owes_a_batch_and_stays_silent() -> None:
    # Both sessions open and then say nothing while credits are outstanding (a
    # partition that drops packets without resetting the connection).
    r = rig(FakeChannel([[opened()], [opened()]]), batch_timeout=0.05)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2)
        await r.link.stop(1.0)

    run(scenario)
    assert r.channel.calls[0].cancelled  # the stalled call was torn down
    assert r.ledger.failures[0] >= 1
    assert r.backoff.attempts[0] == 0


def _restart_after_the_first_batch(
    meanwhile: Callable[[Rig], None] = lambda r: None,
) -> Rig:
    """A link restarted with ``frames_per_batch=4`` once batch 1 is buffered (``meanwhile``
    right after the restart), run until its second session streams."""
    r = rig(FakeChannel([[opened(), batch(1)], [opened(next_seq=2)]]))
    resized = dataclasses.replace(SETTINGS, frames_per_batch=4)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 1)
        r.link.restart(resized)
        meanwhile(r)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    return r


def test_link_reopens_at_once_with_fresh_settings_on_restart() -> None:
    r = _restart_after_the_first_batch()
    assert r.backoff.attempts == []  # AfterSession.REOPEN: no backoff, no failure
    assert r.ledger.failures == {}
    second = r.channel.calls[1].open_request
    assert (second.resume_epoch, second.resume_after_seq) == (0, 0)  # a fresh session
    assert second.settings.frames_per_batch == 4


def test_link_follows_an_actor_that_restarted_under_a_new_epoch() -> None:
    channel = FakeChannel(
        [[opened(epoch=1), batch(1), ActorUnavailableError("actor died")], [opened(epoch=2)]],
        [described(epoch=1), described(epoch=2)],
    )
    r = rig(channel)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    assert r.ledger.restarts == {0: 1}
    assert r.ledger.lost_in_progress == 2  # one trajectory per env of the old process
    assert r.admitted == [1, 2]  # re-admitted (weights pushed) before its data is used
    assert r.link.tracker.epoch == 2


def test_link_counts_an_actor_restarted_before_its_first_session_opened() -> None:
    """The epoch at construction is the one to compare: no session had set the tracker's."""
    channel = FakeChannel(
        [[ActorUnavailableError("actor died")], [opened(epoch=2)]], [described(epoch=2)]
    )
    r = rig(channel)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    assert r.ledger.restarts == {0: 1}
    assert r.ledger.lost_in_progress == 0  # no session: nothing was in progress for us
    assert r.admitted[-1] == 2  # admitted (weights pushed) before its data is used


def test_link_stays_down_while_the_address_reports_another_worker_id() -> None:
    channel = FakeChannel(
        [[opened(), ActorUnavailableError("stream broke")]],
        [described(), described(worker_id=5)],
    )
    r = rig(channel)

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: len(r.backoff.attempts) >= 3)  # every re-describe is refused
        assert r.link.state is LinkState.DOWN
        assert r.mailbox.snapshot()[0].alive is False
        await r.link.stop(1.0)

    run(scenario)
    assert len(r.channel.calls) == 1  # no session opens on another worker's actor
    assert r.backoff.attempts[:3] == [0, 1, 2]


def test_link_raises_the_env_error_after_env_failures_in_a_row() -> None:
    failure = pb.EnvFailure(
        env="CartPole-v1", exception_type="RuntimeError", exception_message="boom"
    )
    sessions = [[opened(), end("ERROR", "env raised", failure)]] * ENV_FAILURE_ATTEMPTS
    r = rig(FakeChannel(sessions))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: finished(r))

    run(scenario)
    assert r.link.state is LinkState.FAILED  # AfterSession.STOP
    assert r.backoff.attempts == [0, 1]  # retried with a growing backoff until then
    with pytest.raises(EnvError, match="boom") as raised:
        r.mailbox.take_any(0)
    assert raised.value.worker_id == 0


def test_link_counts_only_env_failures_in_a_row_a_batch_starts_them_over() -> None:
    """An env that fails now and then, with batches between, is retried for good: only
    ``ENV_FAILURE_ATTEMPTS`` sessions in a row without a batch stop the link."""
    failure = pb.EnvFailure(env="CartPole-v1", exception_type="RuntimeError", exception_message="x")
    env_end = end("ERROR", "env raised", failure)
    sessions = [[opened(), env_end]] * (ENV_FAILURE_ATTEMPTS - 1)
    sessions += [[opened(), batch(1), env_end]]  # a batch, then the env fails again
    sessions += [[opened(next_seq=2), env_end]] * (ENV_FAILURE_ATTEMPTS - 2)
    sessions += [[opened(next_seq=2), batch(2)]]
    r = rig(FakeChannel(sessions))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 2 or finished(r))
        assert r.link.state is LinkState.STREAMING
        await r.link.stop(1.0)

    run(scenario)
    assert len(r.channel.calls) == len(sessions)
    assert [d.seq for d in (r.mailbox.take_any(0), r.mailbox.take_any(0)) if d] == [1, 2]


def test_link_a_reconnection_asks_only_for_the_random_frames_left() -> None:
    """``init_random_frames`` count this collector's frames: a session replacing a broken one
    asks for what is left, not for the whole count again (the actor counts per session)."""
    random_settings = dataclasses.replace(SETTINGS, init_random_frames=12)
    r = rig(
        FakeChannel(
            [[opened(), batch(1), ActorUnavailableError("stream broke")], [resumed_after(1)]]
        )
    )

    async def scenario() -> None:
        r.link.start(random_settings)
        await until(lambda: len(r.channel.calls) == 2 and r.link.state is LinkState.STREAMING)
        await r.link.stop(1.0)

    run(scenario)
    first, second = (call.open_request for call in r.channel.calls)
    assert (first.settings.init_random_frames, second.settings.init_random_frames) == (12, 6)


def test_link_a_session_the_actor_ends_on_an_error_during_a_restart_is_a_failure() -> None:
    """Only the ``CLOSED`` answering the learner's close reopens at once; an actor that ends
    the session on an error meanwhile is counted and retried after the backoff."""
    r = _restart_after_the_first_batch(
        lambda r: r.channel.calls[0]._responses.put_nowait(end("ERROR", "env pool broke"))
    )
    assert r.ledger.failures == {0: 1}
    assert r.backoff.attempts == [0]  # AfterSession.RETRY, not REOPEN
    assert r.channel.calls[1].open_request.settings.frames_per_batch == 4


def test_link_an_actor_that_refuses_the_open_counts_as_down() -> None:
    """A refused ``open`` (a busy actor) is a failed connection attempt: the actor is down,
    so strict sync rounds fail fast instead of waiting for it until their deadline."""
    busy = ActorUnavailableError("busy: another learner's session is open")
    r = rig(FakeChannel([[busy]]), RecordingBackoff(wait=60.0))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.backoff.attempts == [0])
        assert r.link.state is LinkState.DOWN
        assert r.mailbox.snapshot()[0].alive is False
        await r.link.stop(1.0)

    run(scenario)
    assert r.ledger.failures == {0: 1}


def test_link_stops_on_a_bug_instead_of_retrying_it() -> None:
    r = rig(FakeChannel([], [ValueError("a bug in the learner")]))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: finished(r))

    run(scenario)
    assert r.link.state is LinkState.FAILED
    assert r.backoff.attempts == []
    with pytest.raises(ValueError, match="a bug") as raised:
        r.mailbox.take_any(0)
    assert any(ADDRESS in note for note in raised.value.__notes__)


def test_link_stop_while_waiting_to_retry_ends_the_loop() -> None:
    r = rig(FakeChannel([], [ActorUnavailableError("refused")]), RecordingBackoff(wait=60.0))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.backoff.attempts == [0])
        await r.link.stop(1.0)

    run(scenario)
    assert r.link.state is LinkState.CLOSED
    assert r.channel.closed


def test_link_follows_a_moved_actor_as_a_restart_keeping_its_slot_and_seqs() -> None:
    r = rig(FakeChannel([[opened(), batch(1)]]))  # then silent: a cut host
    moved = FakeChannel([[opened(epoch=2), batch(1, epoch=2)]], [described(epoch=2)])
    moved.address = "fake:2"

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 1)
        await r.link.move(moved, dataclasses.replace(described(epoch=2), address="fake:2"))
        await until(lambda: moved.calls and r.link.state is LinkState.STREAMING)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 2)
        await r.link.stop(1.0)

    run(scenario)
    assert r.channel.closed
    assert r.channel.calls[0].cancelled
    assert r.link.address == "fake:2"
    assert r.admitted == [1, 2]  # re-admitted (the newest weights) before its frames count
    assert r.ledger.restarts == {0: 1}
    assert r.ledger.reconnects == {0: 1}
    assert (r.link.tracker.gaps, r.link.tracker.duplicates) == (0, 0)
    second = moved.calls[0].open_request
    assert (second.resume_epoch, second.resume_after_seq) == (1, 1)


def test_link_asks_a_local_actor_for_segments_and_reads_them() -> None:
    batches = [shm_batch(1), shm_batch(2)]
    r = rig(FakeChannel([[opened(), *batches]]), shm=local_route())

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 2)
        await r.link.stop(1.0)

    try:
        run(scenario)
    finally:
        for response in batches:
            remove_segment(response.chunk.shm.name)
    assert r.channel.calls[0].open_request.shm_batches
    assert r.link._shm is not None
    assert r.link._shm.stats()["shm_batches"] == 2
    assert r.ledger.failures == {}
    delivery = r.mailbox.take_any(0)
    assert delivery is not None
    assert torch.equal(delivery.batch["observation"], torch.zeros(2, 3, 4))


@pytest.mark.parametrize(
    "flaw", ["two chunks", "index 1", "another seq", "data too", "size", "crc32c"]
)
def test_link_refuses_a_malformed_segment_chunk(flaw: str) -> None:
    response = shm_batch(1, name="rlfleet-shm-1-" + "0" * 32)
    chunk = response.chunk
    if flaw == "two chunks":
        chunk.count = 2
    elif flaw == "index 1":
        chunk.index = 1
    elif flaw == "another seq":
        chunk.seq = 2
    elif flaw == "data too":
        chunk.data = b"x"
    elif flaw == "size":
        chunk.shm.size += 1
    else:
        chunk.shm.crc32c ^= 1  # the control and the batch's info disagree
    r = rig(FakeChannel([[opened(), response], [opened(), batch(1)]]), shm=local_route())

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 1)
        await r.link.stop(1.0)

    run(scenario)
    assert r.ledger.failures == {0: 1}  # a protocol error, not a fallback to bytes
    assert r.link._shm is not None
    assert r.link._shm.stats()["shm_batch_fallbacks"] == 0
    assert r.channel.calls[1].open_request.shm_batches  # the next session still asks
    assert r.link.tracker.last == 1


def test_link_refuses_a_segment_it_did_not_ask_for() -> None:
    hostile = shm_batch(1, name="rlfleet-shm-1-" + "0" * 32)
    r = rig(FakeChannel([[opened(), hostile], [opened(), batch(1)]]))

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 1)
        await r.link.stop(1.0)

    run(scenario)
    assert not any(call.open_request.shm_batches for call in r.channel.calls)
    assert r.ledger.failures == {0: 1}  # a protocol error: the stream is dropped and retried
    assert r.link.tracker.last == 1


@pytest.mark.parametrize(
    "name", ["rlfleet-shm-1-" + "0" * 32, "../../etc/passwd", "rlfleet-shm-1-" + "f" * 31]
)
def test_link_falls_back_to_bytes_when_a_segment_cannot_be_read(name: str) -> None:
    r = rig(FakeChannel([[opened(), shm_batch(1, name)], [opened(), batch(1), batch(2)]]))
    r.link._shm = local_route()

    async def scenario() -> None:
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 2)
        await r.link.stop(1.0)

    run(scenario)
    first, second = (call.open_request for call in r.channel.calls)
    assert (first.shm_batches, second.shm_batches) == (True, False)
    assert (second.resume_epoch, second.resume_after_seq) == (1, 0)  # batch 1 comes again
    assert r.link._shm.stats()["shm_batch_fallbacks"] == 1
    assert r.link.tracker.last == 2  # batch 1 once, as bytes, then batch 2


@pytest.mark.parametrize("claim_after_s", [0.0, 60.0], ids=["slow-batches", "quick-batches"])
def test_link_a_waiting_take_claims_a_batch_as_it_arrives_for_actors_with_slow_batches(
    monkeypatch: pytest.MonkeyPatch, claim_after_s: float
) -> None:
    """The credit for the next batch leaves as batch 2 arrives (before the link accepts it)
    when the actor's last batch took ``CLAIM_AFTER_S`` or more; else when batch 2 is taken."""
    monkeypatch.setattr(_link, "CLAIM_AFTER_S", claim_after_s)
    seen_at_credit: list[int] = []  # the last seq the link had accepted when a credit left
    loops: list[asyncio.AbstractEventLoop] = []

    def send_credit(worker_id: int, batches: int) -> None:
        seen_at_credit.append(r.link.tracker.last)
        stream = r.link._stream  # the credit reaches the session (batch 2 needs one)
        if stream is not None:
            loops[0].call_soon_threadsafe(stream.grant, batches)

    mailbox = Mailbox(1, send_credit=send_credit, send_ack=lambda w, e, s: None)
    r = rig(FakeChannel([[opened(), batch(1)]]), mailbox=mailbox)

    async def scenario() -> None:
        loops.append(asyncio.get_running_loop())
        r.link.start(SETTINGS)
        await until(lambda: r.mailbox.snapshot()[0].buffered == 1)
        first = r.mailbox.take_any(0)
        assert first is not None
        assert first.seq == 1
        take = asyncio.ensure_future(asyncio.to_thread(r.mailbox.take_any, 5.0))
        await until(lambda: r.mailbox._waiting_takes > 0)
        r.channel.calls[0]._responses.put_nowait(batch(2))
        second = await take
        assert second is not None
        assert second.seq == 2
        await r.link.stop(1.0)

    run(scenario)
    assert seen_at_credit == ([1, 1] if claim_after_s == 0.0 else [1, 2])


class CountingLoop(LoopThread):
    """The learner's loop thread, counting the callbacks other threads hand it."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.handed += 1
        super().call_soon(fn, *args)


@pytest.mark.parametrize("acks_in_credit", [True, False], ids=["one-message", "older-actor"])
def test_acks_and_credits_reach_the_stream_in_one_wake_up(acks_in_credit: bool) -> None:
    """Sends queued while the loop is busy go in one wake-up: per actor, the highest ack of
    the process its stream is open on and the sum of the credits; in one ``credit`` message
    when the actor reads its ``ack_seq``, else an ``ack`` then a ``credit`` (an actor that
    predates the field ignores it). An ack of another process's batch is not sent."""
    loop = CountingLoop()
    streams = OpenStreams(loop)
    reply = opened()
    reply.opened.acks_in_credit = acks_in_credit
    channel = FakeChannel([[reply]])

    async def attach() -> CollectStream:
        stream = CollectStream(
            channel,
            SETTINGS,
            credits=0,
            resume=(0, 0),
            take_over=False,
            learner_id="l",
            num_envs=2,
            worker_id=0,
        )
        await stream.opened(5)
        streams.attach(0, stream, epoch=1)
        return stream

    stream = loop.run(attach(), timeout=5)
    busy, release = threading.Event(), threading.Event()
    loop.call_soon(lambda: (busy.set(), release.wait(5)))  # the loop is busy meanwhile
    assert busy.wait(5)
    handed = loop.handed
    streams.ack(0, 1, 5)
    streams.grant(0, 2)
    streams.ack(0, 1, 6)
    streams.grant(0, 1)
    streams.ack(0, 7, 9)  # a batch of the process before a restart: never sent to this one
    streams.ack(1, 1, 3)  # no stream open for actor 1: dropped
    release.set()
    expected = [("credit", 3, 6)] if acks_in_credit else [("ack", 0, 6), ("credit", 3, 0)]
    deadline = time.monotonic() + 5
    while len(channel.calls[0].requests) < 1 + len(expected) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # nothing more follows
    sent = channel.calls[0].requests[1:]
    assert [
        (r.WhichOneof("kind"), r.credit.batches, r.credit.ack_seq or r.ack.seq) for r in sent
    ] == expected
    assert loop.handed - handed == 1, "six sends queued while the loop was busy: one wake-up"
    loop.run(_cancelled(stream), timeout=5)
    loop.close(5)


async def _cancelled(stream: CollectStream) -> None:
    stream.cancel()
