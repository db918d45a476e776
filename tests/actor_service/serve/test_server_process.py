"""The rlfleet-actor command as a real subprocess: grpcurl, Collect end to end, SIGTERM drain."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from actor_harness import RawCollect, open_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import ActorProcess, grpcurl_path, poll_until, start_actor

from actor_service._config import ActorConfig
from actor_service._serve._runtime import SHUTDOWN_REAP_BOUND
from actor_service._serve._server import TEARDOWN_RESERVE
from common.config import is_loopback
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def cli_actor() -> Iterator[ActorProcess]:
    """One actor started through the CLI, with a separate health port."""
    with start_actor(
        ["--num-envs", "2", "--worker-id", "3", "--health-port", "0", "--grace-period", "5"]
    ) as actor:
        yield actor


def _grpcurl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [grpcurl_path(), "-plaintext", *args], capture_output=True, text=True, timeout=30
    )


def test_cli_prints_one_ready_line_with_worker_id_and_port(cli_actor: ActorProcess) -> None:
    assert cli_actor.worker_id == 3
    assert cli_actor.port > 0
    assert cli_actor.stdout_lines() == []


@pytest.mark.long
def test_a_second_actor_on_a_port_in_use_exits_1_naming_it(cli_actor: ActorProcess) -> None:
    """gRPC binds with SO_REUSEPORT by default: the second actor used to start and take
    half of the new connections. Each of its ports is refused, the health port included.
    """
    for flags in (
        ["--port", str(cli_actor.port)],
        ["--port", "0", "--health-port", str(cli_actor.port)],
    ):
        started = subprocess.run(
            [sys.executable, "-m", "actor_service", "--host", "127.0.0.1", *flags],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 1, started.stderr[-2000:]
        assert "rlfleet-actor ready" not in started.stdout
        assert f"cannot bind 127.0.0.1:{cli_actor.port} (in use" in started.stderr
    described = [_describe_worker(cli_actor.port) for _ in range(6)]
    assert described == [3] * 6  # every connection reaches the one actor on its port


@pytest.mark.long
def test_an_actor_logs_its_configuration_with_the_token_masked() -> None:
    secret = "s3cret-token-value"
    variables = {"RLFLEET_TOKEN": secret, "RLFLEET_NUMENVS": "2"}  # a misspelt one beside
    with start_actor(["--num-envs", "1"], env=variables) as actor:
        stderr = actor.stderr()
    assert "RLFLEET_NUMENVS is set but no rlfleet-actor setting reads it; did you mean" in stderr
    line = next(line for line in stderr.splitlines() if "actor.config" in line)
    for setting in ("num_envs=1", "env=CartPole-v1", "max_credits=4", "token=***"):
        assert setting in line, line
    assert secret not in stderr
    assert secret not in repr(ActorConfig(token=secret))
    assert "actor.auth_off" not in stderr
    with start_actor(["--num-envs", "1"], env={"RLFLEET_TOKEN": ""}) as open_actor:
        assert "actor.auth_off" in open_actor.stderr()  # a Secret empty: auth is off, loudly
    with start_actor(["--num-envs", "1", "--host", "0.0.0.0"]) as network_actor:
        assert "no token, and it listens on 0.0.0.0" in network_actor.stderr()
    loopback = ["127.0.0.1", "127.0.0.9", "::1", "[::1]", "localhost", "IPV4:127.0.0.1"]
    assert [is_loopback(host) for host in loopback] == [True] * 6
    elsewhere = ("0.0.0.0", "::", "10.0.0.1", "actor-0", "localhost.example.com", "localhostx")
    assert not any(is_loopback(host) for host in elsewhere)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_actor_starts_exits_0(stop: signal.Signals) -> None:
    """Stopped while importing torch: exit 0 with a line, not 143 or a traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "actor_service", "--port", "0", "--num-envs", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)  # its imports take seconds
    process.send_signal(stop)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    if "rlfleet-actor ready" not in out:  # stopped before its server's own handlers
        assert f"stopped by {stop.name} before serving" in err


