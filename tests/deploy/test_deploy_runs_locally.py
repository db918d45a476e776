"""The deployment files run: their containers' commands, arguments and environment, as
local processes, so they cannot drift from the code.

For the compose actor and the StatefulSet's actor pod, the test computes what the
container would run (the image's ENTRYPOINT and CMD, each replaced by the
manifest's, and the image's ENV under the manifest's ``environment``/``env``) and
runs it here: ``tini`` is left out, the image's entrypoint script runs as is, and
only the bind address and port change (every replica gets its own loopback
address, all on one port, as every container has its own IP). Each process runs
in a namespace with the host name and ``/etc/hosts`` its container would have,
and the learner's in one where the service name resolves to every replica, as
Docker's and Kubernetes' DNS answer. Then grpcurl checks health, reflection and
Describe; the HEALTHCHECK / probe commands run against the actors; and the
learner's command trains on them with a tiny budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping, Sequence

import pytest
from deploy_files import (
    ENTRYPOINT_SCRIPT,
    ROOT,
    compose_config,
    container,
    duration_seconds,
    final_stage,
    healthcheck_command,
    image_argv,
    k8s_object,
)
from helpers import free_port_on, grpcurl_path
from hosts_namespace import HostsNamespace

from learner_client._discovery import parse_dns_target, resolve_actors

pytestmark = pytest.mark.slow

VENV_BIN = pathlib.Path(sys.executable).parent
READY_RE = re.compile(r"^rlfleet-actor ready worker_id=(\d+) port=(\d+)$")
# Host programs the image provides, as this checkout provides them.
LOCAL_PROGRAMS = {
    "rlfleet-entrypoint": ["sh", str(ENTRYPOINT_SCRIPT)],
    "rlfleet-actor": [sys.executable, "-m", "actor_service"],
    "rlfleet-train": [sys.executable, "-m", "apps.ppo"],
    "python": [sys.executable],
}
TINY_BUDGET = {"--total-frames": "1024", "--frames-per-batch": "512"}


# ------------------------------------------------------------------ commands


def local_argv(container_argv: Sequence[str]) -> list[str]:
    """A container's argv with tini left out and the image's programs mapped to this checkout."""
    argv = list(container_argv)
    if argv and argv[0] == "tini":
        argv = argv[argv.index("--") + 1 :]
    local: list[str] = []
    for index, word in enumerate(argv):
        # Only programs are mapped: the command, and what the entrypoint script execs.
        if index == 0 or (argv[0] == "rlfleet-entrypoint" and index == 1):
            assert word in LOCAL_PROGRAMS, f"the image has no program {word!r}"
            local += LOCAL_PROGRAMS[word]
        else:
            local.append(word)
    return local


def image_env() -> dict[str, str]:
    """The image's ENV (what every container starts with)."""
    env: dict[str, str] = {}
    for keyword, args in final_stage():
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def process_env(container_env: Mapping[str, str], **overrides: str) -> dict[str, str]:
    """This machine's environment without RLFLEET_*, then the image's and the container's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLFLEET_")}
    base["PATH"] = f"{VENV_BIN}:{base.get('PATH', '/usr/bin:/bin')}"
    return {**base, **image_env(), **container_env, **overrides}


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (the flag must be there)."""
    assert flag in argv, f"{flag} missing from {argv}"
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


# ----------------------------------------------------------------- processes


