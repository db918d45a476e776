"""Weight pushes through shared memory to actors on the learner's host (real actor processes).

A push to a local actor travels as a segment under /dev/shm plus its control; the weights it
applies equal the pushed ones, and ``stats()`` counts it. A segment deleted or corrupted
before the actor reads it is refused (nothing applied) and the bytes follow. A hostile
control is refused with its reason and leaves the actor serving.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
import safetensors.torch
import torch
from learner_fleet import cartpole_policy

from actor_service._cli._main import parse_config
from common.checksum import crc32c
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.shm import SHM_ROOT, SharedBuffer, write_segment
from learner_client import GrpcCollector, LocalFleet, WeightPushError, WeightPushSettings, _shm
from learner_client._slabs import BlobBuffers


@pytest.fixture(scope="module")
def fleet():
    with LocalFleet(2, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0) as actors:
        yield actors


def actor_policy(address: str) -> dict[str, torch.Tensor]:
    """The policy tensors an actor holds, read back with GetState."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ActorServiceStub(channel)
        chunks = list(stub.GetState(pb.GetStateRequest(), timeout=30))
    blob = b"".join(c.chunk for c in chunks if c.WhichOneof("kind") == "chunk")
    state = safetensors.torch.load(blob)
    return dict(state)


def same_weights(held: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    prefix = "models/policy/weights/"
    wanted = module.state_dict()
    return all(torch.equal(held[prefix + name], tensor) for name, tensor in wanted.items())


def ours() -> set[str]:
    return {n for n in os.listdir(SHM_ROOT) if n.startswith(f"rlfleet-shm-{os.getpid()}-")}


def test_push_through_shared_memory_applies_the_pushed_weights(fleet):
    before = ours()
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        policy = cartpole_policy()
        version = collector.update_policy_weights_(policy)[0]
        stats = collector.stats()
        assert stats["shm_pushes"] == 2
        assert stats["shm_fallbacks"] == 0
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)
        assert collector.policy_version == version
    assert ours() <= before  # the push's segment and the probe are gone


def test_shared_memory_off_sends_the_bytes(fleet):
    push = WeightPushSettings(shared_memory=False)
    with GrpcCollector(fleet.addresses, frames_per_batch=4, weight_push=push) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)
        stats = collector.stats()
        assert stats["shm_pushes"] == 0
        assert stats["shm_fallbacks"] == 0
        assert same_weights(actor_policy(fleet.addresses[0]), policy)


def damage_named_segments(monkeypatch, damage: str) -> list[str]:
    """Delete or corrupt every segment the learner names to actors (its probe aside)."""
    control = SharedBuffer.control
    spoiled: list[str] = []

    def damaged(buffer, crc):
        segment = control(buffer, crc)
        spoiled.append(segment.name)
        path = os.path.join(SHM_ROOT, segment.name)
        if damage == "delete":
            os.unlink(path)
        else:
            with open(path, "r+b") as file:
                file.seek(segment.size // 2)
                byte = file.read(1)
                file.seek(segment.size // 2)
                file.write(bytes([byte[0] ^ 0xFF]))
        return segment

    monkeypatch.setattr(SharedBuffer, "control", damaged)
    return spoiled


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_damaged_copy_falls_back_to_the_bytes(fleet, monkeypatch, damage):
    """A blob copied into a segment (no blob segment: e.g. a learner with CUDA): the learner's
    own copy is intact, so the bytes follow a refused segment and every actor applies them."""
    monkeypatch.setattr(_shm.ShmRoute, "make", lambda route, nbytes: None)
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        spoiled = damage_named_segments(monkeypatch, damage)
        policy = cartpole_policy()
        version = collector.update_policy_weights_(policy)[0]
        stats = collector.stats()
        assert stats["shm_pushes"] == 0
        assert stats["shm_fallbacks"] == 2
        assert collector.policy_version == version
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)
        assert spoiled
        assert not set(spoiled) & ours()  # a refused segment is not kept
        monkeypatch.undo()
        collector.update_policy_weights_(cartpole_policy())  # a fresh segment serves again
        assert collector.stats()["shm_pushes"] == 2


def test_deleted_blob_segment_falls_back_to_the_bytes(fleet, monkeypatch):
    """A blob encoded into its segment, the segment's name removed: the bytes follow."""
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        spoiled = damage_named_segments(monkeypatch, "delete")
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)
        assert (collector.stats()["shm_pushes"], collector.stats()["shm_fallbacks"]) == (0, 2)
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)
        assert spoiled
        monkeypatch.undo()
        collector.update_policy_weights_(cartpole_policy())  # a fresh segment serves again
        assert collector.stats()["shm_pushes"] == 2