@pytest.mark.long
def test_a_sigterm_while_the_server_builds_its_envs_stops_it_with_exit_0(
    tmp_path: pathlib.Path,
) -> None:
    """Past the imports the server's own handlers stop it: its env pool never finishes
    building (a reset that hangs), and SIGTERM still ends it with 0, not 1 or 143."""
    here = str(pathlib.Path(__file__).parents[1])  # the helpers of tests/actor_service
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    }
    args = ["--port", "0", "--host", "127.0.0.1", "--num-envs", "1", "--grace-period", "2"]
    args += ["--env-factory", "rlfleet_test_envs:reset_hanging_cartpole"]
    log = tmp_path / "actor.log"
    with (
        log.open("wb") as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "actor_service", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        ) as process,
    ):
        try:
            poll_until(lambda: "actor.listening" in log.read_text(), timeout=60, message="bound")
            process.send_signal(signal.SIGTERM)
            out, _ = process.communicate(timeout=30)
        finally:
            process.kill()
    err = log.read_text()
    assert process.returncode == 0, err[-2000:]
    assert "rlfleet-actor ready" not in out
    assert "before serving" not in err  # the server's handler, not the import-time one
    assert "actor.stopped" in err
    assert "Traceback" not in err


def test_an_actor_binds_an_ipv6_literal_without_brackets() -> None:
    with start_actor(["--host", "::1", "--num-envs", "1"]) as actor:
        with grpc.insecure_channel(f"[::1]:{actor.port}") as channel:
            reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
        assert reply.num_envs == 1