class Replica:
    """One container's process, run here; stdout is read on a thread, stderr goes to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], address: str) -> None:
        self.address = address
        self.env = env
        fd, self._log_path = tempfile.mkstemp(prefix="rlfleet-replica-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT
            )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def ready_line(self, timeout: float = 90.0) -> tuple[int, int]:
        """``(worker_id, port)`` from the ready line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            match = READY_RE.match(line)
            if match:
                return int(match.group(1)), int(match.group(2))
        raise AssertionError(f"not ready (exit {self.process.poll()}): {self.log()[-3000:]}")

    def log(self) -> str:
        return pathlib.Path(self._log_path).read_text(errors="replace")

    def events(self) -> list[dict]:
        """The JSON log records (the manifests ask for RLFLEET_LOG_FORMAT=json)."""
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{")]

    def stop(self, grace: float) -> int:
        """SIGTERM (``docker stop``, pod deletion); the exit code, due within ``grace`` s."""
        self.process.terminate()
        started = time.monotonic()
        try:
            code = self.process.wait(grace + 10)
        finally:
            self.close()
        assert time.monotonic() - started < grace, "drained slower than the SIGKILL deadline"
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        pathlib.Path(self._log_path).unlink(missing_ok=True)


@contextlib.contextmanager
def replicas(specs: list[tuple[list[str], dict[str, str], str]]) -> Iterator[list[Replica]]:
    """Start every replica, and always kill and reap them all."""
    started: list[Replica] = []
    try:
        for argv, env, address in specs:
            started.append(Replica(argv, env, address))
        yield started
    finally:
        for replica in started:
            replica.close()


def grpcurl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [grpcurl_path(), "-max-time", "10", *args], capture_output=True, text=True, timeout=30
    )


def check_actor_with_grpcurl(address: str, worker_id: int) -> None:
    """What an operator checks: health SERVING, reflection lists and describes, Describe answers."""
    health = grpcurl("-plaintext", address, "grpc.health.v1.Health/Check")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "SERVING"
    listing = grpcurl("-plaintext", address, "list")
    assert {"rlfleet.v1.ActorService", "grpc.health.v1.Health"} <= set(listing.stdout.split())
    described = grpcurl("-plaintext", address, "describe", "rlfleet.v1.ActorService")
    assert "rpc Collect ( stream .rlfleet.v1.CollectRequest )" in described.stdout
    describe = grpcurl("-plaintext", "-d", "{}", address, "rlfleet.v1.ActorService/Describe")
    assert describe.returncode == 0, describe.stderr
    assert _field(json.loads(describe.stdout), "worker_id", 0) == worker_id


