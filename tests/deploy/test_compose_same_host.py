"""``docker/docker-compose.same-host.yml``: the compose fleet on one /dev/shm and host name.

Read as Compose merges it over ``docker-compose.yml`` (``docker-compose config``, no daemon):
what the learner's same-host proof needs holds for every actor and the learner (the IPC
namespace, so the ``/dev/shm``, of one owner; one host name; the image's one user), and the
fleet keeps its order (the actors start before the learner, which waits for them healthy).
``test_k8s_same_host.py`` runs the same arrangement and checks that pushes take /dev/shm.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
from deploy_files import COMPOSE_FILE, DOCKER, ROOT, compose_binary

SAME_HOST = DOCKER / "docker-compose.same-host.yml"


def _merged(*files: str) -> subprocess.CompletedProcess:
    argv = [str(compose_binary())]
    for path in (COMPOSE_FILE, *files):
        argv += ["-f", str(path)]
    return subprocess.run(
        [*argv, "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def services() -> dict:
    done = _merged(str(SAME_HOST))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["services"]


def test_compose_same_host_fleet_shares_one_dev_shm_and_host_name(services: dict) -> None:
    assert services["shm"]["ipc"] == "shareable"
    assert int(services["shm"]["shm_size"]) >= 2**30
    for name in ("actor", "learner"):
        assert services[name]["ipc"] == "service:shm", name
        assert services[name]["hostname"] == "rlfleet-host", name
        assert "user" not in services[name], name  # the image's user, the same for all
    assert services["actor"]["depends_on"]["shm"]["condition"] == "service_started"
    assert services["learner"]["depends_on"]["actor"]["condition"] == "service_healthy"


def test_compose_same_host_keeps_the_fleet_of_the_base_file(services: dict) -> None:
    base = _merged()
    assert base.returncode == 0, base.stderr
    plain = json.loads(base.stdout)["services"]
    for name in ("actor", "learner"):
        assert services[name]["command"] == plain[name]["command"]
        assert services[name].get("environment") == plain[name].get("environment")
        assert "ipc" not in plain[name]
        assert "hostname" not in plain[name]


def test_compose_same_host_refuses_an_owner_that_is_not_there(tmp_path: pathlib.Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(SAME_HOST.read_text().replace('ipc: "service:shm"', 'ipc: "service:nope"', 1))
    done = _merged(str(broken))
    assert done.returncode != 0
    assert "nope" in done.stderr
