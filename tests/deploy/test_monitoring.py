"""Monitoring as deployed: the compose `monitoring` profile (Prometheus + Grafana), the Grafana
dashboard, and the Kubernetes scrape annotations and ServiceMonitor.

The files are read as their tools read them (Compose's own normalised model, YAML, JSON),
and every metric the dashboard queries must be one a live actor or learner exports.
"""

from __future__ import annotations

import json
import pathlib
import re
import urllib.request

import pytest
import yaml
from deploy_files import (
    DOCKER,
    K8S,
    container,
    env_of,
    k8s_documents,
    k8s_object,
    run_compose,
)
from prometheus_client.parser import text_string_to_metric_families

from actor_service import ActorConfig, create_server, parse_config
from learner_client import GrpcCollector, serve_metrics

DASHBOARD = DOCKER / "grafana" / "rlfleet.json"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
PROVISIONING = DOCKER / "grafana" / "provisioning"
SERVICE_MONITOR = K8S / "monitoring" / "servicemonitor.yaml"
METRIC_RE = re.compile(r"\b((?:rlfleet|process)_[a-z0-9_]+)")


@pytest.fixture(scope="module")
def model() -> dict:
    done = run_compose("--profile", "monitoring", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _mounts(service: dict) -> dict[str, str]:
    """``{target: source}`` of a service's volumes (bind sources are absolute paths)."""
    return {v["target"]: v["source"] for v in service.get("volumes", [])}


def test_monitoring_profile_validates_and_stays_optional(model: dict) -> None:
    done = run_compose("--profile", "monitoring", "config", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    default = run_compose("config", "--services")
    assert sorted(default.stdout.split()) == ["actor", "learner"]
    assert {"prometheus", "grafana"} <= set(model["services"])
    for name in ("prometheus", "grafana"):
        service = model["services"][name]
        assert service["profiles"] == ["monitoring"]
        assert not service["image"].endswith(":latest")
        assert ":" in service["image"]
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]


def test_monitoring_networks_keep_the_fleet_internal(model: dict) -> None:
    services, networks = model["services"], model["networks"]
    assert networks["fleet"]["internal"] is True
    assert not networks["monitoring"].get("internal", False)
    assert sorted(services["prometheus"]["networks"]) == ["fleet", "monitoring"]
    assert list(services["grafana"]["networks"]) == ["monitoring"]
    assert "ports" not in services["prometheus"]
    (published,) = services["grafana"]["ports"]
    assert (published["host_ip"], published["target"]) == ("127.0.0.1", 3000)
    for name in ("actor", "learner"):
        assert list(services[name]["networks"]) == ["fleet"]


def test_compose_actors_serve_metrics_on_the_port_prometheus_scrapes(model: dict) -> None:
    actor = model["services"]["actor"]
    env = {k: v for k, v in actor["environment"].items() if k != "RLFLEET_WORKER_ID"}
    config = parse_config([], environ=env, hostname="actor")
    assert config.metrics_port == int(env["RLFLEET_METRICS_PORT"])
    assert str(config.metrics_port) in actor["expose"]
    prometheus = model["services"]["prometheus"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    target = config_flag.split("=", 1)[1]
    assert pathlib.Path(_mounts(prometheus)[target]) == PROMETHEUS
    scrape = {
        job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    }
    (actors,) = scrape["rlfleet-actors"]["dns_sd_configs"]
    assert actors["names"] == ["actor"]  # the compose service: one address per replica
    assert (actors["type"], actors["port"]) == ("A", config.metrics_port)
    assert scrape["rlfleet-actors"]["metrics_path"] == "/metrics"
    for learner in scrape["rlfleet-learner"]["dns_sd_configs"]:  # one per learner rank
        assert learner["names"] == ["learner"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(model: dict) -> None:
    grafana = model["services"]["grafana"]
    mounts = _mounts(grafana)
    assert pathlib.Path(mounts["/etc/grafana/provisioning"]) == PROVISIONING
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert pathlib.Path(mounts[home]) == DASHBOARD
    source = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"  # the compose service, default port
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "rlfleet.yml").read_text())
    (files,) = provider["providers"]
    assert files["type"] == "file"
    assert str(pathlib.PurePosixPath(home).parent) == files["options"]["path"]


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_panels_are_described_and_query_the_templated_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "rlfleet-fleet"
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in _panels()}
    for wanted in ("Fleet frames/s", "Per-worker throughput (actors)", "Policy lag (versions)"):
        assert wanted in titles
    assert {"Weight push latency", "Actor errors by method and code"} <= titles
    for panel in _panels():
        assert panel["description"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            assert expr.count("[") == expr.count("]"), expr
            assert METRIC_RE.search(expr), expr


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported_names(text: str) -> set[str]:
    """Every series name a scrape can hold, by family type (labelled families with no series
    yet still declare themselves in ``# TYPE``)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def dashboard_metric_names() -> set[str]:
    """Every metric name a dashboard query uses."""
    return {
        name
        for panel in _panels()
        for target in panel["targets"]
        for name in METRIC_RE.findall(target["expr"])
    }


def test_k8s_actor_pods_carry_scrape_annotations_for_their_metrics_port() -> None:
    statefulset = k8s_object("StatefulSet", "actors")
    annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
    actor = container(statefulset["spec"]["template"]["spec"], "actor")
    port = int(env_of(actor)["RLFLEET_METRICS_PORT"]["value"])
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in actor["ports"]


def _pod_templates() -> list[tuple[str, dict]]:
    """``(file, pod template)`` of every workload under docker/k8s/, subfolders included."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Job", "StatefulSet", "Deployment"):
                found.append((str(path.relative_to(K8S)), doc["spec"]["template"]))
    return found


