"""The compose fleet: valid against the compose spec (checked by Compose v2 itself) and
shaped as documented: scalable actors, drain before kill, health-gated learner, DNS discovery.

Every check reads the model as Compose normalises it (``docker-compose config``),
so anchors, defaults and variables are resolved the way ``docker compose up`` would.
"""

from __future__ import annotations

import subprocess

import pytest
from deploy_files import (
    COMPOSE_FILE,
    DOCKERFILE,
    ROOT,
    compose_binary,
    compose_config,
    duration_seconds,
    healthcheck_command,
    run_compose,
)

from apps.ppo import parse_args
from learner_client._discovery import parse_dns_target


@pytest.fixture(scope="module")
def model() -> dict:
    return compose_config()


def _flag_value(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_compose_file_validates_against_the_compose_spec() -> None:
    done = run_compose("config", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_compose_validation_rejects_a_broken_file(tmp_path) -> None:
    # The validator is real: the same file with one bad key fails.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace:", 1))
    done = subprocess.run(
        [str(compose_binary()), "-f", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0
    assert "stop_grace" in done.stderr


def test_compose_actor_scales_without_fixed_host_ports(model: dict) -> None:
    actor = model["services"]["actor"]
    # A published host port or a fixed name/hostname would make --scale actor=N collide.
    for key in ("ports", "container_name", "hostname"):
        assert key not in actor, f"actor sets {key}: it cannot scale"
    env = actor["environment"]
    assert actor["expose"] == [env["RLFLEET_PORT"], env["RLFLEET_METRICS_PORT"]]
    assert actor["deploy"]["replicas"] >= 1
    assert actor["environment"]["RLFLEET_HOST"] == "0.0.0.0"


def test_compose_actor_worker_ids_come_from_the_image_entrypoint(model: dict) -> None:
    actor = model["services"]["actor"]
    assert actor["environment"]["RLFLEET_WORKER_ID"] == "from-ip"
    assert actor.get("entrypoint") is None, "the image's entrypoint resolves from-ip"


def test_compose_actor_drains_within_its_stop_grace_period(model: dict) -> None:
    actor = model["services"]["actor"]
    assert actor["init"] is True
    assert actor.get("stop_signal", "SIGTERM") == "SIGTERM"
    drain = float(actor["environment"]["RLFLEET_GRACE_PERIOD"])
    assert duration_seconds(actor["stop_grace_period"]) >= drain + 5


def test_compose_actor_healthcheck_is_the_image_probe(model: dict) -> None:
    check = model["services"]["actor"]["healthcheck"]
    assert check["test"] == ["CMD", *healthcheck_command()]
    probe_timeout = float(check["test"][check["test"].index("--timeout") + 1])
    assert duration_seconds(check["timeout"]) > probe_timeout


def test_compose_learner_waits_for_healthy_actors_and_finds_them_by_dns(model: dict) -> None:
    learner, actor = model["services"]["learner"], model["services"]["actor"]
    assert learner["depends_on"]["actor"]["condition"] == "service_healthy"
    host, port = parse_dns_target(_flag_value(learner["command"], "--actors"))
    assert host == "actor"
    assert str(port) == actor["environment"]["RLFLEET_PORT"]
    # Any replica count divides evenly only when each batch is one actor's.
    assert "--async" in learner["command"]
    assert learner["healthcheck"]["disable"] is True
    assert learner["init"] is True
    assert learner["command"][0] == "rlfleet-train"


def test_compose_learner_settings_match_the_actors(model: dict) -> None:
    learner, actor = model["services"]["learner"], model["services"]["actor"]
    env = actor["environment"]
    assert _flag_value(learner["command"], "--env") == env["RLFLEET_ENV"]
    assert env["RLFLEET_POLICY"] == "mlp"  # rlfleet-train pushes mlp weights
    frames = int(_flag_value(learner["command"], "--frames-per-batch"))
    assert frames % int(env["RLFLEET_NUM_ENVS"]) == 0


def test_compose_learner_runs_two_ranks_sharing_the_actors(model: dict) -> None:
    learner, actor = model["services"]["learner"], model["services"]["actor"]
    settings = parse_args(learner["command"][1:])  # what rlfleet-train makes of it
    assert settings.nproc_per_node == 2
    # Rank r owns the worker_ids of parity r: the default scale gives each rank one.
    assert actor["deploy"]["replicas"] % settings.nproc_per_node == 0


def test_compose_fleet_network_is_internal(model: dict) -> None:
    assert model["networks"]["fleet"]["internal"] is True
    for name, service in model["services"].items():
        assert list(service["networks"]) == ["fleet"], name
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name


def test_compose_builds_one_image_from_the_repository_root(model: dict) -> None:
    images = {service["image"] for service in model["services"].values()}
    assert images == {"rlfleet:0.1.0"}
    for service in model["services"].values():
        assert service["build"]["context"] == str(ROOT)
        assert (ROOT / service["build"]["dockerfile"]) == DOCKERFILE
        assert service["build"]["args"]["TORCH_VARIANT"] == "cpu"


def test_compose_image_and_torch_variant_are_overridable() -> None:
    model = compose_config({"RLFLEET_IMAGE": "example/rlfleet:9", "TORCH_VARIANT": "cu128"})
    for service in model["services"].values():
        assert service["image"] == "example/rlfleet:9"
        assert service["build"]["args"]["TORCH_VARIANT"] == "cu128"
