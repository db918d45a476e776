"""Describe, GetState / LoadState, SetSeed and health on an in-process actor."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch
from actor_harness import Actor, RawCollect, get_state, held_start, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until

from actor_service import ActorConfig, ModelSpec, create_server, serve
from actor_service._core._settings import EnvPoolSettings
from actor_service._core._state import decode_state, encode_state, state_to_blob
from actor_service._kinds.env.core import EnvCore
from actor_service._serve import _servicer as servicer_module
from actor_service._serve import _streams as streams_module
from actor_service._serve._convert import space_to_proto
from common.errors import DeadlineError
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import BlobAssembler, encode_weights, iter_blob_chunks, sha256_hex
from learner_client._transport import translate_errors


def _load_requests(
    blob: bytes, sha256: str | None = None, *, allow_rollback: bool = False
) -> Iterator[pb.StateChunk]:
    header = pb.StateHeader(
        total_bytes=len(blob), sha256=sha256 or sha256_hex(blob), allow_rollback=allow_rollback
    )
    yield pb.StateChunk(header=header)
    for piece in iter_blob_chunks(blob, 4096):
        yield pb.StateChunk(chunk=bytes(piece))


def _policy_weights(actor: Actor) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in actor.worker.models.module("policy").state_dict().items()}


@pytest.fixture
def unread_stub(make_actor: Callable[..., Actor]) -> Iterator[pb_grpc.ActorServiceStub]:
    """A stub on an actor with a 4 MB state, over a channel whose flow-control window stays at
    its start (gRPC's window estimate off): what a caller that reads nothing gets. With the
    estimate on, the window grew with the first chunk, and under load the whole state could be
    taken by the transport, so nothing waited (the CI failure of these tests)."""
    actor = make_actor(models=(ModelSpec(factory="mlp", kwargs={"hidden": [1024, 1024]}),))
    with grpc.insecure_channel(
        f"127.0.0.1:{actor.port}", options=[("grpc.http2.bdp_probe", 0)]
    ) as channel:
        yield pb_grpc.ActorServiceStub(channel)


def test_describe_reports_worker_env_spaces_and_models(make_actor: object) -> None:
    actor = make_actor(worker_id=5, max_credits=3)
    described = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert described.worker_id == 5
    assert described.epoch == actor.worker.epoch != 0
    assert described.env_id == "CartPole-v1"
    assert described.num_envs == 2
    assert described.max_credits == 3
    assert not described.busy
    assert described.observation_spec.kind == "box"
    assert list(described.observation_spec.shape) == [4]
    assert described.action_spec.kind == "discrete"
    assert list(described.action_spec.n) == [2]
    (model,) = described.models
    assert model.model_id == "policy"
    assert model.version == 0
    assert {p.name for p in model.parameters} == set(_policy_weights(actor))


@pytest.mark.parametrize(("shape", "bounded"), [((32, 32), True), ((32, 33), False)])
def test_a_box_space_carries_its_bounds_up_to_1024_elements_only(shape, bounded) -> None:
    # An image's bounds (a million floats, twice) would swell every Describe answer.
    spec = space_to_proto(gym.spaces.Box(-1.0, 2.0, shape, dtype=np.float32))
    assert (spec.kind, list(spec.shape), spec.dtype) == ("box", list(shape), "float32")
    count = int(np.prod(shape)) if bounded else 0
    assert (len(spec.low), len(spec.high)) == (count, count)
    assert set(spec.low) <= {-1.0}
    assert set(spec.high) <= {2.0}


def test_describe_reports_busy_and_the_learner_during_a_session_only(actor: Actor) -> None:
    session = RawCollect.open(actor.stub, open_request(credits=0, learner_id="A"))
    session.opened()
    during = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert (during.busy, during.learner_id) == (True, "A")
    session.cancel()
    poll_until(lambda: not actor.stub.Describe(pb.DescribeRequest(), timeout=10).busy)
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).learner_id == ""


def test_get_state_round_trips_through_load_state(make_actor: object) -> None:
    source = make_actor(seed=1)
    session = RawCollect.open(source.stub, open_request(credits=2))
    session.opened()
    session.batch(), session.batch()
    session.cancel()
    blob = get_state(source)
    state = decode_state(blob)
    assert "models" in state
    target = make_actor(seed=2)
    assert not all(
        torch.equal(_policy_weights(source)[k], v) for k, v in _policy_weights(target).items()
    )
    response = target.stub.LoadState(_load_requests(blob), timeout=30)
    assert response.worker_id == 0
    for key, value in _policy_weights(target).items():
        assert torch.equal(value, _policy_weights(source)[key]), key


def test_load_state_raises_if_state_is_bad_and_changes_nothing(actor: Actor) -> None:
    before = _policy_weights(actor)
    good = decode_state(get_state(actor))
    weights = good["models"]["policy"]["weights"]
    name = next(iter(weights))
    weights[name] = torch.zeros(7)
    cases = [
        (state_to_blob(good), None, grpc.StatusCode.INVALID_ARGUMENT),
        (encode_weights(before), None, grpc.StatusCode.INVALID_ARGUMENT),  # not a state file
        (state_to_blob(good), "0" * 64, grpc.StatusCode.DATA_LOSS),
    ]
    for blob, sha, code in cases:
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.LoadState(_load_requests(blob, sha), timeout=30)
        assert error.value.code() == code
    for key, value in _policy_weights(actor).items():
        assert torch.equal(value, before[key])


def _snapshot(actor: Actor) -> tuple:
    worker = actor.worker
    return (
        _policy_weights(actor),
        worker.models.policy_version("policy"),
        worker.frames,
        worker.batches,
        worker.state_dict()["traj_counter"],
    )


def _assert_same(actor: Actor, before: tuple) -> None:
    weights, *rest = _snapshot(actor)
    assert rest == list(before[1:])
    for key, value in weights.items():
        assert torch.equal(value, before[0][key]), key


def _nested_state_blob(depth: int) -> bytes:
    tree = "[" * depth + "]" * depth
    metadata = {"rlfleet.format": "actor-state/1", "rlfleet.state": tree}
    return encode_weights({}, metadata=metadata)


def test_load_state_raises_invalid_argument_if_a_number_is_out_of_range(actor: Actor) -> None:
    before = _snapshot(actor)
    good = decode_state(get_state(actor))
    other = {k: torch.full_like(v, 0.5) for k, v in good["models"]["policy"]["weights"].items()}
    good["models"]["policy"]["weights"] = other  # would be visible if anything were applied
    bad_states = [
        {**good, "traj_counter": 2**70},
        {**good, "frames": 2**64},
        {**good, "frames": 2**63 - 1},  # in int64, but the actor would count past it
        {**good, "batches": 2**53 + 1},
        {**good, "batches": -1},
        {**good, "models": {"policy": {"version": 2**63, "weights": other}}},
        {**good, "models": {"policy": {"version": 1.5, "weights": other}}},
    ]
    blobs = [state_to_blob(s) for s in bad_states] + [_nested_state_blob(100_000)]
    for blob in blobs:
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.LoadState(_load_requests(blob), timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
        _assert_same(actor, before)
    session = RawCollect.open(actor.stub, open_request(credits=1))  # the actor still collects
    session.opened()
    assert session.batch()[1]["policy_version"].eq(0).all()
    session.cancel()


def test_load_state_refuses_a_rollback_unless_allowed_and_audits_every_load(
    actor: Actor, caplog: pytest.LogCaptureFixture
) -> None:
    old = get_state(actor)  # version 0
    state = decode_state(old)
    newer = {k: torch.full_like(v, 0.25) for k, v in state["models"]["policy"]["weights"].items()}
    state["models"]["policy"] = {"version": 3, "weights": newer}
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        actor.stub.LoadState(_load_requests(state_to_blob(state)), timeout=30)  # forward: fine
        before = _snapshot(actor)
        assert before[1] == 3
        with pytest.raises(grpc.RpcError) as error:
            actor.stub.LoadState(_load_requests(old), timeout=30)
        assert error.value.code() == grpc.StatusCode.ABORTED
        assert "allow_rollback" in error.value.details()
        _assert_same(actor, before)
        actor.stub.LoadState(_load_requests(old, allow_rollback=True), timeout=30)
    assert actor.worker.models.policy_version("policy") == 0
    loads = [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "weights.load_state"]
    results = [r.rlfleet_fields["result"] for r in loads]
    assert results == ["OK", "ABORTED", "OK"]
    assert loads[0].rlfleet_fields["versions"] == {"policy": "0->3"}
    assert loads[2].rlfleet_fields["versions"] == {"policy": "3->0"}
    assert all(r.rlfleet_fields["peer"].startswith("ipv") for r in loads)
    assert [r.rlfleet_fields["allow_rollback"] for r in loads] == [False, False, True]


def test_a_load_state_its_caller_gave_up_on_is_logged_as_applied(
    make_actor: Callable[..., Actor], caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    """A LoadState waits for the collection thread (a batch under way); a learner whose call
    is cancelled meanwhile (its deadline) does not stop it: the state is applied whole, and
    its log line says so, with its versions, not that the load was cancelled."""
    answered = threading.Event()
    load_state = servicer_module.ActorServicer.LoadState

    async def answering(self: object, requests: object, context: object) -> object:
        try:
            return await load_state(self, requests, context)
        finally:
            answered.set()

    monkeypatch.setattr(servicer_module.ActorServicer, "LoadState", answering)
    actor = make_actor()
    state = decode_state(get_state(actor))
    newer = {k: torch.full_like(v, 0.25) for k, v in state["models"]["policy"]["weights"].items()}
    state["models"]["policy"] = {"version": 3, "weights": newer}
    entered, release = threading.Event(), threading.Event()
    load_state_dict = actor.worker.load_state_dict

    def held_load(*args: object, **kwargs: object) -> object:
        entered.set()
        release.wait(30)
        return load_state_dict(*args, **kwargs)

    monkeypatch.setattr(actor.worker, "load_state_dict", held_load)
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        call = actor.stub.LoadState.future(_load_requests(state_to_blob(state)), timeout=30)
        assert entered.wait(30)
        call.cancel()
        assert answered.wait(30)  # the handler is gone; the load is not
        release.set()
        poll_until(lambda: actor.worker.models.policy_version("policy") == 3)  # applied whole
        loads = poll_until(
            lambda: [
                r for r in caplog.records if getattr(r, "rlfleet_event", "") == "weights.load_state"
            ]
        )
    assert [r.rlfleet_fields["result"] for r in loads] == ["OK"]
    assert loads[0].rlfleet_fields["versions"] == {"policy": "0->3"}


def test_get_state_whose_caller_gives_up_mid_stream_is_no_internal_error(
    make_actor: Callable[..., Actor], caplog: pytest.LogCaptureFixture
) -> None:
    """A learner that goes away while a large state streams (its deadline, a crash) ends the
    call; the actor's write that fails with it is no bug: no INTERNAL, no traceback."""
    actor = make_actor(models=(ModelSpec(factory="mlp", kwargs={"hidden": [1024, 1024]}),))
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        call = actor.stub.GetState(pb.GetStateRequest(), timeout=1.0)  # a learner's deadline
        assert next(call).header.total_bytes > 4 * 2**20  # more than a flow control window
        # The learner reads no more: the actor's writes wait on it until its deadline.
        failures = poll_until(
            lambda: [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "rpc.failed"],
            message="the cancelled GetState ended",
        )
    assert [r.rlfleet_fields["code"] for r in failures] == ["CANCELLED"], failures
    assert not any(r.exc_info for r in failures)
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).worker_id == 0