def _describe_worker(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    return int(reply.worker_id)


def test_grpcurl_lists_and_describes_the_service_through_reflection(
    cli_actor: ActorProcess,
) -> None:
    listed = _grpcurl(cli_actor.address, "list")
    assert listed.returncode == 0, listed.stderr
    assert "rlfleet.v1.ActorService" in listed.stdout.split()
    assert "grpc.health.v1.Health" in listed.stdout.split()
    described = _grpcurl(cli_actor.address, "describe", "rlfleet.v1.ActorService")
    assert described.returncode == 0, described.stderr
    assert "rpc Collect ( stream .rlfleet.v1.CollectRequest )" in described.stdout
    called = _grpcurl(cli_actor.address, "rlfleet.v1.ActorService/Describe")
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["worker_id"] == 3


def test_grpcurl_health_check_is_serving(cli_actor: ActorProcess) -> None:
    checked = _grpcurl(
        "-d",
        '{"service": "rlfleet.v1.ActorService"}',
        cli_actor.address,
        "grpc.health.v1.Health/Check",
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == {"status": "SERVING"}


def test_health_port_serves_only_health_and_reflection(cli_actor: ActorProcess) -> None:
    ports = [
        int(line.split("health_port=")[1].split()[0])
        for line in cli_actor.stderr().splitlines()
        if "actor.listening" in line
    ]
    assert ports
    assert ports[0] not in (0, cli_actor.port)
    with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
        status = (
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(), timeout=5)
            .status
        )
        assert status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_cli_actor_collects_end_to_end(cli_actor: ActorProcess) -> None:
    with grpc.insecure_channel(cli_actor.address) as channel:
        stub = pb_grpc.ActorServiceStub(channel)
        session = RawCollect.open(
            stub, open_request(frames_per_batch=20, credits=2, total_frames=60)
        )
        opened = session.opened()
        assert opened.worker_id == 3
        info, td = session.batch()
        assert (info.seq, info.worker_id, info.epoch) == (1, 3, opened.epoch)
        assert td.batch_size == (2, 10)
        session.credit(1)
        end, seqs = session.end()
        assert end.reason == pb.END_REASON_BUDGET_REACHED
        assert seqs == [2, 3]


def _children(pid: int) -> list[int]:
    """Child processes of ``pid``, whichever of its threads started them."""
    return [
        int(child)
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def _alive(pid: int) -> bool:
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def test_sigterm_drains_the_stream_and_exits_0_within_grace() -> None:
    grace = 8.0
    with start_actor(
        [
            "--num-envs",
            "2",
            "--env-backend",
            "async",
            "--grace-period",
            str(grace),
            "--log-format",
            "json",
        ]
    ) as actor:
        env_processes = _children(actor.process.pid)
        assert len(env_processes) >= 2, "the async env pool runs in subprocesses"
        channel = grpc.insecure_channel(actor.address)
        session = RawCollect.open(
            pb_grpc.ActorServiceStub(channel), open_request(frames_per_batch=200, credits=4)
        )
        session.opened()
        session.batch()
        session.credit(4)
        start = time.monotonic()
        actor.terminate()
        end, seqs = session.end(timeout=grace)
        assert end.reason == pb.END_REASON_DRAINING
        assert end.last_seq == 1 + len(seqs)
        assert actor.wait(timeout=grace) == 0
        assert time.monotonic() - start < grace
        channel.close()
        events = [json.loads(line)["event"] for line in actor.stderr().splitlines()]
        assert events.index("actor.draining") < events.index("session.ended")
        assert "actor.stopped" in events
        poll_until(
            lambda: not any(_alive(pid) for pid in env_processes),
            timeout=5,
            message="env subprocesses reaped",
        )


@pytest.mark.long
@pytest.mark.parametrize(("backend", "num_envs"), [("sync", 16), ("async", 4)])
def test_sigterm_mid_batch_under_load_exits_0_within_grace(backend: str, num_envs: int) -> None:
    """The promise for a busy actor: SIGTERM while a learner's batch is being collected
    (one far too long to finish) ends the process, exit code 0, within --grace-period."""
    grace = 2.0
    args = ["--num-envs", str(num_envs), "--env-backend", backend, "--grace-period", str(grace)]
    with start_actor([*args, "--log-format", "json"]) as actor:
        with grpc.insecure_channel(actor.address) as channel:
            session = RawCollect.open(
                pb_grpc.ActorServiceStub(channel),
                open_request(frames_per_batch=25_000 * num_envs, credits=2),
            )
            session.opened()
            time.sleep(0.5)  # collecting: 100k+ frames take far longer than the grace period
            start = time.monotonic()
            actor.terminate()
            code = actor.wait(timeout=grace + SHUTDOWN_REAP_BOUND + 10)
            elapsed = time.monotonic() - start
        logged = [json.loads(line) for line in actor.stderr().splitlines() if line.startswith("{")]
        events = {entry["event"]: entry["fields"] for entry in logged}
        assert code == 0
        assert "actor.drain_timeout" in events, "the signal came in the middle of a batch"
        assert "session.batch_abandoned" in events
        assert "actor.children_killed" not in events, "the env pool was closed, not killed"
        # What the actor controls: its stop ends a quarter of the reserve before the deadline.
        assert events["actor.stopped"]["seconds"] < grace - TEARDOWN_RESERVE / 4
        assert elapsed < grace, f"exited {elapsed:.2f} s after SIGTERM (grace {grace} s)"


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = [k for p in frontier if _alive(p) for k in _children(p)]
        found += kids
        frontier = kids
    return found


@pytest.mark.long
def test_sigterm_with_a_hung_env_reaps_every_child_within_grace_plus_bound() -> None:
    grace = 2.0
    here = str(pathlib.Path(__file__).parents[1])  # the helpers of tests/actor_service
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    args = ["--num-envs", "2", "--env-backend", "async", "--grace-period", str(grace)]
    args += ["--env-factory", "rlfleet_test_envs:hanging_cartpole", "--env-kwargs", '{"steps": 3}']
    with start_actor([*args, "--step-timeout", "600"], env=env) as actor:
        children = _descendants(actor.process.pid)
        try:
            assert len(children) >= 3, "env workers and the multiprocessing resource tracker"
            with grpc.insecure_channel(actor.address) as channel:
                session = RawCollect.open(
                    pb_grpc.ActorServiceStub(channel), open_request(frames_per_batch=20, credits=1)
                )
                session.opened()
                time.sleep(1.0)  # the 4th step hangs in the env workers
                start = time.monotonic()
                actor.terminate()
                actor.wait(timeout=grace + SHUTDOWN_REAP_BOUND + 10)
                elapsed = time.monotonic() - start
                session.cancel()
            poll_until(
                lambda: not any(_alive(pid) for pid in children),
                timeout=2,
                message=f"children reaped: {[p for p in children if _alive(p)]} still run",
            )
            assert elapsed < grace + SHUTDOWN_REAP_BOUND
            assert "actor.children_killed" in actor.stderr()
        finally:  # orphans would also hold the actor's stdout pipe open
            for pid in children:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
