"""An actor's Prometheus endpoint, scraped over HTTP and read with prometheus_client's parser."""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
from actor_harness import Actor, RawCollect, held_start, open_request
from helpers import free_port, poll_until, start_actor
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from actor_service import ActorConfig
from actor_service._core._settings import EnvPoolSettings
from actor_service._serve._metrics import BatchHistogram
from common import metrics
from common.metrics import MetricsEndpoint
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import encode_weights, iter_blob_chunks, sha256_hex

TOKEN = "metrics-test-token-5f0c1e"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def scrape(port: int, path: str = "/metrics") -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted label items: value}}`` of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def _push_requests(model_id: str, version: int, blob: bytes) -> Iterator[pb.PushWeightsRequest]:
    header = pb.WeightsHeader(
        model_id=model_id, version=version, total_bytes=len(blob), sha256=sha256_hex(blob)
    )
    yield pb.PushWeightsRequest(header=header)
    for piece in iter_blob_chunks(blob, 1000):
        yield pb.PushWeightsRequest(chunk=bytes(piece))


def _weights(actor: Actor) -> bytes:
    module = actor.worker.models.module("policy")
    return encode_weights({k: torch.zeros_like(v) for k, v in module.state_dict().items()})


def _push(actor: Actor, version: int, model_id: str = "policy", blob: bytes | None = None) -> None:
    blob = _weights(actor) if blob is None else blob
    actor.stub.PushWeights(_push_requests(model_id, version, blob), metadata=AUTH, timeout=30)


def test_actor_metrics_move_as_batches_flow_and_pushes_happen(make_actor: object) -> None:
    actor: Actor = make_actor(metrics_port=0, token=TOKEN)
    port = actor.handle.server.metrics_port
    before = scrape(port)
    assert value(before, "rlfleet_actor_frames_total") == 0
    assert value(before, "rlfleet_actor_session_state", state="free") == 1
    assert value(before, "rlfleet_actor_policy_version", model_id="policy") == 0
    assert value(before, "rlfleet_actor_info", worker_id="0", env="CartPole-v1") == 1
    assert value(before, "process_resident_memory_bytes") > 0
    assert value(before, "rlfleet_process_threads") >= 2

    session = RawCollect.open(
        actor.stub, open_request(frames_per_batch=10, credits=3), metadata=AUTH
    )
    session.opened()
    seqs = [session.batch()[0].seq for _ in range(3)]
    session.ack(seqs[-1])
    poll_until(lambda: value(scrape(port), "rlfleet_actor_batches_acked_total") == 3)
    during = scrape(port)
    assert value(during, "rlfleet_actor_session_state", state="held") == 1
    assert value(during, "rlfleet_actor_batches_sent_total") == 3
    assert value(during, "rlfleet_actor_batches_dropped_total") == 0
    assert value(during, "rlfleet_actor_credits_granted_total") == 3
    assert value(during, "rlfleet_actor_credits_outstanding") == 0
    assert value(during, "rlfleet_actor_batches_collected_total") == 3
    assert value(during, "rlfleet_actor_frames_total") == 30
    # 2 envs x 5 steps per batch; every step timed once, forward and env step alike.
    assert value(during, "rlfleet_actor_env_steps_total") == 15
    for histogram in ("rlfleet_actor_env_step_seconds", "rlfleet_actor_policy_forward_seconds"):
        assert value(during, histogram + "_count") == 15
        assert value(during, histogram + "_bucket", le="+Inf") == 15
        assert 0 < value(during, histogram + "_sum") < 15 * 2.5
    assert value(during, "rlfleet_actor_batch_collect_seconds_count") == 3

    _push(actor, 1)
    with pytest.raises(grpc.RpcError) as stale:
        _push(actor, 1)
    assert stale.value.code() == grpc.StatusCode.ABORTED
    session.close()
    session.end()
    poll_until(lambda: value(scrape(port), "rlfleet_actor_session_state", state="free") == 1)
    after = scrape(port)
    assert value(after, "rlfleet_actor_weight_pushes_total", model_id="policy", result="OK") == 1
    assert (
        value(after, "rlfleet_actor_weight_pushes_total", model_id="policy", result="ABORTED") == 1
    )
    assert value(after, "rlfleet_actor_weight_push_bytes_total", model_id="policy") == len(
        _weights(actor)
    )
    assert value(after, "rlfleet_actor_weight_push_seconds_count", model_id="policy") == 1
    assert value(after, "rlfleet_actor_policy_version", model_id="policy") == 1
    assert value(after, "rlfleet_actor_rpc_errors_total", method="PushWeights", code="ABORTED") == 1
    assert value(after, "rlfleet_actor_sessions_ended_total", reason="closed") == 1


