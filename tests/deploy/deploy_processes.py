"""Deployment files' containers run as local processes: their commands, environment, logs.

What ``test_deploy_runs_locally.py`` and ``test_k8s_same_host.py`` share: a container's argv
with the image's programs mapped to this checkout (tini left out), its environment (this
machine's without ``RLFLEET_*``, then the image's ``ENV``, then the manifest's), a replica
process whose ready line and JSON log are read, and grpcurl checks of an actor.
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
from collections.abc import Iterator, Mapping, Sequence

from deploy_files import ENTRYPOINT_SCRIPT, ROOT, final_stage
from helpers import grpcurl_path

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


def check_actor_with_grpcurl(address: str, worker_id: int, token: str | None = None) -> None:
    """What an operator checks: health SERVING, reflection lists and describes, Describe answers.

    With ``token``, Describe needs it: without it the actor answers UNAUTHENTICATED.
    """
    health = grpcurl("-plaintext", address, "grpc.health.v1.Health/Check")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "SERVING"
    listing = grpcurl("-plaintext", address, "list")
    assert {"rlfleet.v1.ActorService", "grpc.health.v1.Health"} <= set(listing.stdout.split())
    described = grpcurl("-plaintext", address, "describe", "rlfleet.v1.ActorService")
    assert "rpc Collect ( stream .rlfleet.v1.CollectRequest )" in described.stdout
    describe = grpcurl(*_auth(token), "-plaintext", "-d", "{}", address, DESCRIBE)
    assert describe.returncode == 0, describe.stderr
    assert _field(json.loads(describe.stdout), "worker_id", 0) == worker_id
    if token is not None:
        refused = grpcurl("-plaintext", "-d", "{}", address, DESCRIBE)
        assert "Unauthenticated" in refused.stderr, refused.stderr


DESCRIBE = "rlfleet.v1.ActorService/Describe"


def _auth(token: str | None) -> list[str]:
    """grpcurl's header flags carrying ``token``, as a learner sends it."""
    return [] if token is None else ["-H", f"authorization: Bearer {token}"]


def run_healthcheck(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """A HEALTHCHECK/probe command, with the container's environment, as Docker execs it."""
    return subprocess.run(
        local_argv(command), env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def policy_versions(address: str, token: str | None = None) -> int:
    describe = grpcurl(*_auth(token), "-plaintext", "-d", "{}", address, DESCRIBE)
    models = _field(json.loads(describe.stdout), "models", [])
    policy = next(m for m in models if _field(m, "model_id", "") == "policy")
    return int(_field(policy, "version", 0))


def _field(message: dict, name: str, default: object) -> object:
    """A field of grpcurl's JSON, which names fields as in the proto or in lowerCamelCase."""
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
    return message.get(name, message.get(camel, default))