def test_get_state_whose_caller_stops_reading_ends_within_the_idle_timeout(
    unread_stub: pb_grpc.ActorServiceStub, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    """A caller with no deadline that stops reading a large state must not hold the call (a
    slot of the actor's calls) and the state's encoded blob forever."""
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.5)
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        call = unread_stub.GetState(pb.GetStateRequest())
        assert next(call).header.total_bytes > 4 * 2**20  # more than a flow control window
        failures = poll_until(
            lambda: [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "rpc.failed"],
            message="the actor gave up on a GetState that nobody reads",
        )
    assert [r.rlfleet_fields["code"] for r in failures] == ["DEADLINE_EXCEEDED"]
    with pytest.raises(grpc.RpcError) as error:
        list(call)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "GetState: the caller read nothing" in error.value.details()


def test_get_state_holds_at_most_max_states_sent_states_whatever_its_callers_read(
    unread_stub: pb_grpc.ActorServiceStub, monkeypatch
) -> None:
    """Callers that each open a GetState and read none of it (a hostile peer, a stalled
    learner) made the actor encode and hold one whole state per call: 40 calls held 1.7 GB
    more of a 34 MB state. Calls beyond the bound wait their turn and then get the state."""
    encoded: list[int] = []

    def counted(core: object) -> bytes:
        blob = encode_state(core)
        encoded.append(len(blob))
        return blob

    monkeypatch.setattr(servicer_module, "encode_state", counted)
    calls = [unread_stub.GetState(pb.GetStateRequest(), timeout=60) for _ in range(6)]
    bound = servicer_module.MAX_STATES_SENT
    poll_until(lambda: len(encoded) == bound, message="the first states encoded")
    time.sleep(0.5)  # what an unbounded actor encodes meanwhile: every call's state
    assert len(encoded) == bound
    assert encoded[0] > 4 * 2**20  # more than a flow control window: its writes wait

    def read(call: Iterator[pb.StateChunk]) -> dict:
        header = next(call).header
        assembler = BlobAssembler(header.total_bytes, sha256=header.sha256)
        for message in call:
            assembler.add(message.chunk)
        return decode_state(bytes(assembler.finish()))

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as readers:
        states = list(readers.map(read, calls))
    assert [s["models"]["policy"]["version"] for s in states] == [0] * len(calls)
    assert len(encoded) == len(calls)


