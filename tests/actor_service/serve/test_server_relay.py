"""Relayed pushes against hostile peers, on in-process actors over real gRPC.

A push the learner opens with ``relay.source_ticket`` takes its bytes only from a
``RelayWeights`` call that names it and presents that ticket, once. A wrong ticket, a
replayed one, an unknown push, a damaged chunk, forged bytes that pass every chunk's CRC
but not the learner's digest, a relay that stalls: each is refused or answered
``relay_failed``, nothing is applied, and the actor goes on serving.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import secrets
import shutil
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
import safetensors.torch
from actor_harness import Actor
from helpers import self_signed_cert
from test_server_delta import _actor_weights, _bits_equal, _serving, _step, _version

from actor_service._serve._relay import MAX_WAITING
from apps.status._status import _from_describe, format_table
from common.checksum import crc32c
from common.config import RELAY_TICKET_BYTES
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import encode_delta, encode_weights, iter_blob_chunks

TOKEN = "relay-token"
CHUNK = 2048


def relay_header(blob: bytes, version: int, **relay: object) -> pb.PushWeightsRequest:
    fields = {"push_id": secrets.token_bytes(16), "stall_seconds": 1.0} | relay
    header = pb.WeightsHeader(
        model_id="policy",
        version=version,
        total_bytes=len(blob),
        crc32c=crc32c(blob),
        relay=pb.Relay(**fields),
    )
    return pb.PushWeightsRequest(header=header)


def relay_requests(
    push_id: bytes, ticket: bytes, blob: bytes, *, damage: bool = False, stop_at: int = -1
) -> Iterator[pb.RelayRequest]:
    yield pb.RelayRequest(open=pb.RelayOpen(push_id=push_id, ticket=ticket))
    for i, piece in enumerate(iter_blob_chunks(blob, CHUNK)):
        if i == stop_at:
            time.sleep(5)  # holds the call open, sending nothing
            return
        data = bytes(piece)
        crc = crc32c(data) ^ (1 if damage and i == 1 else 0)
        yield pb.RelayRequest(chunk=pb.RelayChunk(data=data, crc32c=crc))


class Opened:
    """A push opened on ``actor`` by the learner, its bytes to come from a relay."""

    def __init__(self, actor: Actor, blob: bytes, version: int) -> None:
        self.ticket = secrets.token_bytes(32)
        self.request = relay_header(blob, version, source_ticket=self.ticket)
        self.push_id = self.request.header.relay.push_id
        pool = concurrent.futures.ThreadPoolExecutor(1)
        self.reply = pool.submit(actor.stub.PushWeights, iter([self.request]), timeout=30)
        pool.shutdown(wait=False)


def a_new_state(actor: Actor) -> tuple[dict, bytes, int]:
    state = _step(_actor_weights(actor), 7)
    return state, encode_weights(state), _version(actor) + 1


def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


def test_the_relay_the_learner_named_delivers_and_the_push_applies(actor: Actor) -> None:
    state, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    sent = actor.stub.RelayWeights(relay_requests(opened.push_id, opened.ticket, blob), timeout=30)
    assert sent.bytes_received == len(blob)
    reply = opened.reply.result(30)
    assert (reply.version, reply.relay_failed) == (version, "")
    assert _bits_equal(_actor_weights(actor), state)


@pytest.mark.parametrize("replay", [False, True], ids=["wrong ticket", "replayed ticket"])
@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_a_ticket_not_the_learners_is_refused_and_nothing_applies(actor: Actor, replay) -> None:
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    if replay:  # the named relay takes the push; the same ticket again is refused
        good = relay_requests(opened.push_id, opened.ticket, blob, stop_at=2)
        first = concurrent.futures.ThreadPoolExecutor(1).submit(
            actor.stub.RelayWeights, good, timeout=30
        )
        time.sleep(0.5)
        ticket = opened.ticket
    else:
        ticket = secrets.token_bytes(32)
    forged = relay_requests(opened.push_id, ticket, blob)
    code = code_of(lambda: actor.stub.RelayWeights(forged, timeout=30))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    reply = opened.reply.result(30)
    assert reply.relay_failed
    assert reply.version < version
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)
    if replay:
        assert first.result(30).bytes_received < len(blob)  # the push gave its relay up


@pytest.mark.parametrize(
    "case", ["damaged chunk", "forged bytes", "too many bytes", "stalled relay"]
)
@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_bytes_that_fail_are_answered_relay_failed_and_nothing_applies(actor: Actor, case) -> None:
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    sent = blob
    if case == "forged bytes":  # every chunk's CRC is right; the learner's digest is not
        sent = encode_weights(_step(_actor_weights(actor), 99))
        assert len(sent) == len(blob)
    if case == "too many bytes":
        sent = blob + bytes(CHUNK + 100)
    requests = relay_requests(
        opened.push_id,
        opened.ticket,
        sent,
        damage=case == "damaged chunk",
        stop_at=3 if case == "stalled relay" else -1,
    )
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) if case == "damaged chunk" else contextlib.nullcontext():
        actor.stub.RelayWeights(requests, timeout=30)
    reply = opened.reply.result(30)
    reason = {
        "damaged chunk": "ended",
        "forged bytes": "fails its check",
        "too many bytes": "fails its check",
        "stalled relay": "no",
    }
    assert reason[case] in reply.relay_failed
    assert reply.version == version - 1
    assert time.monotonic() - started < 10
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)


def test_refused_relay_calls_do_not_use_up_the_waiting_slots(actor: Actor) -> None:
    """More refused RelayWeights calls than MAX_WAITING, one after another, leave the
    actor taking the learner's named relay: a refused call frees its slot.
    """
    state, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    for _ in range(MAX_WAITING + 2):
        forged = relay_requests(opened.push_id, secrets.token_bytes(32), blob)
        code = code_of(lambda f=forged: actor.stub.RelayWeights(f, timeout=30))
        assert code == grpc.StatusCode.PERMISSION_DENIED
    sent = actor.stub.RelayWeights(relay_requests(opened.push_id, opened.ticket, blob), timeout=30)
    assert sent.bytes_received == len(blob)
    assert opened.reply.result(30).version == version
    assert _bits_equal(_actor_weights(actor), state)


def test_a_relay_sending_past_the_blob_is_let_go_once_the_push_has_its_bytes(
    actor: Actor,
) -> None:
    """Chunks a relay sends after the push took its bytes are not queued for nobody: the
    relay's call ends (the push applies) instead of hanging with its chunks held.
    """
    state, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    junk = bytes(CHUNK)
    extra = [pb.RelayRequest(chunk=pb.RelayChunk(data=junk, crc32c=crc32c(junk)))] * 40
    requests = [*relay_requests(opened.push_id, opened.ticket, blob), *extra]
    sent = actor.stub.RelayWeights(iter(requests), timeout=15)
    assert len(blob) <= sent.bytes_received < len(blob) + len(extra) * CHUNK
    assert opened.reply.result(30).version == version
    assert _bits_equal(_actor_weights(actor), state)
    assert _serving(actor)


def test_empty_relay_chunks_end_the_relays_bytes_and_the_push_fails_at_once(actor: Actor) -> None:
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)

    def requests() -> Iterator[pb.RelayRequest]:  # some bytes, then empty chunks for 10 s
        yield pb.RelayRequest(open=pb.RelayOpen(push_id=opened.push_id, ticket=opened.ticket))
        yield pb.RelayRequest(chunk=pb.RelayChunk(data=blob[:100], crc32c=crc32c(blob[:100])))
        for _ in range(40):
            time.sleep(0.25)
            yield pb.RelayRequest(chunk=pb.RelayChunk(data=b"", crc32c=0))

    started = time.monotonic()
    code = code_of(lambda: actor.stub.RelayWeights(requests(), timeout=30))
    reply = opened.reply.result(30)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "ended at 100" in reply.relay_failed
    assert time.monotonic() - started < 5  # not when the relay chose to stop
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)


def test_chunks_on_a_push_whose_bytes_come_from_a_relay_are_refused(actor: Actor) -> None:
    """A push naming a source_ticket takes its bytes only from its relay: a chunk on the
    learner's own call is a protocol error (FAILED_PRECONDITION), not silently dropped.
    """
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    head = relay_header(blob, version, source_ticket=secrets.token_bytes(32))
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    with pytest.raises(grpc.RpcError) as raised:
        actor.stub.PushWeights(iter([head, *chunks]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "relayed header" in raised.value.details()
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)


def test_a_relay_message_that_does_not_parse_is_invalid_argument_and_the_push_fails(
    actor: Actor,
) -> None:
    """Bytes that are no RelayRequest (a peer speaking another protocol) are the peer's
    error, INVALID_ARGUMENT, not a bug's INTERNAL; the push they were for applies nothing.
    """
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)
    relay = actor.channel.stream_unary(
        "/rlfleet.v1.ActorService/RelayWeights",
        request_serializer=bytes,
        response_deserializer=pb.RelayResponse.FromString,
    )
    head = [m.SerializeToString() for m in relay_requests(opened.push_id, opened.ticket, blob)]
    code = code_of(lambda: relay(iter([*head[:2], b"\xff\xff\xff"]), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert opened.reply.result(30).relay_failed
    for garbage in (b"\xff\xff\xff", b"\x0a\x03abc"):  # as a first message
        code = code_of(lambda g=garbage: relay(iter([g]), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_a_tls_actor_without_relay_ca_forwards_nothing(make_actor, tmp_path) -> None:
    cert, key = self_signed_cert(tmp_path, "server")
    actor = make_actor(tls_cert=str(cert), tls_key=str(key))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    blob = bytes(4096)  # refused from its header: the bytes never matter
    with socket.create_server(("127.0.0.1", 0)) as listener:  # where the forward would go
        listener.settimeout(1.0)
        to = f"127.0.0.1:{listener.getsockname()[1]}"
        head = relay_header(blob, 1, forward_to=to, forward_ticket=secrets.token_bytes(32))
        chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
        with grpc.secure_channel(f"127.0.0.1:{actor.port}", credentials) as channel:
            stub = pb_grpc.ActorServiceStub(channel)
            code = code_of(lambda: stub.PushWeights(iter([head, *chunks]), timeout=30))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing dialled: the token never left in the clear


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_a_relay_call_for_a_push_never_opened_is_not_found(actor: Actor) -> None:
    requests = relay_requests(secrets.token_bytes(16), secrets.token_bytes(32), b"x" * 10)
    assert code_of(lambda: actor.stub.RelayWeights(requests, timeout=30)) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert _serving(actor)


#: A relay header's hostile fields, and the field the refusal must name.
HOSTILE_RELAY = {
    "short push id": ({"push_id": b"x"}, "push_id"),
    "huge push id": ({"push_id": b"x" * 100_000}, "push_id"),
    "short ticket": ({"source_ticket": b"t"}, "source_ticket"),
    "long ticket": ({"source_ticket": b"t" * (RELAY_TICKET_BYTES[1] + 1)}, "source_ticket"),
    "long forward ticket": (
        {"forward_to": "127.0.0.1:1", "forward_ticket": b"t" * (RELAY_TICKET_BYTES[1] + 1)},
        "forward_ticket",
    ),
    "forward without ticket": ({"forward_to": "127.0.0.1:1"}, "forward_to and"),
    "forward to a path": ({"forward_to": "unix:/tmp/x", "forward_ticket": b"t" * 32}, "forward_to"),
    **{  # what gRPC reads as another resolver: a local socket, not host:port
        f"forward to {to.split(':')[0]}:": (
            {"forward_to": to, "forward_ticket": b"t" * 32},
            "forward_to",
        )
        for to in ("unix-abstract:rlfleet", "unix:50051", "ipv4:127.0.0.1:1", "vsock:2:1")
    },
    "forward to dns:": (
        {"forward_to": "dns:localhost:1", "forward_ticket": b"t" * 32},
        "forward_to",
    ),
    "forward to a huge name": (
        {"forward_to": "h" * 10_000 + ":1", "forward_ticket": b"t" * 32},
        "forward_to",
    ),
    "zero stall": ({"stall_seconds": 0.0}, "stall_seconds"),
    "huge stall": ({"stall_seconds": 1e12}, "stall_seconds"),
    "nan stall": ({"stall_seconds": float("nan")}, "stall_seconds"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RELAY))
def test_a_hostile_relay_header_is_refused_invalid_argument(actor: Actor, case) -> None:
    before = _actor_weights(actor)
    _, blob, version = a_new_state(actor)
    fields, named = HOSTILE_RELAY[case]
    # A whole push, the blob in its chunks: only the relay fields can be refused.
    request = relay_header(blob, version, **fields)
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    with pytest.raises(grpc.RpcError) as raised:
        actor.stub.PushWeights(iter([request, *chunks]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"relay.{named}" in raised.value.details()
    assert _bits_equal(_actor_weights(actor), before)
    assert _serving(actor)


def test_a_chain_of_token_actors_forwards_with_the_token(make_actor) -> None:
    first, second = make_actor(token=TOKEN), make_actor(token=TOKEN)
    auth = (("authorization", f"Bearer {TOKEN}"),)
    stranger = relay_requests(secrets.token_bytes(16), secrets.token_bytes(32), b"x")
    code = code_of(lambda: second.stub.RelayWeights(stranger, timeout=30))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    state = _step(_actor_weights_with(first, auth), 5)
    blob, push_id, ticket = encode_weights(state), secrets.token_bytes(16), secrets.token_bytes(32)
    head = relay_header(
        blob, 1, push_id=push_id, forward_to=f"127.0.0.1:{second.port}", forward_ticket=ticket
    )
    tail = relay_header(blob, 1, push_id=push_id, source_ticket=ticket)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    waiting = pool.submit(second.stub.PushWeights, iter([tail]), timeout=30, metadata=auth)
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    assert first.stub.PushWeights(iter([head, *chunks]), timeout=30, metadata=auth).version == 1
    assert waiting.result(30).version == 1
    assert _bits_equal(_actor_weights_with(second, auth), state)


def test_a_forward_that_cannot_be_made_leaves_the_relays_own_push_whole(actor: Actor) -> None:
    state, blob, version = a_new_state(actor)
    head = relay_header(
        blob, version, forward_to="127.0.0.1:1", forward_ticket=secrets.token_bytes(32)
    )
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    assert actor.stub.PushWeights(iter([head, *chunks]), timeout=30).version == version
    assert _bits_equal(_actor_weights(actor), state)


@pytest.mark.parametrize("to", ["nothing listening", "another token"])
def test_a_forward_the_next_actor_ends_holds_the_relays_own_push_no_stall_time(
    make_actor, to
) -> None:
    """A next actor that ends the forward's call (refused, another token) ends the forward
    at once: the relay's own push applies without waiting out the stall time.
    """
    actor = make_actor()
    address = (
        "127.0.0.1:1"
        if to == "nothing listening"
        else f"127.0.0.1:{make_actor(token='other').port}"
    )
    state, blob, version = a_new_state(actor)
    head = relay_header(
        blob,
        version,
        forward_to=address,
        forward_ticket=secrets.token_bytes(32),
        stall_seconds=20.0,
    )
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, 512)]
    started = time.monotonic()
    assert actor.stub.PushWeights(iter([head, *chunks]), timeout=60).version == version
    assert time.monotonic() - started < 10
    assert _bits_equal(_actor_weights(actor), state)
    assert _serving(actor)


def _actor_weights_with(actor: Actor, metadata: tuple) -> dict:
    stub = pb_grpc.ActorServiceStub(actor.channel)
    header = None
    parts = []
    for message in stub.GetState(pb.GetStateRequest(), timeout=30, metadata=metadata):
        if message.WhichOneof("kind") == "header":
            header = message.header
        else:
            parts.append(message.chunk)
    assert header is not None
    state = safetensors.torch.load(b"".join(parts))
    prefix = "models/policy/weights/"
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def forward_request(blob: bytes, version: int, to: int, ticket: bytes, push_id: bytes):
    return pb.ForwardRequest(
        model_id="policy",
        version=version,
        total_bytes=len(blob),
        crc32c=crc32c(blob),
        relay=pb.Relay(
            push_id=push_id,
            forward_to=f"127.0.0.1:{to}",
            forward_ticket=ticket,
            stall_seconds=1.0,
        ),
    )


def test_an_actor_forwards_the_blob_it_applied_to_a_returning_peer(make_actor) -> None:
    holder, returning = make_actor(), make_actor()
    state, blob, version = a_new_state(holder)
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    head = relay_header(blob, version)
    assert holder.stub.PushWeights(iter([head, *chunks]), timeout=30).version == version
    opened = Opened(returning, blob, version)
    request = forward_request(blob, version, returning.port, opened.ticket, opened.push_id)
    assert holder.stub.ForwardWeights(request, timeout=30).bytes_received == len(blob)
    assert opened.reply.result(30).version == version
    assert _bits_equal(_actor_weights(returning), state)


def test_a_forward_of_a_blob_not_held_is_refused_and_sends_nothing(make_actor) -> None:
    holder, other = make_actor(), make_actor()
    _, blob, version = a_new_state(holder)
    ticket, push_id = secrets.token_bytes(32), secrets.token_bytes(16)
    never = forward_request(blob, version, other.port, ticket, push_id)
    code = code_of(lambda: holder.stub.ForwardWeights(never, timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    holder.stub.PushWeights(iter([relay_header(blob, version), *chunks]), timeout=30)
    wrong = forward_request(blob, version + 1, other.port, ticket, push_id)  # another version
    code = code_of(lambda: holder.stub.ForwardWeights(wrong, timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    hostile = forward_request(blob, version, other.port, ticket, push_id)
    hostile.relay.source_ticket = ticket  # a forward names no source
    code = code_of(lambda: holder.stub.ForwardWeights(hostile, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert _serving(holder)


def test_a_forward_naming_the_held_version_with_other_bytes_is_refused(make_actor) -> None:
    """ForwardWeights must name the held blob exactly: its version, CRC-32C and size.

    A request naming the version held but another CRC-32C or size describes other bytes
    (another push of that version): the held blob is not forwarded in their place.
    """
    holder, other = make_actor(), make_actor()
    _, blob, version = a_new_state(holder)
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    holder.stub.PushWeights(iter([relay_header(blob, version), *chunks]), timeout=30)
    ticket, push_id = secrets.token_bytes(32), secrets.token_bytes(16)
    other_crc = forward_request(blob, version, other.port, ticket, push_id)
    other_crc.crc32c ^= 1
    other_size = forward_request(blob, version, other.port, ticket, push_id)
    other_size.total_bytes += 1
    for request in (other_crc, other_size):
        code = code_of(lambda r=request: holder.stub.ForwardWeights(r, timeout=30))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert _serving(holder)


def test_a_delta_push_is_never_held_for_forwarding(make_actor) -> None:
    """Only a whole push's blob is held to forward: a delta's bytes are no whole version.

    After a whole push then a delta on top of it, a ForwardWeights naming the delta's
    version, CRC-32C and size is refused: forwarding it would hand a returning peer a
    delta as if it were the whole version.
    """
    holder, other = make_actor(), make_actor()
    state, blob, version = a_new_state(holder)
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, CHUNK)]
    holder.stub.PushWeights(iter([relay_header(blob, version), *chunks]), timeout=30)
    delta = encode_delta(state, _step(state, 3))
    head = relay_header(delta, version + 1)
    head.header.base_version = version
    pieces = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(delta, CHUNK)]
    assert holder.stub.PushWeights(iter([head, *pieces]), timeout=30).version == version + 1
    ticket, push_id = secrets.token_bytes(32), secrets.token_bytes(16)
    request = forward_request(delta, version + 1, other.port, ticket, push_id)
    code = code_of(lambda: holder.stub.ForwardWeights(request, timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert _serving(holder)


def test_describe_lists_the_pushes_in_flight_and_status_shows_them(actor: Actor) -> None:
    _, blob, version = a_new_state(actor)
    opened = Opened(actor, blob, version)  # waits for its relay: in flight, nothing received
    deadline = time.monotonic() + 10
    while not (listed := actor.stub.Describe(pb.DescribeRequest(), timeout=10).pushes_in_flight):
        assert time.monotonic() < deadline, "the opened push was never listed"
        time.sleep(0.05)
    (push,) = listed
    assert (push.model_id, push.version, push.total_bytes) == ("policy", version, len(blob))
    assert (push.received_bytes, push.source) == (0, "relay")
    reply = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    status = _from_describe(f"127.0.0.1:{actor.port}", "SERVING", reply)
    assert f"(<- policy={version} 0% from relay)" in format_table([status])
    assert status.as_json()["pushes"][0]["source"] == "relay"
    assert opened.reply.result(30).relay_failed  # no relay came: given up, nothing applied
    assert not actor.stub.Describe(pb.DescribeRequest(), timeout=10).pushes_in_flight
