"""Small helpers shared by the test suites: polling, free ports, grpcurl, actor subprocesses.

Import them as ``from helpers import poll_until, start_actor`` (``tests/`` is on
``sys.path`` because it holds the root ``conftest.py``).

* :func:`poll_until` waits for a condition instead of sleeping a guessed time.
* :func:`free_port` returns a TCP port that was free a moment ago.
* :func:`grpcurl_path` finds the ``grpcurl`` binary installed next to the interpreter.
* :func:`self_signed_cert` makes a throwaway certificate for localhost / 127.0.0.1.
* :func:`start_local_ray` runs what starts a local Ray (``ray.init`` or a fleet's ``start``),
  again if Ray's own start timed out, :func:`stop_local_ray` waits for its processes, and
  :func:`ray_processes_gone` for those of a Ray shut down without waiting.
* :func:`interrupt_in_condition_wait` is a trace function raising KeyboardInterrupt at the
  one step of ``threading.Condition.wait`` where a Ctrl-C leaves its lock released.
* :func:`serving_raw_replies` serves rlfleet.v1 methods answering given bytes as they are
  (:data:`UNPARSABLE`: a reply that does not parse), an actor no build of ours would be.
* :func:`start_actor` runs ``python -m actor_service`` (the ``rlfleet-actor``
  command) with the given flags, waits for its ready line and returns an
  :class:`ActorProcess`; use it as a context manager so the process is always
  killed and reaped.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from types import FrameType
from typing import Any, TypeVar

import grpc
import pytest

__all__ = [
    "ACTOR_METHODS",
    "ActorProcess",
    "UNPARSABLE",
    "assert_torchrl_names_offered_or_refused",
    "free_port",
    "grpcurl_path",
    "interrupt_in_condition_wait",
    "poll_until",
    "ray_processes_gone",
    "self_signed_cert",
    "serving_raw_replies",
    "start_actor",
    "start_local_ray",
    "stop_local_ray",
    "torchrl_public_names",
]

T = TypeVar("T")

READY_RE = re.compile(r"^rlfleet-actor ready worker_id=(\d+) port=(\d+)$")

#: What Ray raises when its local start misses one of Ray's own (fixed) time limits.
RAY_START_TIMED_OUT = (
    "timed out during startup",  # the raylet did not register within 30 s
    "Timed out waiting for file",  # the GCS did not write its port file in time
)


def poll_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, message: str = ""
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Args:
        predicate: A cheap, side-effect-free check.
        timeout: Seconds before giving up.
        interval: Seconds between calls.
        message: Added to the failure message.

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout:.1f}s: {message}".rstrip(": "))
        time.sleep(interval)


TraceFunction = Callable[[FrameType, str, Any], Any]


def interrupt_in_condition_wait(frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
    """A trace function raising KeyboardInterrupt where a signal handler may: in
    ``Condition.wait`` after its lock is released, before the ``try`` that takes it back."""
    if frame.f_code is not threading.Condition.wait.__code__:
        return None

    def local(frame: FrameType, event: str, arg: Any) -> TraceFunction:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if event == "line" and line == "gotit = False":
            raise KeyboardInterrupt("signal 2")
        return local

    return local


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when this returned (prefer binding port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_gone(pid: int) -> bool:
    """Whether no process with ``pid`` exists any more (a zombie still counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting to be reaped is as good as gone).

    A process that exits while its ``/proc`` entry is read counts as gone (the read raises
    ``ProcessLookupError``, not ``FileNotFoundError``).
    """
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port_on(hosts: Sequence[str]) -> int:
    """A port that was free on every one of ``hosts`` (127.0.0.1, 127.0.0.2 …) a moment ago."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free on all of {hosts}")


def grpcurl_path() -> str:
    """Path of the ``grpcurl`` binary installed in the interpreter's ``bin`` directory."""
    path = pathlib.Path(sys.executable).parent / "grpcurl"
    if not path.exists():
        raise FileNotFoundError(f"grpcurl not found next to {sys.executable}")
    return str(path)


