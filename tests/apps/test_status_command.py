"""``rlfleet status`` (``python -m apps.status status``) against live actor processes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckResponse
from helpers import (
    UNPARSABLE,
    ActorProcess,
    poll_until,
    self_signed_cert,
    serving_raw_replies,
    start_actor,
)

from apps import status as cli
from apps.status._status import ActorStatus, format_table, with_rates
from common.config import MIN_PEER_PROTOCOL, PROTOCOL_VERSION
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEARNER = "status-test-learner"
TOKEN = "status-token-8d2e"


def rlfleet(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run the ``rlfleet`` command in a subprocess (as an operator would)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RLFLEET_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "apps.status", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


class Learner:
    """A learner session on one actor that keeps batches flowing (acks and re-grants credit)."""

    def __init__(
        self,
        address: str,
        metadata: tuple = (),
        channel: grpc.Channel | None = None,
        frames_per_batch: int = 64,
    ):
        self.channel = channel or grpc.insecure_channel(address)
        self._requests: queue.Queue = queue.Queue()
        settings = pb.CollectSettings(
            frames_per_batch=frames_per_batch, total_frames=-1, reset_when_done=True
        )
        open_msg = pb.OpenSession(
            settings=settings,
            credits=2,
            learner_id=LEARNER,
        )
        self._requests.put(pb.CollectRequest(open=open_msg))
        stub = pb_grpc.ActorServiceStub(self.channel)
        self.call = stub.Collect(iter(self._requests.get, None), metadata=metadata)
        self.opened = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.opened.wait(30), "the session did not open"

    def _run(self) -> None:
        try:
            for response in self.call:
                if response.WhichOneof("kind") == "opened":
                    self.opened.set()
                elif response.WhichOneof("kind") == "chunk":
                    chunk = response.chunk
                    if chunk.index == chunk.count - 1:
                        self._requests.put(pb.CollectRequest(ack=pb.Ack(seq=chunk.seq)))
                        self._requests.put(pb.CollectRequest(credit=pb.Credit(batches=1)))
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.call.cancel()
        self._requests.put(None)
        self._thread.join(10)
        self.channel.close()


@pytest.fixture
def fleet() -> Iterator[list[ActorProcess]]:
    actors = [
        start_actor(["--num-envs", "2", "--worker-id", str(worker_id), "--seed", "1"])
        for worker_id in (0, 1)
    ]
    yield actors
    for actor in actors:
        actor.close()


@pytest.mark.long
def test_status_shows_a_healthy_fleet_and_exits_0(fleet: list[ActorProcess]) -> None:
    learner = Learner(fleet[0].address)
    try:
        result = rlfleet("status", *(a.address for a in fleet), "--json", "--interval", "1")
        table = rlfleet("status", *(a.address for a in fleet), "--interval", "0.5")
    finally:
        learner.close()
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["address"] for row in rows] == [a.address for a in fleet]
    assert [row["worker_id"] for row in rows] == [0, 1]
    for row in rows:
        assert row["health"] == "SERVING"
        assert row["serving"] is True
        assert row["kind"] == "env"
        assert row["env"] == "CartPole-v1"
        assert row["policy_versions"] == {"policy": 0}
        assert row["uptime_seconds"] > 0
        assert row["error"] == ""
    held, free = rows
    assert (held["session"], held["learner_id"]) == ("held", LEARNER)
    assert held["frames"] > 0
    assert held["frames_per_second"] > 0
    assert (free["session"], free["learner_id"], free["frames"]) == ("free", "", 0)
    assert free["frames_per_second"] == 0
    assert table.returncode == 0, table.stderr
    header, first, second, summary = table.stdout.splitlines()
    assert header.split()[:4] == ["WORKER", "KIND", "ENV", "HEALTH"]
    assert first.split()[:5] == ["0", "env", "CartPole-v1", "SERVING", "held"]
    assert f"held by {LEARNER}" in first
    assert "policy=0" in first
    assert fleet[0].address in first
    assert second.split()[:5] == ["1", "env", "CartPole-v1", "SERVING", "free"]
    assert summary.startswith("2/2 serving, ")


@pytest.mark.long
def test_status_exits_1_and_shows_a_killed_actor_not_serving(fleet: list[ActorProcess]) -> None:
    fleet[1].kill()
    result = rlfleet("status", *(a.address for a in fleet), "--json", "--interval", "0.2")
    assert result.returncode == 1, result.stderr
    alive, dead = json.loads(result.stdout)
    assert (alive["health"], alive["serving"]) == ("SERVING", True)
    assert (dead["health"], dead["serving"], dead["worker_id"]) == ("UNREACHABLE", False, None)
    assert dead["error"].startswith("UNAVAILABLE")
    table = rlfleet("status", *(a.address for a in fleet), "--interval", "0.2")
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    dead_line = next(line for line in lines if line.endswith(fleet[1].address))
    assert dead_line.split()[:4] == ["-", "-", "-", "UNREACHABLE"]
    assert "1/2 serving" in table.stdout


def test_status_exits_1_when_one_actor_answers_at_two_addresses(
    fleet: list[ActorProcess],
) -> None:
    """127.0.0.1 and localhost reach the same actor: it was counted twice, "2/2 serving", exit
    0, for a fleet every learner refuses (worker_ids must be unique)."""
    port = fleet[0].address.rpartition(":")[2]
    result = rlfleet("status", fleet[0].address, f"localhost:{port}", "--interval", "0.2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"answers at {fleet[0].address}, localhost:{port}" in result.stdout


@pytest.mark.slow
def test_status_watch_refreshes_count_times(fleet: list[ActorProcess]) -> None:
    result = rlfleet(
        "status", fleet[0].address, "--watch", "--count", "3", "--interval", "0.2", "--json"
    )
    assert result.returncode == 0, result.stderr
    rounds = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rounds) == 3
    assert all(r[0]["worker_id"] == 0 and r[0]["serving"] for r in rounds)
    watched = rlfleet("status", fleet[0].address, "--watch", "--count", "2", "--interval", "0.2")
    assert watched.stdout.count("1/1 serving") == 2
    assert "\x1b[" not in watched.stdout  # piped: no screen-clearing codes between rounds


def test_status_watch_clears_the_screen_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = cli.build_parser().parse_args(["status", "a:1", "--watch"])
    for out, clears in ((Terminal(), 1), (io.StringIO(), 0)):
        cli._show([], args, out)
        assert out.getvalue().count("\x1b[H\x1b[2J") == clears


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give actor addresses"),
        (("--dns", "actor:99999"), "port must be in 1..65535"),
        (("127.0.0.1:99999",), "port must be in 1..65535"),  # gRPC dialled 34463
        (("127.0.0.1",), "must be 'host:port'"),  # gRPC dialled 443
        (("127.0.0.1:1", "--interval", "0"), "expected seconds in (0, 1e+07], got '0'"),
        (("127.0.0.1:1", "--interval", "nan"), "expected seconds in (0, 1e+07]"),
        # a sleep that long overflowed (a traceback after the first probe)
        (("127.0.0.1:1", "--interval", "1e10"), "--interval: expected seconds in (0, 1e+07]"),
        # a deadline that far expired at once: every actor read TIMEOUT
        (("127.0.0.1:1", "--timeout", "1e10"), "--timeout: expected seconds in (0, 1e+07]"),
        (("127.0.0.1:1", "--count", "2"), "add --watch"),
        (("127.0.0.1:1", "--tls-cert", "x.pem"), "--tls-cert and --tls-key"),
        # without a CA the probe is plaintext: the client certificate would silently go unused
        (("127.0.0.1:1", "--tls-cert", "c.pem", "--tls-key", "k.pem"), "--tls-cert needs --tls-ca"),
        (("127.0.0.1:1", "--tls-ca", "/no/such/ca.pem"), "cannot read"),
        (("127.0.0.1:1", "127.0.0.1:1"), "127.0.0.1:1 is given twice"),  # 2/2 serving of one
        (("--dns", "localhost"), "--dns localhost: give NAME:PORT"),  # dialled 50051
    ],
)
def test_status_raises_if_arguments_are_bad(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "usage: rlfleet status" in err  # the subcommand's usage, also after parsing


def test_status_exits_1_when_a_dns_name_resolves_to_no_actor(capsys: pytest.CaptureFixture) -> None:
    """No actor to probe is a fleet not serving (1), not bad arguments (2)."""
    assert cli.main(["status", "--dns", "no-such-actor.invalid:50051"]) == 1
    assert "no-such-actor.invalid" in capsys.readouterr().err


def test_status_answers_without_importing_torch(fleet: list[ActorProcess]) -> None:
    """An operator's command starts in well under a second: torch (seconds) is not loaded."""
    probe = (
        "import sys\n"
        "from apps.status import main\n"
        f"code = main(['status', '{fleet[0].address}', '--json'])\n"
        "heavy = sorted(m for m in ('torch', 'tensordict', 'numpy') if m in sys.modules)\n"
        "print(code, heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 []"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_status_speaks_tls_and_token_like_the_learner(tmp_path: pathlib.Path) -> None:
    cert, key = self_signed_cert(tmp_path, "actor")
    args = ["--num-envs", "2", "--tls-cert", str(cert), "--tls-key", str(key), "--token", TOKEN]
    with start_actor(args) as actor:
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        channel = grpc.secure_channel(actor.address, credentials)
        learner = Learner(actor.address, (("authorization", f"Bearer {TOKEN}"),), channel)
        try:
            good = rlfleet(
                "status", actor.address, "--tls-ca", str(cert), "--token", TOKEN, "--json"
            )
            no_token = rlfleet("status", actor.address, "--tls-ca", str(cert), "--json")
            plaintext = rlfleet("status", actor.address, "--token", TOKEN, "--json")
        finally:
            learner.close()
    assert good.returncode == 0, good.stderr
    (row,) = json.loads(good.stdout)
    assert (row["health"], row["session"], row["learner_id"]) == ("SERVING", "held", LEARNER)
    assert no_token.returncode == 1
    (row,) = json.loads(no_token.stdout)
    assert row["health"] == "SERVING"  # health stays open; Describe needs the token
    assert row["error"].startswith("UNAUTHENTICATED")
    assert plaintext.returncode == 1
    (row,) = json.loads(plaintext.stdout)
    assert row["health"] == "UNREACHABLE"
    assert "if the actor serves TLS (--tls-cert), pass --tls-ca" in row["error"]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_status_says_to_drop_tls_for_a_plaintext_actor(
    fleet: list[ActorProcess], tmp_path: pathlib.Path
) -> None:
    cert, _ = self_signed_cert(tmp_path, "ca")
    result = rlfleet("status", fleet[0].address, "--tls-ca", str(cert), "--json")
    assert result.returncode == 1
    (row,) = json.loads(result.stdout)
    assert "the actor answers in plaintext" in row["error"]
    assert "drop --tls-ca" in row["error"]


@pytest.mark.long
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_status_names_the_client_certificate_an_mtls_actor_wants(tmp_path: pathlib.Path) -> None:
    cert, key = self_signed_cert(tmp_path, "actor")
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with start_actor(["--num-envs", "1", *tls, "--tls-client-ca", str(cert)]) as actor:
        without = rlfleet("status", actor.address, "--tls-ca", str(cert), "--json")
        given = rlfleet("status", actor.address, "--tls-ca", str(cert), *tls, "--json")
    assert without.returncode == 1
    (row,) = json.loads(without.stdout)
    assert (
        "asks for client certificates (--tls-client-ca), pass --tls-cert and --tls-key"
        in (row["error"])
    )
    assert given.returncode == 0, given.stdout


def test_status_rate_uses_the_actors_clock_and_skips_restarts() -> None:
    before = ActorStatus("a:1", "SERVING", worker_id=0, epoch=7, frames=1_000, uptime_seconds=10.0)
    same = dataclasses.replace(before, frames=5_000, uptime_seconds=12.0)
    restarted = dataclasses.replace(same, epoch=8, frames=10, uptime_seconds=0.5)
    assert with_rates([same], [before])[0].frames_per_second == 2_000
    assert with_rates([restarted], [before])[0].frames_per_second is None
    assert with_rates([same], [])[0].frames_per_second is None


def test_status_shows_a_draining_actor_not_serving(capsys: pytest.CaptureFixture) -> None:
    from actor_service import ActorConfig, create_server

    config = ActorConfig(port=0, num_envs=2, seed=0, grace_period=10.0)
    handle = create_server(config).run_in_thread()
    address = f"127.0.0.1:{handle.port}"
    # A batch that takes many seconds is in flight when the drain starts: the drain waits for it.
    learner = Learner(address, frames_per_batch=100_000)
    stopping = threading.Thread(target=handle.stop, kwargs={"grace": 10.0}, daemon=True)
    try:
        stopping.start()
        poll_until(lambda: handle.server.runtime.draining)
        code = cli.main(["status", address, "--json", "--interval", "0.2"])
        (row,) = json.loads(capsys.readouterr().out)
    finally:
        learner.close()
        stopping.join(30)
    assert code == 1
    assert (row["health"], row["session"], row["serving"]) == ("NOT_SERVING", "draining", False)


# What every actor of this build says of its protocol revision.
_REVISION = {"protocol_version": PROTOCOL_VERSION, "min_peer_protocol": MIN_PEER_PROTOCOL}


class _OddDescribe(pb_grpc.ActorServiceServicer):
    """Answers Describe with num_envs 0, which no actor reports."""

    def Describe(self, request: pb.DescribeRequest, context: object) -> pb.DescribeResponse:
        return pb.DescribeResponse(worker_id=3, epoch=5, num_envs=0, max_credits=4, **_REVISION)


@contextlib.contextmanager
def _serving(servicer: pb_grpc.ActorServiceServicer) -> Iterator[str]:
    """A plain gRPC server of ``servicer`` with a health service: its address."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ActorServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_status_shows_a_describe_no_actor_sends_as_that_actors_error() -> None:
    with _serving(_OddDescribe()) as address:
        result = rlfleet("status", address, "--json", "--interval", "0.2")
    assert result.returncode == 1, result.stderr
    (row,) = json.loads(result.stdout)
    assert "Describe reports num_envs 0, outside 1..4096" in row["error"]


class _NewerDescribe(pb_grpc.ActorServiceServicer):
    """Answers Describe as a healthy actor of a later revision that needs learners of it."""

    def Describe(self, request: pb.DescribeRequest, context: object) -> pb.DescribeResponse:
        newer = PROTOCOL_VERSION + 1
        return pb.DescribeResponse(
            worker_id=3,
            epoch=5,
            num_envs=1,
            max_credits=4,
            protocol_version=newer,
            min_peer_protocol=newer,
        )


def test_status_shows_an_actor_of_another_protocol_revision_as_that_actors_error() -> None:
    """A rolling update half done: the learner of this build refuses the actor, so a fleet
    check (exit 0 means a learner can use every actor) must not pass it as serving."""
    with _serving(_NewerDescribe()) as address:
        result = rlfleet("status", address, "--json", "--interval", "0.2")
    assert result.returncode == 1, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["serving"] is False
    assert f"speaks protocol {PROTOCOL_VERSION + 1}" in row["error"]
    assert "run the same rlfleet release" in row["error"]


@pytest.mark.parametrize("method", ["Check", "Describe"])
def test_status_shows_a_reply_that_does_not_parse_as_that_actors_error(
    method: str, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    """A Health or Describe reply no message parses from (a broken actor, or one whose build
    retyped a field): the actor's row names the call, with no parser traceback logged."""
    serving = HealthCheckResponse(status=HealthCheckResponse.SERVING).SerializeToString()
    describe = UNPARSABLE if method == "Describe" else b""
    health = UNPARSABLE if method == "Check" else serving
    with serving_raw_replies({"Describe": describe}, health=health) as address:
        code = cli.main(["status", address, "--json", "--interval", "0.2"])
    (row,) = json.loads(capsys.readouterr().out)
    assert code == 1
    assert row["error"].startswith(f"{address}: its {method} reply of 1 bytes does not parse")
    assert "Exception deserializing" not in caplog.text


def test_status_watch_stopped_by_ctrl_c_exits_130() -> None:
    """Ctrl-C ends ``--watch`` with 130 (interrupted), not 0 (which says the fleet serves)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["status", "127.0.0.1:1", "--watch", "--interval", "0.2", "--timeout", "0.5"]
    with subprocess.Popen(
        [sys.executable, "-m", "apps.status", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        try:
            line = ""
            while "serving" not in line:  # the first round is shown: the watch loop runs
                line = proc.stdout.readline()
                assert line, "rlfleet status ended before its first round"
            assert line.startswith("0/1 serving")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()


def test_status_sends_the_token_from_the_flag_or_rlfleet_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Describe carries the bearer token of ``--token``, else of ``$RLFLEET_TOKEN`` (as the
    learner's); without one a token-guarded actor is reported UNAUTHENTICATED, exit 1."""
    from actor_service import ActorConfig, create_server

    handle = create_server(ActorConfig(port=0, num_envs=1, seed=0, token=TOKEN)).run_in_thread()
    args = ["status", f"127.0.0.1:{handle.port}", "--json", "--interval", "0.05"]
    try:
        monkeypatch.delenv("RLFLEET_TOKEN", raising=False)
        codes = [cli.main(args), cli.main([*args, "--token", TOKEN])]
        monkeypatch.setenv("RLFLEET_TOKEN", TOKEN)
        codes.append(cli.main(args))
        rows = [json.loads(line)[0] for line in capsys.readouterr().out.splitlines()]
    finally:
        handle.stop(grace=0.0)
    assert codes == [1, 0, 0]
    assert rows[0]["error"].startswith("UNAUTHENTICATED")
    assert [row["serving"] for row in rows] == [False, True, True]


@pytest.mark.parametrize(
    ("flag", "env", "named"),
    [
        (None, TOKEN + "\n", "RLFLEET_TOKEN: token must hold printable ASCII"),  # cat tokenfile
        ("s\u00e9cret", TOKEN, "--token: token must hold printable ASCII"),
        ("t" * 4097, "", "--token: token must be at most 4096 characters"),
    ],
)
def test_status_raises_if_the_token_is_one_no_header_carries(
    flag: str | None,
    env: str,
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """A token gRPC cannot send is bad arguments naming its source, not INTERNAL per actor."""
    monkeypatch.setenv("RLFLEET_TOKEN", env)
    args = ["status", "127.0.0.1:1", "--timeout", "0.5"]
    with pytest.raises(SystemExit) as exited:
        cli.main(args if flag is None else [*args, "--token", flag])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


class _ClocklessDescribe(pb_grpc.ActorServiceServicer):
    """Answers Describe as an actor would, but with an uptime of NaN seconds."""

    def Describe(self, request: pb.DescribeRequest, context: object) -> pb.DescribeResponse:
        return pb.DescribeResponse(
            worker_id=3,
            epoch=5,
            num_envs=1,
            max_credits=4,
            uptime_seconds=float("nan"),
            **_REVISION,
        )


def test_status_shows_an_uptime_no_clock_gives_as_that_actors_error(
    capsys: pytest.CaptureFixture,
) -> None:
    """NaN seconds used to crash the table (ValueError: cannot convert float NaN to integer)."""
    with _serving(_ClocklessDescribe()) as address:
        code = cli.main(["status", address, "--interval", "0.2"])
    assert code == 1
    assert "Describe reports uptime_seconds nan, outside 0..1e+10" in capsys.readouterr().out


def test_status_table_counts_only_described_actors_and_shows_push_progress() -> None:
    """An actor healthy but refusing Describe is not serving; a push shows its bytes done."""
    push = {
        "model_id": "policy",
        "version": 5,
        "total_bytes": 200,
        "received_bytes": 80,
        "source": "relay",
    }
    pushing = ActorStatus("a:1", "SERVING", worker_id=0, session="free", pushes=[push])
    refused = ActorStatus("b:2", "SERVING", error="UNAUTHENTICATED: missing token")
    lines = format_table([pushing, refused]).splitlines()
    assert "(<- policy=5 40% from relay)" in lines[1]
    assert lines[3].startswith("1/2 serving, ")
    assert lines[4] == "b:2: UNAUTHENTICATED: missing token"


def test_status_watch_count_stops_after_that_many_refreshes(
    capsys: pytest.CaptureFixture,
) -> None:
    """``--watch --count 2`` shows two rounds then exits with the fleet's status (none serves)."""
    args = ["status", "127.0.0.1:1", "--watch", "--count", "2", "--interval", "0.05", "--json"]
    assert cli.main([*args, "--timeout", "0.5"]) == 1
    rounds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [[row["health"] for row in r] for r in rounds] == [["UNREACHABLE"], ["UNREACHABLE"]]