def test_corrupted_blob_segment_is_never_applied(fleet, monkeypatch):
    """Another process writes into the segment a blob was encoded into: that is the learner's
    blob too, so neither the segment nor the bytes pass the actors' checks. The push fails,
    every actor keeps its weights, and the next push (a fresh segment) applies."""
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        old = cartpole_policy()
        collector.update_policy_weights_(old)
        spoiled = damage_named_segments(monkeypatch, "corrupt")
        with pytest.raises(WeightPushError, match=r"DATA_LOSS: blob crc32c mismatch") as failed:
            collector.update_policy_weights_(cartpole_policy())
        assert str(failed.value).count("crc32c mismatch") == 2  # both actors, nothing applied
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), old)
        assert spoiled
        assert not set(spoiled) & ours()
        monkeypatch.undo()
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)


def test_segments_are_reused_push_after_push(fleet):
    """Pushes are encoded into segments kept for the next pushes of the model (no new pages):
    two of them, as the last push stays whole for re-sends; gone when the collector is."""
    before = ours()
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        policy = cartpole_policy()
        kept: set[str] = set()
        for push in range(5):
            with torch.no_grad():
                next(policy.parameters()).add_(1.0)
            collector.update_policy_weights_(policy)
            kept |= ours() - before
            assert len(ours() - before) == min(push + 1, 2)
            for address in fleet.addresses:
                assert same_weights(actor_policy(address), policy)
        assert len(kept) == 2  # the same two, push after push
        assert collector.stats()["shm_pushes"] == 10
    assert ours() <= before


def test_a_blob_segment_is_named_as_it_lies_and_reused_once_let_go():
    """A blob encoded into a blob segment is named without a copy; one still viewed is not
    filled again, one let go is; a refused one is never named again; close() removes names."""
    before = ours()
    route = _shm.ShmRoute(enabled=True)
    route.admit(7, route.identity, probe_ok=True)
    buffers = BlobBuffers(route)
    blob = buffers.take("policy", 4096)[:4096]  # a view, as an encoded blob is
    blob.copy_(torch.arange(4096) % 251)
    segment = route.write({0: (blob.numpy().data, None)})[0]
    assert segment.name in ours() - before
    with open(os.path.join(SHM_ROOT, segment.name), "rb") as file:
        assert file.read() == blob.numpy().tobytes()  # the blob itself, not a copy
    assert segment.crc32c == crc32c(blob.numpy().data)
    route.release([segment])
    first = blob.data_ptr()
    assert buffers.take("policy", 4096).data_ptr() != first  # still viewed: not filled again
    del blob
    assert buffers.take("policy", 4096).data_ptr() == first  # let go: filled again
    blob = buffers.take("policy", 4096)[:4096]
    segment = route.write({0: (blob.numpy().data, None)})[0]
    route.release([segment], spoiled={segment.name})
    assert segment.name not in ours()  # refused: never named again
    again = route.write({0: (blob.numpy().data, None)})[0]
    assert again.name != segment.name  # copied into a segment of the route's own
    route.release([again])
    blob.fill_(7)
    route.close()
    assert ours() <= before
    assert bool((blob == 7).all())  # the caller's memory outlives the names


def test_an_actor_applies_a_whole_push_from_the_segment_itself(fleet):
    """A whole push is applied where it lies: each actor maps the segment the learner named
    (kept mapped for the next push into it) instead of reading it into a buffer of its own."""
    before = ours()
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)
        (named,) = ours() - before
        for pid in fleet.pids:
            with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
                assert named in maps.read()
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)


def test_a_segment_an_actor_still_holds_is_never_filled_again(fleet):
    """An actor applies a push where it lies, holding the segment (a shared flock) from its
    check to its copy; the learner fills a segment only under the exclusive lock, so a
    segment still held (here by this test, as by an actor past its deadline) is left as it
    is and the next pushes take others."""
    before = ours()
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        first = cartpole_policy()
        collector.update_policy_weights_(first)
        (held,) = ours() - before
        path = os.path.join(SHM_ROOT, held)
        with open(path, "rb") as file:
            fcntl.flock(file, fcntl.LOCK_SH)
            content = file.read()
            for _ in range(3):
                policy = cartpole_policy()
                collector.update_policy_weights_(policy)
                for address in fleet.addresses:
                    assert same_weights(actor_policy(address), policy)
            file.seek(0)
            assert file.read() == content  # never written while held (its name may be gone)
        assert collector.stats()["shm_pushes"] == 8
        assert collector.stats()["shm_fallbacks"] == 0