def test_load_state_refuses_other_weights_under_the_version_in_force(actor: Actor) -> None:
    state = decode_state(get_state(actor))
    newer = {k: torch.full_like(v, 0.25) for k, v in state["models"]["policy"]["weights"].items()}
    state["models"]["policy"] = {"version": 1, "weights": newer}
    actor.stub.LoadState(_load_requests(state_to_blob(state)), timeout=30)
    actor.stub.LoadState(_load_requests(state_to_blob(state)), timeout=30)  # again: a no-op
    before = _snapshot(actor)
    other = {k: torch.full_like(v, -7.0) for k, v in newer.items()}
    state["models"]["policy"] = {"version": 1, "weights": other}
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.LoadState(_load_requests(state_to_blob(state)), timeout=30)
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert "with other weights; set allow_rollback" in error.value.details()
    _assert_same(actor, before)
    actor.stub.LoadState(_load_requests(state_to_blob(state), allow_rollback=True), timeout=30)
    weights, version, *_ = _snapshot(actor)
    assert version == 1
    assert all(value.eq(-7.0).all() for value in weights.values())


def test_set_seed_returns_the_next_seed_and_makes_collection_repeatable(actor: Actor) -> None:
    def first_batch_after_seed() -> tuple[int, torch.Tensor]:
        next_seed = actor.stub.SetSeed(pb.SetSeedRequest(seed=123), timeout=10).next_seed
        session = RawCollect.open(
            actor.stub,
            open_request(
                credits=1,
                reset_at_each_iter=True,
                exploration_type=pb.EXPLORATION_TYPE_DETERMINISTIC,
            ),
        )
        session.opened()
        _, td = session.batch()
        session.cancel()
        poll_until(lambda: not actor.handle.server.runtime.busy)
        return next_seed, td["observation"]

    seed_a, obs_a = first_batch_after_seed()
    seed_b, obs_b = first_batch_after_seed()
    assert seed_a == seed_b != 123
    assert torch.equal(obs_a, obs_b)


