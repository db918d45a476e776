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

import json
import pathlib
import secrets
import subprocess
import time
import tomllib
import urllib.request

import pytest
from deploy_files import (
    ROOT,
    compose_config,
    container,
    duration_seconds,
    healthcheck_command,
    image_argv,
    k8s_object,
)
from deploy_processes import (
    TINY_BUDGET,
    check_actor_with_grpcurl,
    local_argv,
    policy_versions,
    process_env,
    replicas,
    run_healthcheck,
    with_flag,
)
from helpers import free_port_on
from hosts_namespace import HostsNamespace

from learner_client._discovery import parse_dns_target, resolve_actors

pytestmark = pytest.mark.slow


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
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """The learner's command with a tiny budget and ``env``, where ``service`` resolves to
    ``addresses``."""
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
        env=process_env(env or {}),
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
    assert scripts["rlfleet-train"] == "apps._job.entry:train"
    assert (ROOT / "apps" / "ppo" / "__main__.py").exists()


def test_image_healthcheck_fails_when_no_actor_answers() -> None:
    # Unhealthy is reported, not hung: the probe ends within Docker's --timeout.
    env = process_env({"RLFLEET_PORT": str(free_port_on(["127.0.0.1"]))})
    started = time.monotonic()
    done = run_healthcheck(healthcheck_command(), env)
    assert done.returncode == 1
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------- kubernetes


def k8s_env(spec: dict, ordinal: int, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """A container's env as the kubelet fills it for pod ``actors-<ordinal>``, with the
    namespace's ``secrets`` (``{name: {key: value}}``); an optional secret absent is unset."""
    env: dict[str, str] = {}
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        secret = entry["valueFrom"].get("secretKeyRef")
        if secret is not None:
            if secret["name"] in secrets:
                env[entry["name"]] = secrets[secret["name"]][secret["key"]]
            else:
                assert secret.get("optional"), f"{entry['name']}: secret {secret['name']} needed"
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
    # The Secret docker/k8s/10-actors.yaml says to create: actors and learner read it.
    token = secrets.token_hex(16)
    namespace_secrets = {"rlfleet-token": {"token": token}}
    specs = []
    for ordinal, loopback in enumerate(loopbacks):
        env = k8s_env(spec, ordinal, namespace_secrets) | {
            "RLFLEET_METRICS_PORT": str(metrics_port)
        }
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
            check_actor_with_grpcurl(replica.address, ordinal, token)
            check_metrics(replica.address, metrics_port, ordinal)
        _wait_for_actors_like_the_init_container(fqdn, loopbacks, port, tmp_path / "init")
        learner = container(k8s_object("Job", "learner")["spec"]["template"]["spec"], "learner")
        run = run_learner(
            learner["args"],
            fqdn,
            loopbacks,
            port,
            tmp_path / "runs" / "cartpole",
            tmp_path / "learner",
            k8s_env(learner, 0, namespace_secrets),
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        for replica in fleet:
            assert policy_versions(replica.address, token) >= 1
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