def test_a_segment_being_written_is_refused(fleet):
    """A segment whose writer holds its write lock is refused, nothing applied."""
    address = fleet.addresses[0]
    before = {m.model_id: m.version for m in describe(address).models}["policy"]
    blob = b"x" * 64
    buffer = SharedBuffer(len(blob))
    try:
        segment = buffer.fill(blob, crc32c(blob))
        assert buffer.lock_for_writing()
        control = pb.ShmSegment(name=segment.name, size=segment.size, crc32c=segment.crc32c)
        assert "is being written" in hostile_push(address, control, before + 1000, None)
    finally:
        buffer.close()
    assert {m.model_id: m.version for m in describe(address).models}["policy"] == before


def test_full_dev_shm_sends_the_bytes(fleet, monkeypatch):
    """No segment can be made (a container's small /dev/shm): local actors get the bytes."""

    def full(buffer, size, root=SHM_ROOT):
        raise OSError(28, "No space left on device")

    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        monkeypatch.setattr(SharedBuffer, "__init__", full)
        policy = cartpole_policy()
        collector.update_policy_weights_(policy)
        stats = collector.stats()
        assert (stats["shm_pushes"], stats["shm_fallbacks"]) == (0, 2)
        for address in fleet.addresses:
            assert same_weights(actor_policy(address), policy)


def hostile_push(address: str, control: pb.ShmSegment, version: int, total: int | None) -> str:
    """Why the actor refused the push: its ``shm_refused``, or its error status."""
    header = pb.WeightsHeader(
        model_id="policy",
        version=version,
        total_bytes=control.size if total is None else total,
        crc32c=control.crc32c,
    )
    header.shm.CopyFrom(control)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ActorServiceStub(channel)
        try:
            reply = stub.PushWeights(iter([pb.PushWeightsRequest(header=header)]), timeout=30)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    assert reply.version < version
    return reply.shm_refused


def describe(address: str) -> pb.DescribeResponse:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=30)


def foreign_segment(mode: int, owner: int | None) -> pb.ShmSegment:
    segment = write_segment(b"x" * 64)
    path = os.path.join(SHM_ROOT, segment.name)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return pb.ShmSegment(name=segment.name, size=segment.size, crc32c=segment.crc32c)


def fifo_segment(size: int = 4) -> pb.ShmSegment:
    """A FIFO under a segment's name: any local user may make one in ``/dev/shm``."""
    name = f"rlfleet-shm-1-{os.urandom(16).hex()}"
    os.mkfifo(os.path.join(SHM_ROOT, name), 0o600)
    return pb.ShmSegment(name=name, size=size, crc32c=0)