def test_set_seed_names_the_first_batch_collected_with_the_new_seed(actor: Actor) -> None:
    # A learner must know which batches (already sent or still in flight) predate a
    # reseed, to drop them as TorchRL does: first_seq is the first seq seeded anew.
    assert actor.stub.SetSeed(pb.SetSeedRequest(seed=5), timeout=10).first_seq == 1
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=200, credits=4))
    session.opened()
    poll_until(lambda: actor.worker.batches >= 2, message="two batches collected")
    first_seq = actor.stub.SetSeed(pb.SetSeedRequest(seed=7), timeout=30).first_seq
    # Everything below first_seq had been collected when SetSeed returned; nothing at or
    # above it had started before the seeding.
    assert 3 <= first_seq <= actor.worker.batches + 1
    seeded_first = None
    for _ in range(6):
        info, td = session.batch()
        session.credit(1)
        if info.seq == first_seq:
            seeded_first = td
            break
    session.cancel()
    poll_until(lambda: not actor.handle.server.runtime.busy)
    assert seeded_first is not None
    # Replaying the same seed on a fresh session reproduces that first batch.
    actor.stub.SetSeed(pb.SetSeedRequest(seed=7), timeout=30)
    again = RawCollect.open(actor.stub, open_request(frames_per_batch=200, credits=1))
    again.opened()
    _, replay = again.batch()
    again.cancel()
    assert torch.equal(replay["observation"], seeded_first["observation"])


