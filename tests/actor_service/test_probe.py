"""The container health probe, ``python -m actor_service.probe``, against real health servers."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from helpers import free_port

from actor_service import probe

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServer:
    """A real gRPC server on 127.0.0.1 with only grpc.health.v1."""

    def __init__(self, port: int = 0) -> None:
        self.health = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def set(self, status: int, service: str = "") -> None:
        self.health.set(service, status)

    def stop(self) -> None:
        self.server.stop(None).wait(5)


@pytest.fixture
def server() -> Iterator[HealthServer]:
    started = HealthServer()
    yield started
    started.stop()


def test_probe_exits_0_when_serving(server: HealthServer, capsys) -> None:
    server.set(SERVING)
    assert probe.main(["--port", str(server.port)], environ={}) == 0
    assert capsys.readouterr().out.strip() == f"SERVING 127.0.0.1:{server.port}"


def test_probe_exits_1_when_not_serving(server: HealthServer, capsys) -> None:
    server.set(NOT_SERVING)
    assert probe.main(["--port", str(server.port)], environ={}) == 1
    assert capsys.readouterr().out.startswith("NOT_SERVING")


def test_probe_checks_the_named_service(server: HealthServer, capsys) -> None:
    server.set(NOT_SERVING)
    server.set(SERVING, "rlfleet.v1.ActorService")
    argv = ["--port", str(server.port), "--service", "rlfleet.v1.ActorService"]
    assert probe.main(argv, environ={}) == 0
    assert probe.main(["--port", str(server.port), "--service", "nope"], environ={}) == 1
    assert "SERVICE_UNKNOWN" in capsys.readouterr().out


def test_probe_exits_1_when_nothing_listens(capsys) -> None:
    assert probe.main(["--port", str(free_port()), "--timeout", "2"], environ={}) == 1
    assert capsys.readouterr().out.startswith("UNREACHABLE")


def test_probe_exits_1_on_timeout(capsys) -> None:
    # A listening socket that never speaks HTTP/2: the Check must end at its deadline.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        code = probe.main(["--port", str(silent.getsockname()[1]), "--timeout", "0.5"], environ={})
        elapsed = time.monotonic() - started
    assert code == 1
    assert elapsed < 5
    assert capsys.readouterr().out.split()[0] in {"TIMEOUT", "UNREACHABLE"}


def test_probe_takes_the_port_from_the_environment(server: HealthServer) -> None:
    server.set(SERVING)
    wrong = str(free_port())
    assert probe.main([], environ={"RLFLEET_PORT": str(server.port)}) == 0
    # The plaintext health port wins over the (maybe TLS) main port.
    assert (
        probe.main([], environ={"RLFLEET_PORT": wrong, "RLFLEET_HEALTH_PORT": str(server.port)})
        == 0
    )
    assert probe.main(["--port", wrong], environ={"RLFLEET_PORT": str(server.port)}) == 1


def test_probe_uses_loopback_for_a_wildcard_host(server: HealthServer) -> None:
    server.set(SERVING)
    environ = {"RLFLEET_PORT": str(server.port), "RLFLEET_HOST": "0.0.0.0"}
    assert probe.main([], environ=environ) == 0
    assert probe.main([], environ={**environ, "RLFLEET_HOST": "127.0.0.1"}) == 0
    assert probe.main([], environ={**environ, "RLFLEET_HOST": "127.0.0.9"}) == 1


def test_probe_wait_retries_until_serving(server: HealthServer) -> None:
    server.set(NOT_SERVING)
    timer = threading.Timer(1.0, server.set, args=(SERVING,))
    timer.start()
    try:
        started = time.monotonic()
        assert probe.main(["--port", str(server.port), "--wait", "20"], environ={}) == 0
        assert 0.9 < time.monotonic() - started < 15
    finally:
        timer.cancel()


def test_probe_wait_gives_up_at_its_deadline(server: HealthServer) -> None:
    server.set(NOT_SERVING)
    started = time.monotonic()
    assert probe.main(["--port", str(server.port), "--wait", "1.2"], environ={}) == 1
    assert 0.5 < time.monotonic() - started < 5


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "0"],
        ["--timeout", "nan"],
        ["--wait", "-1"],
        ["--port", "-1"],
        ["--port", "65536"],
    ],
)
def test_probe_raises_if_flags_are_invalid(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        probe.main(argv, environ={})
    assert excinfo.value.code == 2


def test_probe_raises_if_the_port_variable_is_not_a_number() -> None:
    with pytest.raises(SystemExit, match="RLFLEET_PORT"):
        probe.main([], environ={"RLFLEET_PORT": "http"})


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("RLFLEET_PORT", "0", "0 lets the actor pick a free port"),
        ("RLFLEET_HEALTH_PORT", "0", "0 lets the actor pick a free port"),
        ("RLFLEET_PORT", "70000", "port must be in 1..65535, got 70000"),
        ("RLFLEET_PORT", "-1", "port must be in 1..65535, got -1"),
    ],
)
def test_probe_raises_if_the_port_variable_names_no_port_to_dial(
    name: str, value: str, says: str
) -> None:
    # An actor given RLFLEET_PORT=0 binds a free port no probe knows: its container would
    # never turn healthy, with only "UNREACHABLE 127.0.0.1:0" to say why.
    with pytest.raises(SystemExit) as excinfo:
        probe.main([], environ={name: value})
    message = str(excinfo.value.code)  # SystemExit(message): exit 1, Docker's "unhealthy"
    assert message.startswith(f"probe: {name}: ")
    assert says in message


def test_probe_runs_as_a_module_without_importing_torch(server: HealthServer) -> None:
    server.set(SERVING)
    code = (
        "import sys, runpy; sys.argv = ['probe', '--port', sys.argv[1]];"
        "\ntry:\n    runpy.run_module('actor_service.probe', run_name='__main__')"
        "\nexcept SystemExit as exc:\n    print('torch' in sys.modules, exc.code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(server.port)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip().splitlines()[-1] == "False 0", done.stderr
