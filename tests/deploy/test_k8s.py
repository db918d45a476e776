"""The Kubernetes manifests: valid against the Kubernetes schemas (``kubernetes-validate``,
offline, strict) and shaped as documented: ordinal worker ids, headless discovery, gRPC
probes, drain before kill, bounded resources, and only the learner reaching the actors.
"""

from __future__ import annotations

import copy
import re
import subprocess

import kubernetes_validate
import pytest
import yaml
from deploy_files import (
    K8S,
    container,
    env_of,
    exec_form,
    final_stage,
    k8s_documents,
    k8s_object,
    only,
)
from kubernetes_validate.utils import latest_version

from learner_client._discovery import parse_dns_target

# The oldest version with the pod-index label (the worker id) and the newest schemas shipped.
K8S_VERSIONS = ["1.28.0", latest_version()]
ACTOR_LABELS = {"app.kubernetes.io/name": "rlfleet", "app.kubernetes.io/component": "actor"}
LEARNER_LABELS = {"app.kubernetes.io/name": "rlfleet", "app.kubernetes.io/component": "learner"}


def _validate(doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def _actor_pod() -> dict:
    return k8s_object("StatefulSet", "actors")["spec"]["template"]["spec"]


def _learner_pod() -> dict:
    return k8s_object("Job", "learner")["spec"]["template"]["spec"]


def _grace_period() -> float:
    return float(env_of(container(_actor_pod(), "actor"))["RLFLEET_GRACE_PERIOD"]["value"])


def _gpu_patched_statefulset() -> dict:
    """The StatefulSet after kubectl's own strategic merge of the GPU patch (offline)."""
    statefulset = yaml.safe_dump(k8s_object("StatefulSet", "actors"))
    done = subprocess.run(
        [
            "kubectl",
            "patch",
            "--local",
            "-f",
            "-",
            "--patch-file",
            str(K8S / "patches" / "actors-gpu.yaml"),
            "-o",
            "json",
        ],
        input=statefulset,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    documents = k8s_documents()
    assert {
        "00-namespace.yaml",
        "10-actors.yaml",
        "20-networkpolicy.yaml",
        "30-learner.yaml",
    } <= set(documents)
    for name, docs in documents.items():
        for doc in docs:
            try:
                _validate(doc, version)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_k8s_validation_rejects_a_broken_manifest() -> None:
    broken = copy.deepcopy(k8s_object("StatefulSet", "actors"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken, K8S_VERSIONS[-1])


def test_k8s_objects_live_in_the_namespace_applied_first() -> None:
    documents = k8s_documents()
    first = sorted(documents)[0]
    (namespace,) = documents[first]
    assert namespace["kind"] == "Namespace"
    for docs in documents.values():
        for doc in docs:
            if doc["kind"] != "Namespace":
                assert doc["metadata"]["namespace"] == namespace["metadata"]["name"]


def test_k8s_actors_are_a_statefulset_behind_a_headless_service() -> None:
    service = k8s_object("Service", "actors")
    statefulset = k8s_object("StatefulSet", "actors")
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    template_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert statefulset["spec"]["selector"]["matchLabels"] == ACTOR_LABELS
    assert service["spec"]["selector"] == ACTOR_LABELS
    assert ACTOR_LABELS.items() <= template_labels.items()
    actor = container(_actor_pod(), "actor")
    port = int(env_of(actor)["RLFLEET_PORT"]["value"])
    metrics = int(env_of(actor)["RLFLEET_METRICS_PORT"]["value"])
    assert {p["name"]: p["containerPort"] for p in actor["ports"]} == {
        "grpc": port,
        "metrics": metrics,
    }
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": port,
        "metrics": metrics,
    }
    assert env_of(actor)["RLFLEET_HOST"]["value"] == "0.0.0.0"
    budget = k8s_object("PodDisruptionBudget", "actors")
    assert budget["spec"]["selector"]["matchLabels"] == ACTOR_LABELS


def test_k8s_worker_id_is_the_pod_ordinal() -> None:
    entry = env_of(container(_actor_pod(), "actor"))["RLFLEET_WORKER_ID"]
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )


def test_k8s_actors_and_learner_read_the_token_from_one_optional_secret() -> None:
    """Creating the Secret turns the token on for both sides; without it both run open."""
    learner = container(k8s_object("Job", "learner")["spec"]["template"]["spec"], "learner")
    for spec in (container(_actor_pod(), "actor"), learner):
        reference = env_of(spec)["RLFLEET_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert reference == {"name": "rlfleet-token", "key": "token", "optional": True}


def test_k8s_probes_are_native_grpc_health_checks() -> None:
    actor = container(_actor_pod(), "actor")
    port = actor["ports"][0]["containerPort"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = actor[kind]
        assert probe["grpc"]["port"] == port, kind
        assert probe["grpc"].get("service", "") == "", kind  # the server as a whole
        assert "exec" not in probe
        assert "httpGet" not in probe
    startup = actor["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60  # torch + env pool


def test_k8s_termination_grace_exceeds_the_drain_time() -> None:
    assert _actor_pod()["terminationGracePeriodSeconds"] >= _grace_period() + 5


def test_k8s_containers_have_resource_requests_and_limits() -> None:
    for pod in (_actor_pod(), _learner_pod()):
        for spec in pod.get("initContainers", []) + pod["containers"]:
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(spec["resources"][bound]), spec["name"]
    actor = container(_actor_pod(), "actor")
    threads = int(env_of(actor)["RLFLEET_TORCH_THREADS"]["value"])
    assert threads <= float(actor["resources"]["limits"]["cpu"])


def test_k8s_pods_run_as_the_image_user_without_privileges() -> None:
    uid = int(only(final_stage(), "USER").split(":")[0])
    for pod in (_actor_pod(), _learner_pod()):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid
        assert pod["automountServiceAccountToken"] is False
        for spec in pod.get("initContainers", []) + pod["containers"]:
            context = spec["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]


def test_k8s_network_policy_admits_only_the_learner_and_relaying_actors() -> None:
    policy = k8s_object("NetworkPolicy", "actors-from-learner-only")
    assert policy["spec"]["podSelector"]["matchLabels"] == ACTOR_LABELS
    rule, relay, scrape = policy["spec"]["ingress"]
    # Prometheus may scrape from any namespace, but only the metrics port.
    assert scrape == {
        "from": [{"namespaceSelector": {}}],
        "ports": [{"port": "metrics", "protocol": "TCP"}],
    }
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace, learner pods only
    assert peer["podSelector"]["matchLabels"] == LEARNER_LABELS
    learner_labels = k8s_object("Job", "learner")["spec"]["template"]["metadata"]["labels"]
    assert LEARNER_LABELS.items() <= learner_labels.items()
    assert [p["port"] for p in rule["ports"]] == ["grpc"]
    # Relayed pushes: actors reach each other's gRPC port, and nothing else.
    assert relay == {
        "from": [{"podSelector": {"matchLabels": ACTOR_LABELS}}],
        "ports": [{"port": "grpc", "protocol": "TCP"}],
    }
    (egress,) = policy["spec"]["egress"]
    assert egress["to"] == [{"podSelector": {"matchLabels": ACTOR_LABELS}}]
    port = k8s_object("Service", "actors")["spec"]["ports"][0]["port"]
    assert egress["ports"] == [{"port": port, "protocol": "TCP"}]
    assert "Egress" in policy["spec"]["policyTypes"]


def test_k8s_learner_job_finds_the_actors_through_the_headless_service() -> None:
    service = k8s_object("Service", "actors")
    fqdn = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    port = service["spec"]["ports"][0]["port"]
    learner = container(_learner_pod(), "learner")
    args = learner["args"]
    assert args[0] == "rlfleet-train"
    assert parse_dns_target(args[args.index("--actors") + 1]) == (fqdn, port)
    assert "--async" in args
    wait = container(_learner_pod(), "wait-for-actors", init=True)["args"]
    assert wait[:3] == ["python", "-m", "actor_service.probe"]
    assert wait[wait.index("--host") + 1] == fqdn
    assert int(wait[wait.index("--port") + 1]) == port
    assert "command" not in learner, "keep the image's tini entrypoint"


def test_k8s_containers_keep_the_image_entrypoint() -> None:
    entrypoint = exec_form(only(final_stage(), "ENTRYPOINT"))
    assert entrypoint[0] == "tini"
    for pod in (_actor_pod(), _learner_pod()):
        for spec in pod.get("initContainers", []) + pod["containers"]:
            assert "command" not in spec, f"{spec['name']} would bypass tini"


def test_k8s_gpu_patch_adds_a_gpu_and_still_validates() -> None:
    patched = _gpu_patched_statefulset()
    for version in K8S_VERSIONS:
        _validate(patched, version)
    actor = container(patched["spec"]["template"]["spec"], "actor")
    assert actor["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert env_of(actor)["RLFLEET_DEVICE"]["value"] == "cuda"
    # The strategic merge keeps everything else, the worker id above all.
    assert set(env_of(container(_actor_pod(), "actor"))) < set(env_of(actor))
    assert re.search(r"-cu\d+$", actor["image"])
    assert actor["livenessProbe"] == container(_actor_pod(), "actor")["livenessProbe"]
