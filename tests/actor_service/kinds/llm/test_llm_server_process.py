"""An LLM actor started through the CLI: TLS, token, health, reflection, state, resume, SIGTERM."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import grpc
import pytest
from actor_harness import RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import grpcurl_path, self_signed_cert, start_actor

from common.llm import check_padded
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

pytest.importorskip("transformers")

TOKEN = "llm-secret"


def _llm_open(**kw) -> pb.OpenSession:
    llm = pb.LLMSettings(generation=pb.GenerationSettings(max_new_tokens=2))
    return open_request(frames_per_batch=4, llm=llm, **kw)


@pytest.mark.long
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_llm_actor_over_tls_with_a_token_serves_resumes_and_drains(tmp_path) -> None:
    cert, key = self_signed_cert(tmp_path, "server")
    args = [
        "--kind", "llm", "--task", "reverse", "--task-kwargs", '{"length": 3}',
        "--policy", "rlfleet:tiny-gpt2", "--policy-kwargs", '{"hidden": 32, "layers": 1}',
        "--num-envs", "2", "--grace-period", "8", "--health-port", "0",
        "--tls-cert", str(cert), "--tls-key", str(key), "--log-format", "json",
    ]  # fmt: skip
    with start_actor(args, env={"RLFLEET_TOKEN": TOKEN}) as actor:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        channel = grpc.secure_channel(f"localhost:{actor.port}", credentials)
        stub, auth = pb_grpc.ActorServiceStub(channel), (("authorization", f"Bearer {TOKEN}"),)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Describe(pb.DescribeRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        described = stub.Describe(pb.DescribeRequest(), metadata=auth, timeout=10)
        assert (described.kind, described.policy) == ("llm", "rlfleet:tiny-gpt2")
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.ActorService"), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING

        # Resume: a learner that lost batch 2 gets it again, same bytes.
        first = RawCollect.open(stub, _llm_open(credits=2), metadata=auth)
        opened = first.opened()
        (_, one), (info_two, _two) = first.batch(), first.batch()
        check_padded(one)
        first.cancel()
        resumed = RawCollect.open(
            stub,
            _llm_open(credits=1, resume_epoch=opened.epoch, resume_after_seq=1),
            metadata=auth,
        )
        assert resumed.opened().resumed
        info, _again = resumed.batch()
        assert info.seq == info_two.seq == 2
        assert info.crc32c == info_two.crc32c
        # SIGTERM: the session ends DRAINING, the process exits 0.
        resumed.credit(4)
        start = time.monotonic()
        actor.terminate()
        end, _ = resumed.end(timeout=20)
        assert end.reason == pb.END_REASON_DRAINING
        assert actor.wait(timeout=20) == 0
        assert time.monotonic() - start < 20
        channel.close()
        events = [json.loads(line)["event"] for line in actor.stderr().splitlines()]
        assert "actor.stopped" in events


@pytest.mark.long
def test_llm_actor_state_round_trips_and_reflection_lists_the_service() -> None:
    args = [
        "--kind", "llm", "--policy-kwargs", '{"hidden": 32, "layers": 1}', "--num-envs", "2",
    ]  # fmt: skip
    with start_actor(args) as actor:
        listed = subprocess.run(
            [grpcurl_path(), "-plaintext", actor.address, "list"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert "rlfleet.v1.ActorService" in listed.stdout.split()
        channel = grpc.insecure_channel(actor.address)
        stub = pb_grpc.ActorServiceStub(channel)
        chunks = list(stub.GetState(pb.GetStateRequest(), timeout=30))
        assert chunks[0].WhichOneof("kind") == "header"
        loaded = stub.LoadState(iter(chunks), timeout=30)
        assert loaded.worker_id == actor.worker_id
        assert stub.SetSeed(pb.SetSeedRequest(seed=5), timeout=30).next_seed == 6
        channel.close()
