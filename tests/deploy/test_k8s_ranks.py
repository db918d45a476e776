"""The data-parallel learner's manifests (``docker/k8s/ranks/``): an indexed Job of ranks
meeting through torchrun's c10d rendezvous, valid against the Kubernetes schemas and wired
to the actor StatefulSet, its headless Service and the NetworkPolicies.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_files import K8S, container, env_of, k8s_object
from test_k8s import ACTOR_LABELS, K8S_VERSIONS, LEARNER_LABELS

from learner_client._discovery import parse_dns_target

RANKS = K8S / "ranks"


def _ranks_objects() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(RANKS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _object(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in _ranks_objects() if doc["kind"] == kind]
    return found


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _job() -> dict[str, Any]:
    return _object("Job")


def _torchrun_args() -> list[str]:
    return container(_job()["spec"]["template"]["spec"], "learner")["args"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_ranks_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    objects = _ranks_objects()
    assert {doc["kind"] for doc in objects} == {
        "Service",
        "PersistentVolumeClaim",
        "Job",
        "NetworkPolicy",
    }
    namespace = k8s_object("Namespace", "rlfleet")["metadata"]["name"]
    for doc in objects:
        assert doc["metadata"]["namespace"] == namespace
        kubernetes_validate.validate(doc, version, strict=True)


def test_k8s_ranks_are_an_indexed_job_of_one_rank_per_pod() -> None:
    spec = _job()["spec"]
    args = _torchrun_args()
    assert spec["completionMode"] == "Indexed"
    nodes, per_node = int(_flag(args, "--nnodes")), int(_flag(args, "--nproc-per-node"))
    assert spec["completions"] == spec["parallelism"] == nodes
    assert per_node == 1
    assert args[0] == "torchrun"
    assert args[args.index("-m") + 1] == "apps.ppo"
    learner = container(spec["template"]["spec"], "learner")
    assert "command" not in learner, "keep the image's tini entrypoint"


def test_k8s_ranks_meet_at_pod_zero_through_the_headless_service() -> None:
    job, service = _job(), _object("Service")
    pod = job["spec"]["template"]
    args = _torchrun_args()
    assert _flag(args, "--rdzv-backend") == "c10d"
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert pod["spec"]["subdomain"] == name
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    host, port = _flag(args, "--rdzv-endpoint").rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{name}.{namespace}.svc.cluster.local"
    (rendezvous,) = service["spec"]["ports"]
    assert int(port) == rendezvous["port"]
    ports = {p["name"]: p["containerPort"] for p in container(pod["spec"], "learner")["ports"]}
    assert ports["rendezvous"] == int(port)
    # One run id for the Job: the rendezvous id, hence each rank's learner id.
    assert _flag(args, "--rdzv-id") == "$(RLFLEET_RUN_ID)"
    run_id = env_of(container(pod["spec"], "learner"))["RLFLEET_RUN_ID"]
    assert run_id["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"
    )


def test_k8s_ranks_train_against_the_actor_statefulset() -> None:
    actors = k8s_object("Service", "actors")
    fqdn = f"{actors['metadata']['name']}.{actors['metadata']['namespace']}.svc.cluster.local"
    args = _torchrun_args()
    assert parse_dns_target(_flag(args, "--actors")) == (fqdn, actors["spec"]["ports"][0]["port"])
    assert "--async" in args  # each rank's batch is one of its actors': any even scale works
    pod = _job()["spec"]["template"]
    # The actors admit learner pods only: the ranks carry the learner's labels.
    assert LEARNER_LABELS.items() <= pod["metadata"]["labels"].items()
    wait = container(pod["spec"], "wait-for-actors", init=True)
    statefulset = k8s_object("StatefulSet", "actors")["metadata"]["name"]
    assert _flag(wait["args"], "--host") == f"{statefulset}-$(RLFLEET_POD_INDEX).{fqdn}"
    index = env_of(wait)["RLFLEET_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_k8s_ranks_reach_each_other_and_nothing_else_new() -> None:
    policy = _object("NetworkPolicy")
    pod_labels = _job()["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert selector != ACTOR_LABELS
    (ingress,) = policy["spec"]["ingress"]
    (egress,) = policy["spec"]["egress"]
    assert ingress == {"from": [{"podSelector": {"matchLabels": selector}}]}
    assert egress == {"to": [{"podSelector": {"matchLabels": selector}}]}


def test_k8s_ranks_run_unprivileged_with_bounded_resources() -> None:
    pod = _job()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    for spec in pod["initContainers"] + pod["containers"]:
        assert "command" not in spec
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(spec["resources"][bound]), spec["name"]
        context = spec["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
    claim = _object("PersistentVolumeClaim")["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == claim


def test_k8s_ranks_read_the_actors_token_secret() -> None:
    """Each rank sends the token the actors require, from their Secret (optional alike)."""
    rank = env_of(container(_job()["spec"]["template"]["spec"], "learner"))["RLFLEET_TOKEN"]
    actor = container(k8s_object("StatefulSet", "actors")["spec"]["template"]["spec"], "actor")
    assert rank["valueFrom"] == env_of(actor)["RLFLEET_TOKEN"]["valueFrom"]
