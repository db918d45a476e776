"""Batches through shared memory from actors on the learner's host (real actor processes).

A local actor writes each batch into a segment and sends only its control; the learner reads
it into place and checks it. Nothing is lost or repeated: consecutive batches of each env
join up (the last frame's next observation is the next batch's first observation, unless
the episode ended there), which a dropped, doubled or stale batch breaks. A segment removed,
opened to other users or corrupted before the learner reads it sends that actor's batches as
bytes from then on, the refused batch included; the actor makes a new segment in its place.
A segment is filled again only once its batch is acked, and the segments of a SIGKILLed
actor are swept by the next learner or actor.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import time
from collections.abc import Iterator

import grpc
import pytest
import torch
from tensordict import TensorDictBase

from common.checksum import crc32c
from common.config import CollectSettings
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.shm import SHM_ROOT, Segment, SegmentMaps, read_segment
from learner_client import GrpcCollector, LocalFleet, _shm
from learner_client._collect_stream import _open_request

FRAMES = 32  # per actor and batch: 2 envs x 16 steps


@pytest.fixture(scope="module")
def fleet():
    with LocalFleet(2, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0) as actors:
        yield actors


def segments_of(pids: list[int]) -> list[str]:
    """The /dev/shm segments the processes ``pids`` wrote."""
    prefixes = tuple(f"rlfleet-shm-{pid}-" for pid in pids)
    return [name for name in os.listdir(SHM_ROOT) if name.startswith(prefixes)]


def join_up(batches: list[TensorDictBase]) -> int:
    """Check that consecutive sync batches continue each env; the boundaries checked."""
    checked = 0
    for before, after in itertools.pairwise(batches):
        ended = before["next", "done"][..., -1, 0]
        last = before["next", "observation"][..., -1, :]
        first = after["observation"][..., 0, :]
        assert torch.equal(last[~ended], first[~ended]), "a batch was lost, repeated or stale"
        checked += int((~ended).sum())
    return checked


def collect(fleet: LocalFleet, batches: int, **kwargs) -> tuple[list[TensorDictBase], dict]:
    frames = FRAMES * fleet.num_actors
    with GrpcCollector(
        fleet.addresses, frames_per_batch=frames, total_frames=frames * batches, sync=True, **kwargs
    ) as collector:
        got = [batch.clone() for batch in collector]
        return got, collector.stats()


def test_batches_travel_through_shared_memory_whole_and_in_order(fleet):
    batches, stats = collect(fleet, 24)
    assert len(batches) == 24
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (48, 0)
    assert join_up(batches) > 24
    # Acked segments are filled again: far fewer segments than batches were ever made.
    assert 0 < len(segments_of(fleet.pids)) <= 2 * (4 + 2 + 4)  # max_credits + 2 held, 4 idle


def test_shared_memory_batches_off_sends_bytes(fleet):
    batches, stats = collect(fleet, 6, shared_memory_batches=False)
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (0, 0)
    assert join_up(batches) > 0


def _damage(path: str, damage: str) -> None:
    """What a hostile local process of the same user does to a segment."""
    if damage == "removed":
        os.unlink(path)
    elif damage == "opened to others":
        os.chmod(path, 0o644)
    else:
        with open(path, "r+b") as file:
            byte = file.read(1)
            file.seek(0)
            file.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", ["removed", "opened to others", "corrupted"])
def test_a_damaged_segment_sends_that_actors_batches_as_bytes(fleet, monkeypatch, damage):
    reader = SegmentMaps.reader
    spoiled: list[str] = []

    @contextlib.contextmanager
    def damaged_first(maps: SegmentMaps, control: Segment):
        if len(spoiled) < 3:  # between the actor's write and the learner's read
            spoiled.append(control.name)
            _damage(os.path.join(SHM_ROOT, control.name), damage)
        with reader(maps, control) as read_at:
            yield read_at

    frames = FRAMES * fleet.num_actors
    collector = GrpcCollector(
        fleet.addresses, frames_per_batch=frames, total_frames=frames * 12, sync=True
    )
    with collector:
        stream = iter(collector)
        batches = [next(stream).clone() for _ in range(2)]
        assert collector.stats()["shm_batches"] == 4
        monkeypatch.setattr(SegmentMaps, "reader", damaged_first)
        batches += [batch.clone() for batch in stream]
        stats = collector.stats()
    assert len(batches) == 12
    assert len(spoiled) == 2  # each actor's next batch; both send bytes from then on
    assert (stats["shm_batch_fallbacks"], stats["shm_batches"]) == (2, 4)
    assert join_up(batches) > 12
    monkeypatch.undo()
    # The damage stays with the damaged segments: the actors make new ones.
    _, stats = collect(fleet, 4)
    assert (stats["shm_batches"], stats["shm_batch_fallbacks"]) == (8, 0)


class _Session:
    """A raw Collect session that asks for shared-memory batches, as a learner would."""

    def __init__(self, address: str, credits: int) -> None:
        settings = CollectSettings(frames_per_batch=FRAMES, total_frames=-1)
        self._requests: queue.Queue[pb.CollectRequest | None] = queue.Queue()
        self._requests.put(_open_request(settings, credits, (0, 0), True, "raw", True))
        self._channel = grpc.insecure_channel(address)
        stub = pb_grpc.ActorServiceStub(self._channel)
        self.responses = stub.Collect(self._feed(), timeout=60)
        assert next(self.responses).WhichOneof("kind") == "opened"

    def _feed(self) -> Iterator[pb.CollectRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def batch(self) -> pb.BatchChunk:
        return next(self.responses).chunk

    def send(self, request: pb.CollectRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        self._requests.put(pb.CollectRequest(close=pb.CloseSession()))
        self._requests.put(None)
        list(self.responses)
        self._channel.close()


def test_an_actor_fills_a_segment_again_only_after_its_batch_is_acked(fleet):
    session = _Session(fleet.addresses[0], credits=3)
    try:
        chunks = [session.batch() for _ in range(3)]
        for chunk in chunks:
            assert chunk.HasField("shm")
            assert (chunk.count, chunk.data) == (1, b"")
            control = Segment(chunk.shm.name, chunk.shm.size, chunk.shm.crc32c)
            assert crc32c(read_segment(control)) == chunk.info.crc32c
            assert os.stat(os.path.join(SHM_ROOT, chunk.shm.name)).st_mode & 0o777 == 0o600
        names = [chunk.shm.name for chunk in chunks]
        assert len(set(names)) == 3  # unacked: three batches, three segments
        session.send(pb.CollectRequest(ack=pb.Ack(seq=chunks[0].seq)))
        session.send(pb.CollectRequest(credit=pb.Credit(batches=1)))
        assert session.batch().shm.name == names[0]  # the acked one, filled again
    finally:
        session.close()


def test_an_actor_with_shared_memory_off_sends_bytes_when_asked():
    with LocalFleet(1, "CartPole-v1", num_envs=2, extra_args=["--no-shared-memory"]) as solo:
        session = _Session(solo.addresses[0], credits=1)
        try:
            chunk = session.batch()
            assert not chunk.HasField("shm")
            assert chunk.HasField("info")
            assert len(chunk.data) == chunk.info.total_bytes
        finally:
            session.close()
        batches, stats = collect(solo, 3)
    assert (stats["shm_batches"], len(batches)) == (0, 3)


def test_the_segments_of_a_killed_actor_are_swept():
    with LocalFleet(1, "CartPole-v1", num_envs=2, grace_period=1.0) as solo:
        collect(solo, 3)
        pid = solo.pids[0]
        assert segments_of([pid])
        solo.kill(solo.worker_ids[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while solo.is_alive(solo.worker_ids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert segments_of([pid])  # SIGKILL left them behind
        _shm.ShmRoute(enabled=True)  # the next learner (or actor) on this host sweeps them
        assert segments_of([pid]) == []


def test_the_segments_of_an_actor_killed_under_a_collector_go_at_its_shutdown():
    """A Ray worker or a fleet's server SIGKILLed mid-collection left its segments until the
    next learner or actor started; the collector's shutdown sweeps them."""
    with LocalFleet(1, "CartPole-v1", num_envs=2, grace_period=1.0) as solo:
        collector = GrpcCollector(solo.addresses, frames_per_batch=FRAMES, sync=True)
        collector.next()
        (pid,), (worker_id,) = solo.pids, solo.worker_ids
        assert segments_of([pid])
        solo.kill(worker_id, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while solo.is_alive(worker_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert segments_of([pid])  # SIGKILL left them behind
        collector.shutdown()
        assert segments_of([pid]) == []
