"""A health probe: ``python -m actor_service.probe`` exits 0 when an actor answers SERVING.

Docker's ``HEALTHCHECK`` runs it inside the actor's container, and a learner's
init container can run it with ``--wait`` to hold off until the fleet is up.
It sends one ``grpc.health.v1.Health/Check`` (plaintext, with a deadline) and
exits 0 on SERVING and 1 on anything else: NOT_SERVING, an unknown service,
no answer in time, or no connection. It imports neither torch nor our server,
so it stays cheap enough to run every few seconds.

The port comes from ``--port``, else ``RLFLEET_HEALTH_PORT`` (the plaintext
health port an actor serves next to a TLS main port), else ``RLFLEET_PORT``,
else 50051 (a variable that holds no port to dial, 0 included, ends the probe with
exit 1 naming it); the host from ``--host``, else ``RLFLEET_HOST`` unless it is a
wildcard address, else 127.0.0.1. So inside an actor's container the probe
needs no arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.config import DEFAULT_PORT, WILDCARD_HOSTS, host_port

__all__ = ["check", "main"]

_RETRY_PAUSE = 0.5
# A local probe must never go through an HTTP proxy taken from the environment.
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)]


def check(target: str, *, service: str = "", timeout: float = 3.0) -> str:
    """Ask ``target`` for its health once.

    Args:
        target: ``host:port`` of the actor (``[ip6]:port`` for IPv6).
        service: The health service name; ``""`` is the server as a whole.
        timeout: Seconds the call may take.

    Returns:
        The status name (``"SERVING"``, ``"NOT_SERVING"``, ...), or ``"UNREACHABLE"``,
        ``"TIMEOUT"`` or ``"SERVICE_UNKNOWN"`` when there was no status to read.
    """
    with grpc.insecure_channel(target, options=_CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            names: dict[grpc.StatusCode | None, str] = {
                grpc.StatusCode.DEADLINE_EXCEEDED: "TIMEOUT",
                grpc.StatusCode.NOT_FOUND: "SERVICE_UNKNOWN",
            }
            return names.get(code, "UNREACHABLE")
    status: str = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return status


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return convert


def _default_port(environ: Mapping[str, str]) -> int:
    """The port of the first variable set; exit 1 naming it when no probe could dial it.

    Port 0 lets the actor pick a free one, which the probe cannot know: it would fail
    every check, a container that never turns healthy with nothing said why.
    """
    for name in ("RLFLEET_HEALTH_PORT", "RLFLEET_PORT"):
        text = environ.get(name, "").strip()
        if text:
            try:
                return _port(text)
            except argparse.ArgumentTypeError as exc:
                free = text.isdigit() and int(text) == 0
                hint = (
                    " (0 lets the actor pick a free port, which the probe cannot know:"
                    " set a fixed one, or pass --port)"
                    if free
                    else ""
                )
                raise SystemExit(f"probe: {name}: {exc}{hint}") from None
    return DEFAULT_PORT


def _default_host(environ: Mapping[str, str]) -> str:
    host = environ.get("RLFLEET_HOST", "").strip()
    return "127.0.0.1" if not host or host in WILDCARD_HOSTS else host


def _check_until(target: str, service: str, timeout: float, wait: float) -> str:
    """Check once, then again every half second until SERVING or ``wait`` seconds passed."""
    deadline = time.monotonic() + wait
    while True:
        remaining = deadline - time.monotonic()
        # The last tries of a wait are cut short so the whole probe ends near the deadline.
        status = check(
            target,
            service=service,
            timeout=timeout if wait == 0 else max(0.1, min(timeout, remaining)),
        )
        if status == "SERVING" or time.monotonic() + _RETRY_PAUSE >= deadline:
            return status
        time.sleep(_RETRY_PAUSE)


def _port(text: str) -> int:
    """A TCP port to dial, 1..65535 (argparse exits 2 on anything else)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {port}")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m actor_service.probe",
        description="Exit 0 if the actor's grpc.health.v1 Check answers SERVING, else 1.",
    )
    parser.add_argument("--host", help="actor host [RLFLEET_HOST unless a wildcard; 127.0.0.1]")
    parser.add_argument(
        "--port", type=_port, help="health port [RLFLEET_HEALTH_PORT, RLFLEET_PORT, 50051]"
    )
    parser.add_argument("--service", default="", help="health service name ('' = whole server)")
    parser.add_argument(
        "--timeout",
        type=_seconds(allow_zero=False),
        default=3.0,
        help="seconds one Check may take (default 3)",
    )
    parser.add_argument(
        "--wait",
        type=_seconds(allow_zero=True),
        default=0.0,
        help="keep asking until SERVING or this many seconds passed (default 0)",
    )
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Probe an actor and print its status.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).
        environ: Environment variables (``os.environ`` by default).

    Returns:
        0 when the actor answered SERVING, 1 otherwise (Docker's "unhealthy").
    """
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(argv)
    host = args.host if args.host else _default_host(environ)
    port = args.port if args.port is not None else _default_port(environ)
    target = host_port(host, port)
    status = _check_until(target, args.service, args.timeout, args.wait)
    print(f"{status} {target}{' service=' + args.service if args.service else ''}", flush=True)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
