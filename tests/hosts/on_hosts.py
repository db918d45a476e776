"""Processes on the test bed's hosts: actors through their command line, and a learner script.

:func:`start_actor_on` runs ``python -m actor_service`` inside a host, bound to the
host's name, and waits for its ready line. :class:`LearnerScript` runs Python code
inside the learner host and talks to it by lines: the script prints one JSON
value per line (:meth:`LearnerScript.read`) and waits on stdin for the test to say
it may go on (:meth:`LearnerScript.say`), so the test cuts and heals links
between the steps of a real learner. Both inherit ``PYTHONPATH`` pointing at
this checkout.

Import as ``from on_hosts import start_actor_on`` (``tests/hosts`` is on ``sys.path``).
"""

from __future__ import annotations

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
from collections.abc import Sequence
from typing import Any

from testbed import TestBed

__all__ = ["HostActor", "LearnerScript", "start_actor_on", "start_actors_on"]

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_READY = re.compile(r"^rlfleet-actor ready worker_id=(\d+) port=(\d+)$")

# What every learner script starts with: the line protocol.
PRELUDE = """
import json, sys, time
def say(value):
    print(json.dumps(value), flush=True)
def wait():
    sys.stdin.readline()
"""


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{_ROOT}{os.pathsep}{path}" if path else str(_ROOT)}


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


class HostActor:
    """An actor process inside a host.

    Attributes:
        host: The host it runs in.
        process: Its ``Popen`` (``ip netns exec …``).
        port: Its ActorService port.
        worker_id: Its worker id.
    """

    def __init__(self, host: str, process: subprocess.Popen[str], log: pathlib.Path) -> None:
        self.host = host
        self.process = process
        self.log = log
        self.port = 0
        self.worker_id = -1

    @property
    def target(self) -> str:
        """``host:port``, by name, as a learner dials it."""
        return f"{self.host}:{self.port}"

    def stderr(self) -> str:
        """What the actor logged so far."""
        return self.log.read_text(errors="replace")


def start_actor_on(
    bed: TestBed, host: str, args: Sequence[str], *, port: int = 0, timeout: float = 90.0
) -> HostActor:
    """Start ``python -m actor_service ARGS --host <host>`` in ``host``.

    ``--port <port>`` is added unless ``args`` sets it (each host has its own ports).

    Raises:
        AssertionError: It exited or printed no ready line in time (with its log's tail).
    """
    fd, name = tempfile.mkstemp(prefix=f"{host}-", suffix=".log", dir=bed.logs)
    log = pathlib.Path(name)
    argv = [sys.executable, "-m", "actor_service", *args, "--host", host]
    if "--port" not in args:
        argv += ["--port", str(port)]
    with os.fdopen(fd, "w") as stderr:
        process = bed.run(
            host, argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(), cwd=_ROOT
        )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    actor = HostActor(host, process, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        match = _READY.match(line.strip()) if line else None
        if match:
            actor.worker_id, actor.port = int(match.group(1)), int(match.group(2))
            return actor
        if line is None:
            raise AssertionError(f"actor on {host} not ready: {actor.stderr()[-3000:]}")


def start_actors_on(bed: TestBed, specs: Sequence[tuple[str, Sequence[str]]]) -> list[HostActor]:
    """Start several actors at once (each takes seconds to import torch): ``[(host, args)]``."""
    results: list[HostActor | BaseException | None] = [None] * len(specs)

    def start(index: int, host: str, args: Sequence[str]) -> None:
        try:
            results[index] = start_actor_on(bed, host, args)
        except BaseException as exc:
            results[index] = exc

    threads = [
        threading.Thread(target=start, args=(i, h, a), daemon=True)
        for i, (h, a) in enumerate(specs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if isinstance(r, HostActor)]


class LearnerScript:
    """Python code running in the learner host, spoken to by lines (see the module docstring).

    Args:
        bed: The bed.
        code: The script (:data:`PRELUDE` is put before it: ``say(value)``, ``wait()``).
        args: Its ``sys.argv[1:]``.
    """

    def __init__(self, bed: TestBed, code: str, args: Sequence[str] = ()) -> None:
        fd, name = tempfile.mkstemp(prefix="learner-", suffix=".log", dir=bed.logs)
        self.log = pathlib.Path(name)
        with os.fdopen(fd, "w") as stderr:
            self.process = bed.run(
                TestBed.LEARNER,
                [sys.executable, "-c", PRELUDE + code, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=_env(),
                cwd=_ROOT,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.process.stdout, self._lines), daemon=True).start()

    def read(self, timeout: float = 120.0) -> Any:
        """The next JSON value the script said.

        Raises:
            AssertionError: It exited or said nothing within ``timeout`` (with its log's tail).
        """
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None:
            self.process.poll()
            raise AssertionError(
                f"learner said nothing in {timeout:.0f}s (exit code {self.process.returncode}): "
                f"{self.log.read_text(errors='replace')[-4000:]}"
            )
        return json.loads(line)

    def say(self, word: str = "go") -> None:
        """Let the script's ``wait()`` return."""
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for the script to exit; its exit code (its log's tail on a failure)."""
        code = self.process.wait(timeout)
        assert code == 0, f"learner exited {code}: {self.log.read_text(errors='replace')[-4000:]}"
        return code