def test_a_session_whose_learner_vanishes_ends_broken_not_closed(
    make_actor: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A learner killed mid-session: no end can be written; counted and logged as broken."""
    actor: Actor = make_actor(metrics_port=0)
    port = actor.handle.server.metrics_port
    with caplog.at_level("INFO", logger="rlfleet.actor"):
        session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=2))
        session.opened()
        session.batch()
        session.cancel()  # what the actor sees of a learner killed: its stream breaks
        poll_until(lambda: value(scrape(port), "rlfleet_actor_session_state", state="free") == 1)
    after = scrape(port)
    assert value(after, "rlfleet_actor_sessions_ended_total", reason="broken") == 1
    assert (("reason", "closed"),) not in after["rlfleet_actor_sessions_ended_total"]
    ended = [r.rlfleet_fields for r in caplog.records if r.getMessage() == "session.ended"]
    assert [fields["reason"] for fields in ended] == ["broken"]


def test_credits_a_session_left_unused_are_not_outstanding_once_it_ended(
    make_actor: object,
) -> None:
    actor: Actor = make_actor(metrics_port=0)
    port = actor.handle.server.metrics_port
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=10, credits=4))
    session.opened()
    assert [session.batch()[0].seq for _ in range(4)] == [1, 2, 3, 4]
    session.credit(2)  # 4 batches wait for their ack (max_credits): the credits wait too
    poll_until(lambda: value(scrape(port), "rlfleet_actor_credits_outstanding") == 2)
    session.close()
    assert session.end()[0].reason == pb.END_REASON_CLOSED
    poll_until(lambda: value(scrape(port), "rlfleet_actor_session_state", state="free") == 1)
    after = scrape(port)
    assert value(after, "rlfleet_actor_credits_outstanding") == 0
    assert value(after, "rlfleet_actor_batches_retained") == 4  # kept for a resume


def test_batch_histogram_counts_a_value_on_a_bound_in_that_bound_s_bucket() -> None:
    registry = CollectorRegistry()
    histogram = BatchHistogram("step_seconds", "Steps.", (0.1, 1.0), registry)
    histogram.observe_many(np.array([0.1, 0.5, 1.0, 1.0, 3.0]))
    (family,) = registry.collect()
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.1": 1, "1.0": 4, "+Inf": 5}  # Prometheus' le: at most the bound
    assert registry.get_sample_value("step_seconds_sum") == pytest.approx(5.6)


def test_actor_metrics_time_env_steps_apart_from_forward_passes(make_actor: object) -> None:
    slow = EnvPoolSettings(env_factory="rlfleet_test_envs:slow_cartpole", env_kwargs={"delay": 0.1})
    actor: Actor = make_actor(metrics_port=0, env_pool=slow)
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=4, credits=1))
    session.opened()
    session.batch()
    session.cancel()
    samples = scrape(actor.handle.server.metrics_port)
    # 2 steps of 0.1 s each: the env's time, not the policy's; the batch took both.
    assert value(samples, "rlfleet_actor_env_step_seconds_sum") >= 0.2
    assert value(samples, "rlfleet_actor_policy_forward_seconds_sum") < 0.1
    assert 0.2 <= value(samples, "rlfleet_actor_batch_collect_seconds_sum") < 10


def test_actor_metrics_say_starting_while_the_pool_is_built() -> None:
    config = ActorConfig(host="127.0.0.1", port=0, num_envs=2, metrics_port=0)
    with held_start(config) as held:
        server = held.server
        poll_until(lambda: server.port is not None, message="bound")
        samples = scrape(server.metrics_port)
        assert value(samples, "rlfleet_actor_session_state", state="starting") == 1
        assert value(samples, "rlfleet_actor_credits_outstanding") == 0
        assert "rlfleet_actor_policy_version" not in samples  # no model loaded yet
        held.release.set()
        held.started.result(30)
        samples = scrape(server.metrics_port)
        assert value(samples, "rlfleet_actor_policy_version", model_id="policy") == 0


def test_actor_metrics_say_draining_while_the_actor_drains(make_actor: object) -> None:
    slow = EnvPoolSettings(env_factory="rlfleet_test_envs:slow_cartpole", env_kwargs={"delay": 0.3})
    actor: Actor = make_actor(metrics_port=0, env_pool=slow)
    port = actor.handle.server.metrics_port
    session = RawCollect.open(actor.stub, open_request(frames_per_batch=20, credits=1))
    session.opened()
    stopping = threading.Thread(target=actor.handle.stop, args=(4.0,))
    stopping.start()
    try:
        poll_until(lambda: actor.handle.server.runtime.draining, message="draining")
        assert value(scrape(port), "rlfleet_actor_session_state", state="draining") == 1
        assert not actor.handle.server.ready
    finally:
        session.cancel()
        stopping.join(30)


def test_actor_metrics_port_serves_only_metrics_and_never_the_token(make_actor: object) -> None:
    actor: Actor = make_actor(metrics_port=0, token=TOKEN)
    port = actor.handle.server.metrics_port
    assert port not in (None, actor.port)
    for path in ("/", "/metrics/", "/favicon.ico", "/rlfleet.v1.ActorService/Describe", "/debug"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/metrics", body=b"x")
    assert connection.getresponse().status == 405
    connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("HEAD", "/metrics")  # uptime checkers probe with HEAD
    head = connection.getresponse()
    assert (head.status, head.read()) == (200, b"")
    assert head.getheader("Content-Type", "").startswith("text/plain")
    connection.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        body = reply.read()
    assert TOKEN.encode() not in body
    assert b"Bearer" not in body


def test_actor_metrics_count_auth_refusals(make_actor: object) -> None:
    actor: Actor = make_actor(metrics_port=0, token=TOKEN)
    for metadata in ((), (("authorization", "Bearer wrong"),)):
        with pytest.raises(grpc.RpcError):
            actor.stub.Describe(pb.DescribeRequest(), metadata=metadata, timeout=10)
    samples = scrape(actor.handle.server.metrics_port)
    assert value(samples, "rlfleet_actor_auth_refusals_total", method="Describe") == 2


def test_an_unknown_method_without_the_token_is_unimplemented_and_adds_no_label(
    make_actor: object,
) -> None:
    actor: Actor = make_actor(metrics_port=0, token=TOKEN)
    for index in range(20):
        call = actor.channel.unary_unary(f"/rlfleet.v1.ActorService/Attacker{index}")
        with pytest.raises(grpc.RpcError) as error:
            call(b"", timeout=10)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    samples = scrape(actor.handle.server.metrics_port)
    assert not any("Attacker" in repr(labels) for series in samples.values() for labels in series)


def test_actor_metrics_labels_stay_bounded_under_hostile_model_ids(make_actor: object) -> None:
    actor: Actor = make_actor(metrics_port=0, token=TOKEN)
    blob = _weights(actor)
    for index in range(300):
        with pytest.raises(grpc.RpcError) as unknown:
            _push(actor, 2**64 - 1, model_id=f"attacker-{index}", blob=blob)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    samples = scrape(actor.handle.server.metrics_port)
    pushes = samples["rlfleet_actor_weight_pushes_total"]
    assert pushes == {(("model_id", "other"), ("result", "NOT_FOUND")): 300.0}
    assert not any("attacker" in repr(labels) for series in samples.values() for labels in series)
    # Every labelled series of the actor has a small, fixed set of label values.
    assert sum(len(series) for series in samples.values()) < 200


def test_actor_metrics_are_off_by_default(make_actor: object) -> None:
    actor: Actor = make_actor()
    assert actor.handle.server.metrics_port is None
    assert actor.handle.server.metrics is None


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_actor_process_serves_metrics_from_flag_or_variable(how: str) -> None:
    port = free_port()
    args = (
        ["--num-envs", "2", "--metrics-port", str(port)] if how == "flag" else ["--num-envs", "2"]
    )
    env = {"RLFLEET_METRICS_PORT": str(port)} if how == "variable" else {}
    with start_actor(args, env=env) as process:
        samples = scrape(port)
        assert value(samples, "rlfleet_actor_session_state", state="free") == 1
        assert value(samples, "process_open_fds") > 0
        process.terminate()
        assert process.wait(timeout=30) == 0
    with pytest.raises(urllib.error.URLError):  # the port is released with the process
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_metrics_port_in_use_is_named_with_its_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"127.0.0.1:{port} \(--metrics-port\).*in use"):
            MetricsEndpoint(CollectorRegistry(), host="127.0.0.1", port=port)


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_metrics_are_served_on_an_ipv6_address(host: str) -> None:
    if not socket.has_ipv6:
        pytest.skip("this host has no IPv6")
    registry = CollectorRegistry()
    Counter("rlfleet_probe", "A counter to find in the scrape.", registry=registry).inc(3)
    with MetricsEndpoint(registry, host=host, port=0) as endpoint:
        url = f"http://[::1]:{endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200
            assert b"rlfleet_probe_total 3.0" in reply.read()


def _probe_endpoint() -> MetricsEndpoint:
    registry = CollectorRegistry()
    Counter("rlfleet_probe", "A counter to find in the scrape.", registry=registry).inc()
    return MetricsEndpoint(registry, host="127.0.0.1", port=0)


def _closed_by_server(connection: socket.socket) -> bool:
    """Whether the endpoint closed ``connection`` (it reads the end of the stream)."""
    connection.settimeout(0.05)
    try:
        return connection.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_metrics_endpoint_drops_an_idle_connection_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A connection that sends nothing (a port scanner, a load balancer's pool) is closed
    quietly: it printed a traceback to stderr, so idle connections flooded the actor's log."""
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.2)
    with _probe_endpoint() as endpoint:
        idle = socket.create_connection(("127.0.0.1", endpoint.port))
        poll_until(lambda: _closed_by_server(idle), timeout=5, message="idle connection kept")
        idle.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10) as r:
            assert b"rlfleet_probe_total 1.0" in r.read()
    assert "Traceback" not in capfd.readouterr().err


