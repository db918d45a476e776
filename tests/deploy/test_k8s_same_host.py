"""``docker/k8s/same-host/``: a learner and its actor sidecars in one pod, through /dev/shm.

The manifest validates against the Kubernetes schema (native sidecars: 1.29 or later), holds
what the learner's same-host proof needs (one memory-backed ``/dev/shm`` in every container,
one user id, the actors on the pod's loopback), and runs: its containers' commands and
environment as local processes sharing one host name (the pod's), as in
``test_deploy_runs_locally.py``; every push the learner makes reaches each actor through a
shared-memory segment, by the actor's own ``weights.push`` log.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from deploy_files import K8S, image_argv
from deploy_processes import (
    TINY_BUDGET,
    local_argv,
    policy_versions,
    process_env,
    replicas,
    with_flag,
)
from helpers import free_port_on
from hosts_namespace import HostsNamespace
from test_k8s import K8S_VERSIONS

MANIFEST = K8S / "same-host" / "learner-with-actors.yaml"


def _pod() -> dict:
    (job,) = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    assert job["kind"] == "Job"
    return job["spec"]["template"]["spec"]


def _env(container: dict) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in container["env"]}


def test_k8s_same_host_pod_validates_against_the_kubernetes_schema() -> None:
    (job,) = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)
    broken = yaml.safe_load(MANIFEST.read_text())
    broken["spec"]["template"]["spec"]["initContainers"][0]["restartPolicy"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_k8s_same_host_pod_shares_dev_shm_user_and_loopback() -> None:
    pod = _pod()
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    actors, (learner,) = pod["initContainers"], pod["containers"]
    for container in [*actors, learner]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/dev/shm"] == "dshm", container["name"]
        assert "runAsUser" not in container.get("securityContext", {})  # the pod's one user
    assert pod["securityContext"]["runAsUser"] == 10001
    addresses = []
    for index, actor in enumerate(actors):
        assert actor["restartPolicy"] == "Always"  # a native sidecar: up before the learner
        env = _env(actor)
        assert (env["RLFLEET_WORKER_ID"], env["RLFLEET_HOST"]) == (str(index), "127.0.0.1")
        # The kubelet's gRPC probe dials the pod IP, where a loopback actor never answers.
        probe = actor["startupProbe"]["exec"]["command"]
        assert probe[:3] == ["python", "-m", "actor_service.probe"]
        addresses.append(f"127.0.0.1:{env['RLFLEET_PORT']}")
    args = learner["args"]
    assert args[args.index("--actors") + 1] == ",".join(addresses)


@pytest.mark.long
@pytest.mark.parametrize(
    ("switch", "source"),
    [({}, "shared memory"), ({"RLFLEET_SHARED_MEMORY": "0"}, "learner")],
    ids=["shared", "turned-off"],
)
def test_k8s_same_host_pod_runs_locally_and_pushes_through_shared_memory(
    tmp_path: pathlib.Path, switch: dict[str, str], source: str
) -> None:
    """Each push reaches the actors through /dev/shm, or over gRPC where an actor turns it off."""
    pod = _pod()
    actors, (learner,) = pod["initContainers"], pod["containers"]
    pod_name = "learner-with-actors-x7k2p"
    namespace = HostsNamespace(tmp_path / "pod", {pod_name: ["127.0.0.1"]}, hostname=pod_name)
    specs, ports = [], []
    for actor in actors:
        port = free_port_on(["127.0.0.1"])
        while port in ports:
            port = free_port_on(["127.0.0.1"])
        ports.append(port)
        argv = local_argv(image_argv(command=actor["args"]))
        env = process_env(_env(actor) | switch, RLFLEET_PORT=str(port))
        specs.append((namespace.wrap(argv), env, f"127.0.0.1:{port}"))
    with replicas(specs) as fleet:
        assert [replica.ready_line() for replica in fleet] == [(0, ports[0]), (1, ports[1])]
        for actor, (_, env, _) in zip(actors, specs, strict=True):  # the sidecars' probes pass
            probe = actor["startupProbe"]["exec"]["command"]
            checked = subprocess.run(
                namespace.wrap([sys.executable, *probe[1:]]), env=env, timeout=30
            )
            assert checked.returncode == 0, probe
        argv = with_flag(learner["args"], "--actors", ",".join(r.address for r in fleet))
        for flag, value in TINY_BUDGET.items():
            argv = with_flag(argv, flag, value)
        argv = with_flag(argv, "--out", str(tmp_path / "runs"))
        argv = with_flag(argv, "--metrics-port", "0")
        run = subprocess.run(
            namespace.wrap(local_argv(image_argv(command=argv))),
            env=process_env({}),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        for replica in fleet:
            assert policy_versions(replica.address) >= 1
            pushes = [e["fields"] for e in replica.events() if e["event"] == "weights.push"]
            assert pushes, replica.log()[-2000:]
            assert {e["source"] for e in pushes} == {source}, pushes
            assert {e["result"] for e in pushes} == {"OK"}, pushes
            # Batches travel as pushes do: through /dev/shm unless the actor turns it off.
            opened = [e["fields"] for e in replica.events() if e["event"] == "session.opened"]
            assert {e["shm_batches"] for e in opened} == {not switch}, opened