class ActorProcess:
    """A running ``python -m actor_service`` subprocess that reported ready.

    Attributes:
        process: The ``subprocess.Popen``; stdout is read by a thread, stderr goes to a file.
        port: The ActorService port from the ready line.
        worker_id: The worker id from the ready line.
        address: ``"127.0.0.1:<port>"``.
    """

    def __init__(
        self,
        process: subprocess.Popen,
        stderr_path: str,
        lines: queue.Queue,
        port: int,
        worker_id: int,
    ) -> None:
        self.process = process
        self._stderr_path = stderr_path
        self._lines = lines
        self.port = port
        self.worker_id = worker_id
        self.address = f"127.0.0.1:{port}"

    def stderr(self) -> str:
        """Everything the actor logged to stderr so far."""
        return pathlib.Path(self._stderr_path).read_text(errors="replace")

    def stdout_lines(self) -> list[str]:
        """Stdout lines printed after the ready line, so far."""
        out = []
        while not self._lines.empty():
            line = self._lines.get_nowait()
            if line is not None:
                out.append(line)
        return out

    def terminate(self) -> None:
        """Send SIGTERM (a graceful drain)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """Wait for the exit code (raises ``subprocess.TimeoutExpired``)."""
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL and reap; idempotent."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def close(self) -> None:
        """Kill and reap the process and remove its stderr file."""
        self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
        pathlib.Path(self._stderr_path).unlink(missing_ok=True)

    def __enter__(self) -> ActorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_actor(
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> ActorProcess:
    """Start ``python -m actor_service ARGS`` and wait for its ready line.

    ``--port 0`` and ``--host 127.0.0.1`` are added unless ``args`` sets them.

    Args:
        args: Command-line flags.
        env: Extra environment variables (added to a copy of ``os.environ``).
        timeout: Seconds to wait for ``rlfleet-actor ready worker_id=<id> port=<port>``.

    Returns:
        The running actor.

    Raises:
        AssertionError: It exited or was not ready in time (with its stderr tail).
    """
    argv = [sys.executable, "-m", "actor_service", *args]
    if "--port" not in args:
        argv += ["--port", "0"]
    if "--host" not in args:
        argv += ["--host", "127.0.0.1"]
    fd, stderr_path = tempfile.mkstemp(prefix="rlfleet-actor-", suffix=".log")
    with os.fdopen(fd, "wb") as stderr:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, **(env or {})},
        )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
    actor = ActorProcess(process, stderr_path, lines, port=0, worker_id=-1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = ""
        match = READY_RE.match(line.strip()) if line else None
        if match:
            actor.worker_id, actor.port = int(match.group(1)), int(match.group(2))
            actor.address = f"127.0.0.1:{actor.port}"
            return actor
        if line is None or time.monotonic() >= deadline:
            tail = actor.stderr()[-3000:]
            actor.close()
            raise AssertionError(f"actor not ready (exit code {process.poll()}): {tail}")


def _pump(process: subprocess.Popen, lines: queue.Queue) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def self_signed_cert(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Write ``name.crt`` and ``name.key`` (EC, 1 day, for localhost and 127.0.0.1) with openssl."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def start_local_ray(start: Callable[[], T], temp_dir: str, attempts: int = 3) -> T:
    """``start()``, which starts a local Ray in ``temp_dir``; again if Ray's start timed out.

    Ray's raylet must register within a fixed 30 s, and its GCS write its port file in time;
    on the loaded 2-core machine each once did not (``The current node timed out during
    startup``, ``Timed out waiting for file .../gcs_server_port_...``), failing a test of
    rlfleet's own Ray code before any of it ran; once, two starts in a row timed out. Those
    errors alone are retried, up to ``attempts`` starts, after printing the tails of Ray's logs
    (shown with the test's output if the last start fails too) and stopping the processes the
    failed start left running; any other error is raised.
    """
    import ray

    for _ in range(attempts - 1):
        try:
            return start()
        except Exception as error:
            if not any(words in str(error) for words in RAY_START_TIMED_OUT):
                raise
            print(f"Ray's start timed out; its logs:\n{_ray_log_tails(temp_dir)}", file=sys.stderr)
            _stop_failed_ray_node(error)
            ray.shutdown()
            ray_processes_gone(temp_dir)
    return start()


def ray_processes_gone(temp_dir: str, timeout: float = 30.0) -> None:
    """Wait until no process runs out of ``temp_dir`` (a Ray node's GCS, raylet, workers).

    A ``ray.shutdown()`` that does not wait (a script's own, a fleet's) leaves them exiting on
    their own, beside the next test's Ray start on the same 2 cores. Those left after
    ``timeout`` are killed.
    """
    deadline = time.monotonic() + timeout
    while _pids_running_from(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _pids_running_from(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids_running_from(folder: str) -> list[int]:
    """The processes (but this one) whose command line names ``folder``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = pathlib.Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if folder.encode() in cmdline:
            pids.append(int(entry))
    return pids


def _stop_failed_ray_node(error: BaseException) -> None:
    """Stop and reap the processes of the Ray node whose start raised ``error``.

    ``ray.init`` keeps no reference to a node whose start raised, so ``ray.shutdown()`` cannot
    reach its GCS and raylet: they ran on beside the retried start, and their ``Popen`` objects,
    collected during a later test, failed it with "subprocess N is still running". The node is
    the ``self`` of a frame in the traceback (of ``error`` or an error it was raised from).
    """
    from ray._private.node import Node

    seen: BaseException | None = error
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            node = tb.tb_frame.f_locals.get("self")
            if isinstance(node, Node):
                node.kill_all_processes(check_alive=False, wait=True)
                return
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__


def stop_local_ray() -> None:
    """``ray.shutdown()``, returning once Ray's processes exited (the next start finds none)."""
    import ray

    ray.shutdown(wait_for_processes=True)


def _ray_log_tails(temp_dir: str, max_bytes: int = 2000) -> str:
    """The last ``max_bytes`` of each raylet and GCS log of the newest session in ``temp_dir``."""
    logs = pathlib.Path(temp_dir, "session_latest", "logs")
    tails = []
    for path in sorted(logs.glob("*")) if logs.is_dir() else []:
        if path.name.startswith(("raylet", "gcs_server")) and path.is_file():
            tail = path.read_bytes()[-max_bytes:].decode(errors="replace")
            tails.append(f"--- {path.name}\n{tail}")
    return "\n".join(tails) or f"(no logs under {logs})"


def torchrl_public_names(classes: Sequence[type]) -> list[str]:
    """The public names of ``classes`` (TorchRL's collectors), each once, sorted."""
    return sorted({name for cls in classes for name in dir(cls) if not name.startswith("_")})


def assert_torchrl_names_offered_or_refused(collector: object, names: Iterable[str]) -> list[str]:
    """Each of ``names`` (TorchRL's collectors' public names, of their classes or of a built
    one's ``vars()``) is on ``collector``, or reading it raises ``AttributeError`` naming
    TorchRL's and the attribute, not Python's bare one. Returns the names offered."""
    offered = []
    for name in names:
        if hasattr(collector, name):
            offered.append(name)
            continue
        with pytest.raises(AttributeError, match=f"no '{name}', TorchRL's: ") as info:
            getattr(collector, name)
        assert info.value.name == name
    return offered


#: The rlfleet.v1 ActorService methods by kind: (requests streamed, replies streamed).
ACTOR_METHODS = {
    "Describe": (False, False),
    "SetSeed": (False, False),
    "ForwardWeights": (False, False),
    "PushWeights": (True, False),
    "LoadState": (True, False),
    "GetState": (False, True),
    "Collect": (True, True),
}
#: Bytes no protobuf message parses from: a varint cut short.
UNPARSABLE = b"\x08"


def _raw_handler(reply: bytes, streamed_in: bool, streamed_out: bool) -> grpc.RpcMethodHandler:
    """A handler answering ``reply`` as is, once the request (or its first message) came."""

    def answer(request: Any, context: Any) -> Any:
        if streamed_in:
            next(request, None)
        return iter([reply]) if streamed_out else reply

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(streamed_in, streamed_out)]
    raw = bytes  # requests are read as their bytes, replies sent as given
    return kind(answer, request_deserializer=raw, response_serializer=raw)


@contextlib.contextmanager
def serving_raw_replies(replies: Mapping[str, bytes], health: bytes | None = None) -> Iterator[str]:
    """A real gRPC server on port 0 answering each rlfleet.v1 ActorService method named in
    ``replies`` with those bytes (and ``grpc.health.v1.Health/Check`` with ``health``):
    an actor whose replies need not parse. Yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    methods = {m: _raw_handler(replies[m], *ACTOR_METHODS[m]) for m in replies}
    handlers = [grpc.method_handlers_generic_handler("rlfleet.v1.ActorService", methods)]
    if health is not None:
        check = {"Check": _raw_handler(health, False, False)}
        handlers.append(grpc.method_handlers_generic_handler("grpc.health.v1.Health", check))
    server.add_generic_rpc_handlers(handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)