HUGE = pb.ShmSegment(name=f"rlfleet-shm-1-{'0' * 32}", size=2**64 - 1, crc32c=0)
#: case: (the control, the header's total_bytes (None: the control's size), the reason).
HOSTILE = {
    "bad name": (lambda: pb.ShmSegment(name="rlfleet-shm-1-zz", size=4, crc32c=0), None, "pattern"),
    "traversal": (
        lambda: pb.ShmSegment(name="../../etc/passwd", size=4, crc32c=crc32c(b"root")),
        None,
        "pattern",
    ),
    "huge size": (lambda: HUGE, None, "RESOURCE_EXHAUSTED: blob of 18446744073709551615 bytes"),
    "huge control size": (lambda: HUGE, 64, "differs from the push's total_bytes"),
    "readable by others": (lambda: foreign_segment(0o644, None), None, "readable or writable"),
    "foreign owner": (lambda: foreign_segment(0o600, 65534), None, "another user"),
    "fifo": (fifo_segment, None, "not a regular file"),  # opening one used to block forever
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_control_is_refused_and_the_actor_keeps_serving(fleet, case):
    if case == "foreign owner" and os.geteuid() != 0:
        pytest.skip("making a file of another user takes root")
    make, total, reason = HOSTILE[case]
    address = fleet.addresses[0]
    before = {m.model_id: m.version for m in describe(address).models}["policy"]
    control = make()
    try:
        refusal = hostile_push(address, control, before + 1000, total)
    finally:
        _shm.remove_segment(control.name)
    assert reason in refusal
    assert {m.model_id: m.version for m in describe(address).models}["policy"] == before
    with GrpcCollector([address], frames_per_batch=4) as collector:
        collector.update_policy_weights_(cartpole_policy())
        assert collector.stats()["shm_pushes"] == 1
        assert collector.next().numel() == 4


def test_a_describe_probe_is_read_only_when_it_is_a_probe(fleet):
    """The probe is read on the actor's event loop: a FIFO or a large file must not stall it."""
    address = fleet.addresses[0]
    probe = write_segment(os.urandom(32))
    large = write_segment(os.urandom(1 << 20))  # a real segment, but not a probe
    fifo = fifo_segment(32)
    try:
        for control, expected in ((fifo, False), (large, False), (probe, True)):
            request = pb.DescribeRequest()
            request.shm_probe.CopyFrom(
                pb.ShmSegment(name=control.name, size=control.size, crc32c=control.crc32c)
            )
            with grpc.insecure_channel(address) as channel:
                reply = pb_grpc.ActorServiceStub(channel).Describe(request, timeout=10)
            assert reply.shm_probe_ok is expected, control.name
    finally:
        for control in (probe, large, fifo):
            _shm.remove_segment(control.name)
    assert describe(address).models  # still serving


def test_actor_with_shared_memory_off_gets_the_bytes():
    args = ["--shared-memory", "false"]
    with LocalFleet(1, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0, extra_args=args) as one:
        assert not describe(one.addresses[0]).shm_probe_ok
        with GrpcCollector(one.addresses, frames_per_batch=4) as collector:
            policy = cartpole_policy()
            collector.update_policy_weights_(policy)
            assert collector.stats()["shm_pushes"] == 0
            assert same_weights(actor_policy(one.addresses[0]), policy)


def test_only_actors_of_this_host_that_read_the_probe_are_local():
    route = _shm.ShmRoute(enabled=True, identity="boot/host/1:2")
    route.admit(0, "boot/host/1:2", probe_ok=True)
    route.admit(1, "boot/host/1:2", probe_ok=False)  # another /dev/shm, or shm off there
    route.admit(2, "other-boot/host/1:2", probe_ok=True)  # a probe read elsewhere proves nothing
    assert [route.is_local(w) for w in range(3)] == [True, False, False]
    route.admit(0, "", probe_ok=True)  # described again from elsewhere
    assert not route.is_local(0)
    off = _shm.ShmRoute(enabled=False, identity="boot/host/1:2")
    off.admit(0, "boot/host/1:2", probe_ok=True)
    assert not off.is_local(0)
    assert off.probe() is None
    # A learner that could not read its own host identity proves nothing for anyone.
    blind = _shm.ShmRoute(enabled=True, identity="")
    assert blind.probe() is None
    blind.admit(0, "", probe_ok=True)
    assert not blind.is_local(0)


def test_a_starting_learner_sweeps_the_segments_of_a_killed_one():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"rlfleet-shm-{dead.pid}-{'ab' * 16}"
    path = os.path.join(SHM_ROOT, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    mine = write_segment(b"in flight")  # a live writer's segment stays
    try:
        _shm.ShmRoute(enabled=True)
        assert not os.path.exists(path)
        assert os.path.exists(os.path.join(SHM_ROOT, mine.name))
    finally:
        _shm.remove_segment(name)
        _shm.remove_segment(mine.name)


def test_a_route_dropped_without_shutdown_leaves_no_segment():
    """Kept segments go with their route (also at interpreter exit), not only at shutdown()."""
    before = ours()
    route = _shm.ShmRoute(enabled=True)
    segments = route.write({"a": (b"x" * 4096, None), "b": (b"y" * 64, None)})
    route.release([segments["a"]])  # one kept idle, one still busy
    assert {s.name for s in segments.values()} <= ours()
    del route
    gc.collect()
    assert ours() <= before


def test_the_actor_switch_reads_a_flag_or_a_variable():
    assert parse_config([]).shared_memory
    assert not parse_config(["--no-shared-memory"]).shared_memory
    assert not parse_config(["--shared-memory", "false"]).shared_memory
    assert not parse_config([], {"RLFLEET_SHARED_MEMORY": "0"}).shared_memory
    assert parse_config(["--shared-memory", "true"], {"RLFLEET_SHARED_MEMORY": "0"}).shared_memory


def test_a_forked_child_never_removes_its_parents_segments(tmp_path):
    """The route's cleanup in a process other than its own leaves every segment in place."""
    idle = [SharedBuffer(16, root=str(tmp_path))]
    busy = {"b": SharedBuffer(16, root=str(tmp_path))}
    blobs = {1: SharedBuffer(16, root=str(tmp_path))}
    names = sorted(b.name for b in [*idle, *busy.values(), *blobs.values()])

    def segments() -> list[str]:
        return sorted(n for n in os.listdir(tmp_path) if n.startswith("rlfleet-shm-"))

    _shm._close_all(os.getpid() + 1, idle, busy, blobs)  # as in a child forked since
    assert segments() == names
    assert len(idle) == len(busy) == len(blobs) == 1
    _shm._close_all(os.getpid(), idle, busy, blobs)  # the process that made them removes them
    assert segments() == []


def test_a_blob_segment_opened_up_between_pushes_is_not_named_again(fleet):
    """A kept blob segment whose mode was widened is let go, not named to the actors again
    (they would refuse it, and each push would fall back to bytes)."""
    before = ours()
    with GrpcCollector(fleet.addresses, frames_per_batch=4) as collector:
        policy = cartpole_policy()
        for _ in range(2):
            with torch.no_grad():
                next(policy.parameters()).add_(1.0)
            collector.update_policy_weights_(policy)
        for name in ours() - before:
            os.chmod(os.path.join(SHM_ROOT, name), 0o644)
        with torch.no_grad():
            next(policy.parameters()).add_(1.0)
        collector.update_policy_weights_(policy)
        assert collector.stats()["shm_fallbacks"] == 0
        assert collector.stats()["shm_pushes"] == 6


@contextlib.contextmanager
def _route(admitted: bool = True) -> Iterator[tuple[_shm.ShmRoute, BlobBuffers, set[str]]]:
    """A collector's route (with one local actor admitted), its blob buffers, and the names of
    ours under /dev/shm before them; on leaving, both closed and none of theirs left."""
    before = ours()
    route = _shm.ShmRoute(enabled=True)
    if admitted:
        route.admit(7, route.identity, probe_ok=True)
    buffers = BlobBuffers(route)
    try:
        yield route, buffers, before
    finally:
        buffers.clear()
        route.close()
    assert ours() <= before


def test_idle_segments_of_pushes_of_many_sizes_are_kept_at_most_idle_segments():
    """Blobs copied into segments (not encoded into one: a CUDA learner's, a delta's) of
    ever new sizes: once their pushes are in, at most IDLE_SEGMENTS segments stay under
    /dev/shm, the latest ones, and a push of a kept size fills its segment again."""
    names: list[str] = []
    with _route() as (route, _, before):
        for size in range(1, 2 * _shm.IDLE_SEGMENTS + 1):
            segment = route.write({0: (bytes([size]) * (64 * size), None)})[0]
            names.append(segment.name)
            route.release([segment])
            assert len(ours() - before) == min(size, _shm.IDLE_SEGMENTS)
        assert ours() - before == set(names[-_shm.IDLE_SEGMENTS :])  # the latest are kept
        size = 2 * _shm.IDLE_SEGMENTS
        again = route.write({0: (b"\0" * (64 * size), None)})[0]
        assert again.name == names[-1]  # reused, not made anew
        route.release([again])


def test_an_idle_segment_a_reader_still_holds_is_never_filled_again():
    """A blob copied into a segment (not encoded into one): once its push is in, the segment
    waits for the next push of its size, but one a reader still holds (a shared flock, as an
    actor past its push's deadline holds it) is never written: the next push takes another."""
    with _route() as (route, _, _before):
        first = route.write({0: (b"\1" * 4096, None)})[0]
        route.release([first])
        with open(os.path.join(SHM_ROOT, first.name), "rb") as file:
            fcntl.flock(file, fcntl.LOCK_SH)
            second = route.write({0: (b"\2" * 4096, None)})[0]
            assert second.name != first.name
            file.seek(0)
            assert file.read() == b"\1" * 4096  # never written while held
            route.release([second])
        third = route.write({0: (b"\3" * 4096, None)})[0]
        assert third.name == second.name  # an unheld idle segment is filled again
        route.release([third])


def _segment_bytes(name: str) -> bytes:
    with open(os.path.join(SHM_ROOT, name), "rb") as file:
        return file.read()


def test_part_of_a_blob_segment_is_copied_not_named_whole():
    """A blob lying at the start of a blob segment but shorter than it is not the segment:
    it is copied into a segment of its own size (a reader checks the size it is told)."""
    with _route() as (route, buffers, _before):
        whole = buffers.take("policy", 4096)
        whole.copy_(torch.arange(4096) % 251)
        part = whole[:1000]
        segment = route.write({0: (part.numpy().data, None)})[0]
        assert segment.size == 1000
        assert _segment_bytes(segment.name) == part.numpy().tobytes()
        assert segment.crc32c == crc32c(part.numpy().data)
        route.release([segment])


def test_a_blob_segment_serves_only_a_blob_of_its_own_size():
    """An idle blob segment larger than the next blob is not handed out for it (a reader is
    told the segment's size, so a blob in part of one would be copied again): the smaller
    blob gets a segment of its size, and is named as it lies."""
    with _route() as (route, buffers, _before):
        large = buffers.take("policy", 8192)
        large_at = large.data_ptr()
        del large  # let go: idle, but of another size
        small = buffers.take("policy", 4096)
        assert small.numel() == 4096
        assert small.data_ptr() != large_at
        small.copy_(torch.arange(4096) % 251)
        segment = route.write({0: (small.numpy().data, None)})[0]
        assert _segment_bytes(segment.name) == small.numpy().tobytes()  # its own, no copy
        small.fill_(3)
        assert _segment_bytes(segment.name) == small.numpy().tobytes()  # the blob's memory
        route.release([segment])


def test_a_blob_segment_let_go_loses_its_name_at_once():
    """A model keeps two blob buffers: the one let go for a third (a model whose size
    changed) loses its /dev/shm name at once, as clear() does for every kept one, while
    the route (the collector) goes on."""
    with _route() as (_, buffers, before):
        for size in (4096, 8192, 12288):
            buffers.take("policy", size)
        assert len(ours() - before) == 2  # the first one's name went with it
        buffers.clear()
        assert ours() <= before


def test_a_plain_blob_buffer_is_not_reused_once_actors_read_segments():
    """A model pushed before any actor was local kept a plain buffer; once one is, the next
    push's blob goes into a blob segment, named as it lies, not into the plain buffer."""
    with _route(admitted=False) as (route, buffers, _before):
        plain = buffers.take("policy", 4096)
        plain_at = plain.data_ptr()
        del plain  # let go: idle, but plain memory
        route.admit(7, route.identity, probe_ok=True)
        blob = buffers.take("policy", 4096)
        assert blob.data_ptr() != plain_at
        segment = route.write({0: (blob.numpy().data, None)})[0]
        blob.fill_(5)
        assert _segment_bytes(segment.name) == blob.numpy().tobytes()  # the blob itself
        route.release([segment])


def test_an_actor_whose_batch_failed_to_read_sends_bytes_from_then_on():
    route = _shm.ShmRoute(enabled=False, batches=True)
    try:
        route.admit(7, route.identity, probe_ok=True)
        route.admit(8, route.identity, probe_ok=True)
        assert route.batches_from(7)
        route.batch_failed(7)
        assert not route.batches_from(7)  # its next session is asked for bytes
        assert route.batches_from(8)  # the other local actor still writes segments
        assert route.stats()["shm_batch_fallbacks"] == 1
        route.admit(7, route.identity, probe_ok=True)  # a new Describe changes nothing
        assert not route.batches_from(7)
    finally:
        route.close()


def test_a_copied_blob_smaller_than_every_idle_segment_gets_a_segment_of_its_size():
    with _route() as (route, _, _before):
        large = route.write({0: (b"\1" * 8192, None)})[0]
        route.release([large])
        small = route.write({0: (b"\2" * 4096, None)})[0]
        assert small.name != large.name
        assert small.size == 4096
        assert _segment_bytes(small.name) == b"\2" * 4096
        route.release([small])


def test_with_pushes_off_a_local_actor_of_batches_gets_no_blob_segment():
    """Batches through shared memory alone: a push's blob stays in plain memory, unnamed."""
    before = ours()
    route = _shm.ShmRoute(enabled=False, batches=True)
    buffers = BlobBuffers(route)
    try:
        route.admit(7, route.identity, probe_ok=True)
        assert route.batches_from(7)
        assert not route.is_local(7)
        assert not route.wanted()
        buffers.take("policy", 4096)
        assert ours() <= before
    finally:
        buffers.clear()
        route.close()
