"""Relayed pushes: one blob sent once down a chain of real actor processes.

The learner sends a push that several remote actors get once, to the first actor of a
chain; each forwards it to the next. Every actor applies exactly the pushed weights and
answers on its own call. A relay frozen (a silent cut) or SIGKILLed in the middle of a
push: every other actor still applies the new version (the ones below it get the bytes
from the learner), the dead or frozen one is reported failed, and none applies a part.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import grpc
import pytest
from helpers import ActorProcess, self_signed_cert, start_actor
from learner_fleet import cartpole_policy, start_actors
from test_collector_shm import actor_policy, same_weights

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import decode_weights
from learner_client import GrpcCollector, WeightPushError, WeightPushSettings

pytestmark = pytest.mark.long  # three actor processes per test

#: 1600 x 1600 hidden: a policy of ~10 MB, above the size from which pushes are relayed.
HIDDEN = (1600, 1600)
ARGS = ["--num-envs", "1", "--policy-kwargs", '{"hidden": [1600, 1600]}']
PUSH = WeightPushSettings(shared_memory=False, relay_stall_seconds=1.0)


@pytest.fixture
def actors():
    started = start_actors([["--worker-id", str(i), "--seed", str(i), *ARGS] for i in range(3)])
    yield started
    for actor in started:
        actor.close()


def versions(actor: ActorProcess) -> int:
    """The policy version an actor holds, as it describes itself."""
    with grpc.insecure_channel(actor.address) as channel:
        reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=30)
    return next(m.version for m in reply.models if m.model_id == "policy")


def test_a_push_to_three_actors_is_sent_once_and_applied_by_each(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=PUSH) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy)[0]
        stats = collector.stats()
        blob_bytes = stats["relay_bytes_saved"] // 2
        assert stats["relayed_pushes"] == 2
        assert stats["relay_fallbacks"] == 0
        assert stats["relay_depth"] == 3
        assert blob_bytes > 8 << 20
        for actor in actors:
            assert same_weights(actor_policy(actor.address), policy)
        assert collector.policy_version == version
    logs = [a.stderr() for a in actors]
    assert sum('relayed="from a relay"' in log for log in logs) == 2


def test_relay_off_sends_each_actor_the_bytes(actors):
    addresses = [a.address for a in actors]
    push = WeightPushSettings(shared_memory=False, relay=False)
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=push) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        collector.update_policy_weights_(policy)
        assert collector.stats()["relayed_pushes"] == 0
        assert same_weights(actor_policy(actors[2].address), policy)


@pytest.mark.parametrize("fault", ["frozen", "killed"])
def test_a_relay_lost_mid_push_leaves_the_others_applying_the_new_version(actors, fault):
    addresses = [a.address for a in actors]
    relay = actors[1]  # the middle of the chain: it forwards to worker 2
    with GrpcCollector(
        addresses, frames_per_batch=4, weight_push=PUSH, call_timeout=8.0
    ) as collector:
        old = cartpole_policy(hidden=HIDDEN)
        collector.update_policy_weights_(old)
        before = {a.worker_id: versions(a) for a in actors}
        os.kill(relay.process.pid, signal.SIGSTOP)
        if fault == "killed":  # dies while the push is under way
            threading.Timer(1.5, relay.kill).start()
        new = cartpole_policy(hidden=HIDDEN)
        started = time.monotonic()
        with pytest.raises(WeightPushError) as raised:
            collector.update_policy_weights_(new)
        took = time.monotonic() - started
        assert set(raised.value.failed) == {relay.worker_id}
        assert set(raised.value.succeeded) == {0, 2}
        assert collector.stats()["relay_fallbacks"] >= 1
        for actor in (actors[0], actors[2]):
            assert same_weights(actor_policy(actor.address), new)
            assert versions(actor) == before[actor.worker_id] + 1
        assert took < 2 * 8.0 + 5
    if fault == "frozen":
        os.kill(relay.process.pid, signal.SIGCONT)
        held = actor_policy(relay.address)  # it never applied a part of the new version
        assert same_weights(held, old) or same_weights(held, new)


def restart_actor(actors, index, args, collector, ready):
    """Restart ``actors[index]`` on its port; the first batch it sends once ``ready()`` holds."""
    port = actors[index].port
    actors[index].close()
    flags = ["--worker-id", str(index), "--seed", str(index), "--port", str(port)]
    actors[index] = start_actor([*args, *flags])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # batches of the old process may still come first
        batch = collector.next()
        if ready() and int(batch["collector", "worker_id"].flatten()[0]) == index:
            return batch
    raise AssertionError(f"no batch from the restarted worker_id {index} within 60 s")


def test_a_restarted_actor_catches_up_from_a_peer_not_the_learner(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(
        addresses, frames_per_batch=4, batch_timeout=30, weight_push=PUSH
    ) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy)[0]
        collector.next()
        batch = restart_actor(
            actors, 2, ARGS, collector, lambda: collector.stats()["peer_catch_ups"] == 1
        )
        assert bool((batch["policy_version"] == version).all())
        stats = collector.stats()
        assert stats["peer_catch_ups"] == 1
        assert stats["relay_fallbacks"] == 0
        assert same_weights(actor_policy(actors[2].address), policy)
    assert 'relayed="from a relay"' in actors[2].stderr()
    assert sum("weights.forwarded" in a.stderr() for a in actors[:2]) == 1


def test_a_restarted_actor_on_this_host_catches_up_through_shared_memory(actors):
    """A returning local actor reads what it lacks from a segment, not from a peer or the wire."""
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, batch_timeout=30) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy)[0]
        assert collector.stats()["shm_pushes"] == 3
        batch = restart_actor(actors, 2, ARGS, collector, lambda: True)
        assert bool((batch["policy_version"] == version).all())
        stats = collector.stats()
        assert (stats["shm_pushes"], stats["shm_fallbacks"]) == (4, 0)
        assert stats["peer_catch_ups"] == 0
        assert same_weights(actor_policy(actors[2].address), policy)
    assert 'source="shared memory"' in actors[2].stderr()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_an_mtls_fleet_relays_over_tls_between_actors(tmp_path):
    """Actors with --relay-ca forward over mTLS, each presenting its certificate to the next."""
    actor_cert, actor_key = self_signed_cert(tmp_path, "actor")
    learner_cert, learner_key = self_signed_cert(tmp_path, "learner")
    clients = tmp_path / "clients.pem"  # the learner and the actors may call an actor
    clients.write_bytes(actor_cert.read_bytes() + learner_cert.read_bytes())
    tls = ["--tls-cert", str(actor_cert), "--tls-key", str(actor_key)]
    tls += ["--tls-client-ca", str(clients), "--relay-ca", str(actor_cert)]
    actors = start_actors([["--worker-id", str(i), *ARGS, *tls] for i in range(3)])
    credentials = grpc.ssl_channel_credentials(
        actor_cert.read_bytes(), learner_key.read_bytes(), learner_cert.read_bytes()
    )
    try:
        addresses = [a.address for a in actors]
        with GrpcCollector(
            addresses, frames_per_batch=4, weight_push=PUSH, channel_credentials=credentials
        ) as collector:
            policy = cartpole_policy(hidden=HIDDEN)
            collector.update_policy_weights_(policy)
            stats = collector.stats()
            assert (stats["relayed_pushes"], stats["relay_fallbacks"]) == (2, 0)
            for address in addresses:
                with grpc.secure_channel(address, credentials) as channel:
                    stub = pb_grpc.ActorServiceStub(channel)
                    chunks = list(stub.GetState(pb.GetStateRequest(), timeout=30))
                blob = b"".join(c.chunk for c in chunks if c.WhichOneof("kind") == "chunk")
                held = decode_weights(blob, max_bytes=1 << 30, max_keys=1 << 20)[0]
                assert same_weights(held, policy)
        logs = [a.stderr() for a in actors]
        assert sum('relayed="from a relay"' in log for log in logs) == 2
    finally:
        for actor in actors:
            actor.close()