def run_healthcheck(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """A HEALTHCHECK/probe command, with the container's environment, as Docker execs it."""
    return subprocess.run(
        local_argv(command), env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def policy_versions(address: str) -> int:
    describe = grpcurl("-plaintext", "-d", "{}", address, "rlfleet.v1.ActorService/Describe")
    models = _field(json.loads(describe.stdout), "models", [])
    policy = next(m for m in models if _field(m, "model_id", "") == "policy")
    return int(_field(policy, "version", 0))


def _field(message: dict, name: str, default: object) -> object:
    """A field of grpcurl's JSON, which names fields as in the proto or in lowerCamelCase."""
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
    return message.get(name, message.get(camel, default))


def learner_resolves_dns() -> bool:
    """Whether rlfleet-train expands ``dns:///`` targets itself yet."""
    sources = [
        ROOT / "learner_client" / "_collector.py",
        ROOT / "apps" / "ppo" / "_loop.py",
    ]
    return any("resolve_actors" in path.read_text() for path in sources if path.exists())


def run_learner(
    argv: list[str],
    service: str,
    addresses: list[str],
    port: int,
    out: pathlib.Path,
    namespace_dir: pathlib.Path,
) -> subprocess.CompletedProcess:
    """The learner's command with a tiny budget, where ``service`` resolves to ``addresses``."""
    target = argv[argv.index("--actors") + 1]
    host, _ = parse_dns_target(target)
    assert host == service
    argv = with_flag(argv, "--actors", target.rsplit(":", 1)[0] + f":{port}")
    for flag, value in TINY_BUDGET.items():
        argv = with_flag(argv, flag, value)
    argv = with_flag(argv, "--out", str(out))
    # The learner's metrics port (fixed in the files) would collide with this machine's.
    argv = with_flag(argv, "--metrics-port", "0")
    if not learner_resolves_dns():
        # Until the learner expands dns:/// itself, expand it here exactly as it will.
        resolved = resolve_actors(
            argv[argv.index("--actors") + 1], resolver=lambda _host, _port: addresses
        )
        argv = with_flag(argv, "--actors", ",".join(resolved))
    namespace = HostsNamespace(namespace_dir, {service: addresses})
    return subprocess.run(
        namespace.wrap(local_argv(argv)),
        env=process_env({}),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


# -------------------------------------------------------------------- compose


def check_metrics(address: str, metrics_port: int, worker_id: int) -> None:
    """The replica serves Prometheus metrics naming its worker id."""
    host = address.rsplit(":", 1)[0]
    url = f"http://{host}:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    assert f'rlfleet_actor_info{{env="CartPole-v1",worker_id="{worker_id}"}} 1.0' in text


def test_compose_fleet_runs_locally(tmp_path: pathlib.Path) -> None:
    model = compose_config()
    actor, learner = model["services"]["actor"], model["services"]["learner"]
    argv = local_argv(image_argv(command=actor["command"], entrypoint=actor["entrypoint"]))
    loopbacks = ["127.0.0.2", "127.0.0.3"]
    # The address each container would have on the fleet network (its worker id source).
    network_ips = {"127.0.0.2": "172.30.0.2", "127.0.0.3": "172.30.0.3"}
    port = free_port_on(loopbacks)
    metrics_port = free_port_on(loopbacks)  # the files' 9400 may be taken on this machine
    while metrics_port == port:
        metrics_port = free_port_on(loopbacks)
    assert actor["environment"]["RLFLEET_METRICS_PORT"]
    specs = []
    for index, loopback in enumerate(loopbacks):
        hostname = f"c0ffee00000{index}"  # a container id, as Docker sets the host name
        namespace = HostsNamespace(
            tmp_path / hostname, {hostname: [network_ips[loopback]]}, hostname=hostname
        )
        env = process_env(
            actor["environment"],
            RLFLEET_HOST=loopback,
            RLFLEET_PORT=str(port),
            RLFLEET_METRICS_PORT=str(metrics_port),
        )
        specs.append((namespace.wrap(argv), env, f"{loopback}:{port}"))
    with replicas(specs) as fleet:
        ready = [replica.ready_line() for replica in fleet]
        assert ready == [(2, port), (3, port)]  # worker ids from the fleet-network addresses
        for replica, (worker_id, _) in zip(fleet, ready, strict=True):
            check_actor_with_grpcurl(replica.address, worker_id)
            check_metrics(replica.address, metrics_port, worker_id)
            check = actor["healthcheck"]["test"]
            assert check[0] == "CMD"
            done = run_healthcheck(check[1:], replica.env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.startswith(f"SERVING {replica.address}")

        run = run_learner(
            learner["command"],
            "actor",
            loopbacks,
            port,
            tmp_path / "runs" / "cartpole",
            tmp_path / "learner",
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        summary = json.loads((tmp_path / "runs" / "cartpole" / "summary.json").read_text())
        assert summary["frames"] >= int(TINY_BUDGET["--total-frames"])
        for replica in fleet:  # every replica was found, and got the learner's weights
            assert policy_versions(replica.address) >= 1
            assert any(e["event"] == "weights.push" for e in replica.events())
        # `docker stop`: SIGTERM drains and exits 0 before Compose would SIGKILL.
        grace = duration_seconds(actor["stop_grace_period"])
        assert [replica.stop(grace) for replica in fleet] == [0, 0]


def test_image_programs_are_the_installed_console_scripts() -> None:
    # The image runs rlfleet-actor / rlfleet-train; here they run as python -m, the same mains.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rlfleet-actor"] == "actor_service.__main__:main"
    assert scripts["rlfleet-train"] == "apps.ppo:main"
    assert (ROOT / "apps" / "ppo" / "__main__.py").exists()


def test_image_healthcheck_fails_when_no_actor_answers() -> None:
    # Unhealthy is reported, not hung: the probe ends within Docker's --timeout.
    env = process_env({"RLFLEET_PORT": str(free_port_on(["127.0.0.1"]))})
    started = time.monotonic()
    done = run_healthcheck(healthcheck_command(), env)
    assert done.returncode == 1
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------- kubernetes


def k8s_env(spec: dict, ordinal: int) -> dict[str, str]:
    """A container's env as the kubelet fills it for pod ``actors-<ordinal>``."""
    env: dict[str, str] = {}
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        field = entry["valueFrom"]["fieldRef"]["fieldPath"]
        assert field == "metadata.labels['apps.kubernetes.io/pod-index']", field
        env[entry["name"]] = str(ordinal)
    return env


def test_statefulset_actors_and_learner_job_run_locally(tmp_path: pathlib.Path) -> None:
    pod = k8s_object("StatefulSet", "actors")["spec"]["template"]["spec"]
    spec = container(pod, "actor")
    argv = local_argv(image_argv(command=spec.get("args"), entrypoint=spec.get("command")))
    service = k8s_object("Service", "actors")
    fqdn = f"actors.{service['metadata']['namespace']}.svc.cluster.local"
    loopbacks = ["127.0.0.4", "127.0.0.5"]
    port = free_port_on(loopbacks)
    metrics_port = free_port_on(loopbacks)
    while metrics_port == port:
        metrics_port = free_port_on(loopbacks)
    specs = []
    for ordinal, loopback in enumerate(loopbacks):
        env = k8s_env(spec, ordinal) | {"RLFLEET_METRICS_PORT": str(metrics_port)}
        if ordinal == 1:
            # The documented fallback for clusters without the pod-index label: the hostname.
            del env["RLFLEET_WORKER_ID"]
        pod_name = f"actors-{ordinal}"
        namespace = HostsNamespace(tmp_path / pod_name, {pod_name: [loopback]}, hostname=pod_name)
        specs.append(
            (
                namespace.wrap(argv),
                process_env(env, RLFLEET_HOST=loopback, RLFLEET_PORT=str(port)),
                f"{loopback}:{port}",
            )
        )
    with replicas(specs) as fleet:
        assert [replica.ready_line() for replica in fleet] == [(0, port), (1, port)]
        for ordinal, replica in enumerate(fleet):
            # Also what the kubelet's grpc probe asks: Health/Check, service "", plaintext.
            check_actor_with_grpcurl(replica.address, ordinal)
            check_metrics(replica.address, metrics_port, ordinal)
        _wait_for_actors_like_the_init_container(fqdn, loopbacks, port, tmp_path / "init")
        job = k8s_object("Job", "learner")["spec"]["template"]["spec"]
        run = run_learner(
            container(job, "learner")["args"],
            fqdn,
            loopbacks,
            port,
            tmp_path / "runs" / "cartpole",
            tmp_path / "learner",
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        for replica in fleet:
            assert policy_versions(replica.address) >= 1
        # Pod deletion: SIGTERM drains and exits 0 before the kubelet would SIGKILL.
        grace = pod["terminationGracePeriodSeconds"]
        assert [replica.stop(grace) for replica in fleet] == [0, 0]


def _wait_for_actors_like_the_init_container(
    fqdn: str, addresses: list[str], port: int, directory: pathlib.Path
) -> None:
    job = k8s_object("Job", "learner")["spec"]["template"]["spec"]
    args = container(job, "wait-for-actors", init=True)["args"]
    args = with_flag(args, "--port", str(port))
    namespace = HostsNamespace(directory, {fqdn: addresses})
    done = subprocess.run(
        namespace.wrap(local_argv(args)),
        env=process_env({}),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("SERVING")