def test_health_is_not_serving_until_the_pool_is_built() -> None:
    with held_start(ActorConfig(host="127.0.0.1", port=0, num_envs=2)) as held:
        poll_until(lambda: held.server.port is not None, message="bound")
        channel = grpc.insecure_channel(f"127.0.0.1:{held.server.port}")
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rlfleet.v1.ActorService"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as error:
            pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        held.release.set()
        held.started.result(30)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        channel.close()


def test_health_watch_reports_not_serving_when_the_actor_drains(make_actor: object) -> None:
    actor = make_actor()
    health = health_pb2_grpc.HealthStub(actor.channel)
    watch = health.Watch(
        health_pb2.HealthCheckRequest(service="rlfleet.v1.ActorService"), timeout=30
    )
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    stopping = threading.Thread(target=actor.handle.stop, args=(0.5,))
    stopping.start()
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    stopping.join(30)
    watch.cancel()


def test_an_actor_binds_an_ipv6_literal_given_in_brackets() -> None:
    config = ActorConfig(host="[::1]", port=0, num_envs=2)
    with create_server(config).run_in_thread() as handle:
        with grpc.insecure_channel(f"[::1]:{handle.port}") as channel:
            reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
        assert reply.num_envs == 2


class _FailingClose(EnvCore):
    """A core whose close raises once its envs are closed."""

    def close(self) -> None:
        super().close()
        raise RuntimeError("close broke")


def test_a_core_whose_close_raises_is_logged_and_the_actor_still_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = ActorConfig(host="127.0.0.1", port=0, num_envs=2, metrics_port=0)
    handle = create_server(config, _FailingClose).run_in_thread()
    metrics_port = handle.server.metrics_port
    with caplog.at_level("ERROR", logger="rlfleet.actor"):
        handle.stop(1.0)
    failed = [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "actor.close_failed"]
    assert "close broke" in failed[0].rlfleet_fields["error"]
    with pytest.raises(ConnectionRefusedError):  # the metrics endpoint was closed after it
        socket.create_connection(("127.0.0.1", metrics_port), timeout=5).close()