def test_metrics_endpoint_closes_a_request_that_trickles_past_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slowloris client, sending a header line just within each read's timeout, is cut
    once the request is older than its deadline: it held a thread (and a socket) forever."""
    monkeypatch.setattr(metrics, "_REQUEST_TIMEOUT", 1.0)
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 1.0)
    with _probe_endpoint() as endpoint:
        slow = socket.create_connection(("127.0.0.1", endpoint.port))
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        started = time.monotonic()
        while not _closed_by_server(slow):
            assert time.monotonic() - started < 4.0, "a trickling request is served forever"
            try:
                slow.sendall(b"X-Slow: 1\r\n")
            except ConnectionError:
                break
            time.sleep(0.2)
        slow.close()


def test_metrics_endpoint_keeps_a_bounded_number_of_connections_and_serves_a_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the cap, a new connection closes the oldest: idle connections held a thread and
    a file descriptor each, without bound, until the actor ran out of them."""
    monkeypatch.setattr(metrics, "_MAX_CONNECTIONS", 4)
    with _probe_endpoint() as endpoint:
        idle = []
        for _ in range(10):
            idle.append(socket.create_connection(("127.0.0.1", endpoint.port)))
            time.sleep(0.02)  # accepted in order
        poll_until(lambda: all(_closed_by_server(c) for c in idle[:6]), timeout=5)
        assert not any(_closed_by_server(c) for c in idle[7:])
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10) as r:
            assert b"rlfleet_probe_total 1.0" in r.read()
        for connection in idle:
            connection.close()


def test_metrics_endpoint_accepts_a_burst_of_scrapes_at_once() -> None:
    """Scrapes that connect all at once (several scrapers, a dashboard's refresh) are each
    accepted at once: the listen backlog of 5 dropped the others' SYNs, which the clients
    sent again only after 1, 3, 7... s, some past a scraper's 10 s timeout."""
    burst = 60  # under the connections served at once: none is cut
    with _probe_endpoint() as endpoint:
        clients = [socket.socket() for _ in range(burst)]
        try:
            for client in clients:
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", endpoint.port))
            pending, deadline = set(clients), time.monotonic() + 0.9  # before a SYN is resent
            while pending and time.monotonic() < deadline:
                _, writable, _ = select.select([], list(pending), [], 0.05)
                pending -= {
                    c for c in writable if not c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                }
            assert not pending, f"{len(pending)} of {burst} connections not accepted in 0.9 s"
            for client in clients:
                client.setblocking(True)
                client.settimeout(10)
                client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            for client in clients:
                assert client.makefile("rb").readline().startswith(b"HTTP/1.0 200")
        finally:
            for client in clients:
                client.close()
