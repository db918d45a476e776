"""Bearer-token auth, TLS and mTLS on an in-process actor; health stays open for probes."""

from __future__ import annotations

import pathlib
import shutil

import grpc
import pytest
from actor_harness import RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import self_signed_cert

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from common.weights import sha256_hex

TOKEN = "s3cret-token"


def _describe(stub: pb_grpc.ActorServiceStub, metadata: tuple = ()) -> pb.DescribeResponse:
    return stub.Describe(pb.DescribeRequest(), metadata=metadata, timeout=10)


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer wrong"),),
        (("authorization", TOKEN),),
        (("authorization", "Bearer "),),
        (("authorization", f"Bearer {TOKEN[:-1]}"),),
        (("authorization", f"Bearer {TOKEN}x"),),
    ],
)
def test_auth_raises_if_token_is_missing_or_wrong(make_actor: object, metadata: tuple) -> None:
    actor = make_actor(token=TOKEN)
    with pytest.raises(grpc.RpcError) as error:
        _describe(actor.stub, metadata)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert TOKEN not in (error.value.details() or "")
    assert "RLFLEET_TOKEN" in error.value.details()  # where the token goes


def test_auth_refuses_streams_before_reading_them(make_actor: object) -> None:
    actor = make_actor(token=TOKEN)
    session = RawCollect.open(actor.stub, open_request(credits=1))
    assert session.error().code() == grpc.StatusCode.UNAUTHENTICATED
    header = pb.PushWeightsRequest(
        header=pb.WeightsHeader(version=1, total_bytes=3, sha256=sha256_hex(b"abc"))
    )
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(iter([header, pb.PushWeightsRequest(chunk=b"abc")]), timeout=10)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert actor.worker.batches == 0


@pytest.mark.parametrize("method", ["Describe", "SetSeed"])
def test_auth_refuses_unary_calls_before_parsing_their_body(
    make_actor: object, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    actor = make_actor(token=TOKEN)
    # Not a protobuf message: only a refusal that never parses it says UNAUTHENTICATED.
    call = actor.channel.unary_unary(f"/rlfleet.v1.ActorService/{method}")
    with caplog.at_level("WARNING", logger="rlfleet.actor"), pytest.raises(grpc.RpcError) as error:
        call(b"\xff\xff\xff\xff", timeout=10)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    refusals = [r for r in caplog.records if getattr(r, "rlfleet_event", "") == "auth.refused"]
    assert refusals, "the refusal was not audit-logged"
    assert refusals[-1].rlfleet_fields["peer"].startswith(("ipv4:127.0.0.1:", "ipv6:"))
    assert refusals[-1].rlfleet_fields["method"] == f"/rlfleet.v1.ActorService/{method}"


def test_auth_accepts_the_right_token_and_leaves_health_open(make_actor: object) -> None:
    actor = make_actor(token=TOKEN)
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    assert _describe(actor.stub, metadata).worker_id == 0
    session = RawCollect.open(actor.stub, open_request(credits=1), metadata=metadata)
    session.opened()
    session.batch()
    session.cancel()
    health = health_pb2_grpc.HealthStub(actor.channel)
    response = health.Check(
        health_pb2.HealthCheckRequest(service="rlfleet.v1.ActorService"), timeout=5
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")


@needs_openssl
def test_tls_serves_encrypted_and_refuses_plaintext(
    make_actor: object, tmp_path: pathlib.Path
) -> None:
    cert, key = self_signed_cert(tmp_path, "server")
    actor = make_actor(tls_cert=str(cert), tls_key=str(key))
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{actor.port}", credentials) as channel:
        assert _describe(pb_grpc.ActorServiceStub(channel)).num_envs == 2
    with pytest.raises(grpc.RpcError) as error:
        _describe(actor.stub)  # the fixture's plaintext channel
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


@needs_openssl
def test_mtls_requires_a_client_certificate(make_actor: object, tmp_path: pathlib.Path) -> None:
    cert, key = self_signed_cert(tmp_path, "server")
    client_cert, client_key = self_signed_cert(tmp_path, "client")
    actor = make_actor(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(client_cert))
    target = f"127.0.0.1:{actor.port}"
    with_cert = grpc.ssl_channel_credentials(
        cert.read_bytes(), client_key.read_bytes(), client_cert.read_bytes()
    )
    with grpc.secure_channel(target, with_cert) as channel:
        assert _describe(pb_grpc.ActorServiceStub(channel)).num_envs == 2
    without = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(target, without) as channel, pytest.raises(grpc.RpcError) as error:
        _describe(pb_grpc.ActorServiceStub(channel))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