def test_serve_returns_1_if_the_env_cannot_be_built() -> None:
    config = ActorConfig(
        host="127.0.0.1",
        port=0,
        env_pool=EnvPoolSettings(env="NoSuchEnv-v0"),
        num_envs=1,
        torch_threads=torch.get_num_threads(),
    )
    assert serve(config) == 1


def test_actor_calls_are_capped_and_health_keeps_answering(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(servicer_module, "MAX_ACTOR_CALLS", 3)
    idle = [RawCollect(actor.stub) for _ in range(3)]  # calls waiting for their `open`

    def cap_reached() -> bool:
        # A probe can take a slot before an idle call arrives and get that call refused:
        # such a call is replaced, so that three idle calls hold the slots.
        idle[:] = [RawCollect(actor.stub) if call.call.done() else call for call in idle]
        return _refused(actor)

    poll_until(cap_reached, message="a 4th call refused")
    health = health_pb2_grpc.HealthStub(actor.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == (
        health_pb2.HealthCheckResponse.SERVING
    )
    for call in idle:
        call.cancel()
    poll_until(lambda: not _refused(actor), message="calls admitted again")


def _refused(actor: Actor) -> bool:
    """Whether Describe is refused because the call cap (3) is reached."""
    future = actor.stub.Describe.future(pb.DescribeRequest(), timeout=5)
    if future.exception() is None:
        return False
    return future.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "3 calls" in future.details()


def test_collect_raises_if_open_does_not_arrive_in_time(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.2)
    error = RawCollect(actor.stub).error(timeout=10)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "Collect" in error.details()


def test_an_actors_own_deadline_is_not_told_as_the_learners(
    actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actor ends an idle client stream with DEADLINE_EXCEEDED of its own, long before
    the learner's deadline: the learner's error says the actor's reason, not its deadline."""
    monkeypatch.setattr(streams_module, "_IDLE_TIMEOUT", 0.2)
    with pytest.raises(DeadlineError) as idle, translate_errors("actor", timeout=30):
        raise RawCollect(actor.stub).error(timeout=10)
    assert "no message for" in str(idle.value)
    assert "deadline of 30 s" not in str(idle.value)


def test_server_thread_stopped_from_two_threads_at_once_stops_within_its_grace() -> None:
    """A second ``stop()`` while another thread's is under way (a signal handler beside a
    ``with`` block's exit) stopped the loop under the first: the first waited 30 s past its
    grace, the second raised "Event loop is closed", and the actor was left serving."""
    config = ActorConfig(host="127.0.0.1", port=0, num_envs=2, worker_id=4711)
    handle = create_server(config).run_in_thread()
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            handle.stop(1.0)
        except BaseException as exc:
            failures.append(exc)

    stoppers = [threading.Thread(target=stop) for _ in range(2)]
    began = time.monotonic()
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join(60)
    assert failures == []
    assert time.monotonic() - began < 5.0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("rlfleet-collect-4711")]
    with socket.socket() as listener:  # the port is free: the server stopped
        listener.bind(("127.0.0.1", handle.port))


def test_serve_raises_if_called_off_the_main_thread_naming_run_in_thread() -> None:
    """``serve`` stops on SIGTERM/SIGINT, whose handlers only the main thread may install: from
    another thread it failed on asyncio's "set_wakeup_fd only works in main thread"."""
    config = ActorConfig(
        host="127.0.0.1", port=0, num_envs=1, torch_threads=torch.get_num_threads()
    )
    failures: list[BaseException] = []

    def run() -> None:
        try:
            serve(config)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert len(failures) == 1
    assert isinstance(failures[0], RuntimeError)
    assert "create_server(config).run_in_thread()" in str(failures[0])