def _metrics_port(template: dict) -> int | None:
    ports = [p for c in template["spec"]["containers"] for p in c.get("ports", [])]
    return next((p["containerPort"] for p in ports if p.get("name") == "metrics"), None)


def test_every_k8s_pod_serving_metrics_carries_scrape_annotations_for_its_port() -> None:
    templates = [(f, t) for f, t in _pod_templates() if _metrics_port(t) is not None]
    assert len(templates) >= 4  # the actors and the three learner manifests
    for file, template in templates:
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", file
        assert annotations.get("prometheus.io/port") == str(_metrics_port(template)), file
        assert annotations.get("prometheus.io/path") == "/metrics", file


def test_k8s_pod_monitor_scrapes_every_learner_pod() -> None:
    monitors = [doc for doc in yaml.safe_load_all(SERVICE_MONITOR.read_text()) if doc]
    (pods,) = [m for m in monitors if m["kind"] == "PodMonitor"]
    (endpoint,) = pods["spec"]["podMetricsEndpoints"]
    selector = pods["spec"]["selector"]["matchLabels"].items()
    learners = [
        (f, t)
        for f, t in _pod_templates()
        if t["metadata"]["labels"].get("app.kubernetes.io/component") == "learner"
    ]
    assert len(learners) == 3
    for file, template in learners:
        assert selector <= template["metadata"]["labels"].items(), file
        assert _metrics_port(template) is not None, file
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert pods["spec"]["namespaceSelector"]["matchNames"] == ["rlfleet"]


def test_dashboard_queries_name_no_scrape_job_and_average_the_ranks_waits() -> None:
    """Job names differ by deployment (compose's, a ServiceMonitor's Service, annotations)."""
    exprs = [target["expr"] for panel in _panels() for target in panel["targets"]]
    assert not [e for e in exprs if "job=" in e or "job=~" in e]
    waits = [e for e in exprs if "rlfleet_learner_batch_wait_seconds_sum" in e]
    assert waits == ["avg(rate(rlfleet_learner_batch_wait_seconds_sum[1m]))"]  # a fraction


def test_k8s_service_monitor_selects_the_actor_service_metrics_port() -> None:
    monitors = [doc for doc in yaml.safe_load_all(SERVICE_MONITOR.read_text()) if doc]
    (monitor,) = [m for m in monitors if m["kind"] == "ServiceMonitor"]
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    service = k8s_object("Service", "actors")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "http")
    # Kept out of the folder `kubectl apply -f docker/k8s/` applies: the CRD may be missing.
    kinds = {doc["kind"] for docs in k8s_documents().values() for doc in docs}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_dashboard_queries_only_metrics_a_live_actor_and_learner_export() -> None:
    config = ActorConfig(port=0, num_envs=2, metrics_port=0, seed=0, grace_period=1.0)
    with create_server(config).run_in_thread() as handle:
        actor_text = _scrape(handle.server.metrics_port)
        with GrpcCollector(
            [f"127.0.0.1:{handle.port}"], frames_per_batch=10, total_frames=20
        ) as collector:
            endpoint = serve_metrics(collector, 0, host="127.0.0.1")
            assert sum(1 for _ in collector) == 2
            learner_text = _scrape(endpoint.port)
    exported = exported_names(actor_text) | exported_names(learner_text)
    used = dashboard_metric_names()
    assert {n for n in used if n.startswith("rlfleet_actor_")}, "no actor metric on the dashboard"
    assert {n for n in used if n.startswith("rlfleet_learner_")}, "no learner metric either"
    assert used - exported == set()


def test_learner_metrics_are_on_and_scraped_in_compose_and_kubernetes(model: dict) -> None:
    learner = model["services"]["learner"]
    command = learner["command"]
    port = int(command[command.index("--metrics-port") + 1])
    # Each rank serves on the port plus its local rank.
    ranks = int(command[command.index("--nproc-per-node") + 1])
    ports = [port + rank for rank in range(ranks)]
    assert learner["expose"] == [str(p) for p in ports]
    scrape = {
        job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    }
    configs = scrape["rlfleet-learner"]["dns_sd_configs"]
    assert sorted(c["port"] for c in configs) == ports
    assert {name for c in configs for name in c["names"]} == {"learner"}
    job = k8s_object("Job", "learner")["spec"]["template"]
    spec = container(job["spec"], "learner")
    k8s_port = int(spec["args"][spec["args"].index("--metrics-port") + 1])
    assert job["metadata"]["annotations"]["prometheus.io/port"] == str(k8s_port)
    assert {"name": "metrics", "containerPort": k8s_port, "protocol": "TCP"} in spec["ports"]
    policy = k8s_object("NetworkPolicy", "learner-to-actors-only")
    assert policy["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {}}], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    ]
