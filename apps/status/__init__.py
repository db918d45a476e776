"""The ``rlfleet`` command for operators; ``rlfleet status`` shows a fleet, one line per actor.

Usage::

    rlfleet status 10.0.0.7:50051 10.0.0.8:50051
    rlfleet status --dns actors.rlfleet.svc.cluster.local:50051 --tls-ca ca.pem
    rlfleet status --dns actor:50051 --watch          # refresh like top; Ctrl-C to stop
    rlfleet status actor-0:50051 --json | jq .        # one JSON document per refresh

It uses Describe and health only, with the learner's TLS and token options
(``--token`` defaults to ``$RLFLEET_TOKEN``). Exit status: 0 when every actor
answers SERVING and describes itself, 1 when any does not or a ``--dns`` name resolves
to no actor (so it doubles as a fleet check in scripts), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import grpc

from apps.status._status import ActorStatus, Probe, format_table, shared_worker_ids, with_rates
from common.config import MAX_TIMEOUT_S, check_token
from common.errors import ActorUnavailableError
from learner_client import resolve_actors

__all__ = ["main"]

_CLEAR = "\x1b[H\x1b[2J"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    # The learner's bound: a sleep past 9.2e9 s overflows, and a gRPC deadline past 1e10 s
    # expires at once (every actor read TIMEOUT).
    if not 0 < value <= MAX_TIMEOUT_S:  # False for NaN
        raise argparse.ArgumentTypeError(
            f"expected seconds in (0, {MAX_TIMEOUT_S:g}], got {text!r}"
        )
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``rlfleet`` parser with its ``status`` subcommand."""
    parser = argparse.ArgumentParser(prog="rlfleet", description="Operate an rlfleet fleet.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status",
        help="one line per actor: health, session, policy versions, frames/s",
        description="Show each actor's health, session, policy versions, frames/s and uptime.",
    )
    status.add_argument(
        "addresses", nargs="*", metavar="ADDR", help="host:port or dns:///name:port"
    )
    status.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME:PORT",
        help="every address NAME resolves to (a headless Service); repeatable",
    )
    status.add_argument("--watch", action="store_true", help="refresh until interrupted")
    status.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        help="seconds between rounds (frames/s is measured over it) [2]",
    )
    status.add_argument(
        "--count", type=_count, default=None, help="with --watch: stop after this many refreshes"
    )
    status.add_argument("--json", action="store_true", help="JSON instead of a table")
    status.add_argument("--timeout", type=_seconds, default=3.0, help="seconds per call [3]")
    status.add_argument("--token", default=None, help="bearer token [RLFLEET_TOKEN]")
    status.add_argument("--tls-ca", metavar="PEM", help="CA of the actors' certificates (TLS)")
    status.add_argument("--tls-cert", metavar="PEM", help="client certificate (mTLS)")
    status.add_argument("--tls-key", metavar="PEM", help="client private key (mTLS)")
    status.set_defaults(parser=status)  # errors found after parsing recall status's usage
    return parser


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key must be given together")
    if args.tls_cert and not args.tls_ca:
        raise ValueError("--tls-cert needs --tls-ca")
    if not args.tls_ca:
        return None

    def read(path: str, flag: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ValueError(f"{flag}: cannot read {path!r}: {exc.strerror}") from None

    return grpc.ssl_channel_credentials(
        read(args.tls_ca, "--tls-ca"),
        read(args.tls_key, "--tls-key") if args.tls_key else None,
        read(args.tls_cert, "--tls-cert") if args.tls_cert else None,
    )


def _token(args: argparse.Namespace) -> str:
    """The bearer token of ``--token``, else of ``$RLFLEET_TOKEN`` ("" for none).

    Held to the actor's rule: one a header cannot carry (a file's trailing newline) is named
    at once, not sent to be answered "Invalid metadata" (INTERNAL) for every actor.
    """
    source = "--token" if args.token is not None else "RLFLEET_TOKEN"
    token = args.token if args.token is not None else os.environ.get("RLFLEET_TOKEN", "")
    try:
        return check_token(token or None) or ""
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _addresses(args: argparse.Namespace, known: list[str] | None = None) -> list[str]:
    """The actors' addresses; a failed re-resolution keeps the ``known`` ones."""
    targets = list(args.addresses) + [f"dns:///{name}" for name in args.dns]
    if not targets:
        raise ValueError("give actor addresses (host:port) or --dns NAME:PORT")
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:  # as the learner refuses them
        raise ValueError(f"actor address {twice[0]} is given twice")
    portless = [name for name in args.dns if not name.rpartition(":")[2].isdigit()]
    if portless:
        raise ValueError(f"--dns {portless[0]}: give NAME:PORT (the actors' gRPC port)")
    try:
        return resolve_actors(targets)
    except ActorUnavailableError:
        if known is None:
            raise  # no actor to probe: none serves (exit 1), the arguments were fine
        return known


def _show(statuses: list[ActorStatus], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        out.write(json.dumps([s.as_json() for s in statuses]) + "\n")
    else:
        clear = args.watch and out.isatty()  # piped or logged: rounds follow one another
        out.write((_CLEAR if clear else "") + format_table(statuses) + "\n")
    out.flush()


def status(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``rlfleet status`` with parsed ``args``; returns the exit status."""
    probe = Probe(
        credentials=_credentials(args),
        token=_token(args),
        timeout=args.timeout,
    )
    try:
        addresses = _addresses(args)
    except ActorUnavailableError as exc:
        sys.stderr.write(f"rlfleet status: {exc}\n")
        return 1
    previous = probe.round(addresses)
    rounds = 0
    while True:
        time.sleep(args.interval)
        # A watched fleet is re-resolved every round: scaled actors come and go.
        addresses = _addresses(args, addresses)
        current = with_rates(probe.round(addresses), previous)
        _show(current, args, out)
        rounds += 1
        fleet_ok = current and not shared_worker_ids(current)  # a learner refuses a shared id
        code = 0 if fleet_ok and all(s.serving for s in current) else 1
        if not args.watch or (args.count is not None and rounds >= args.count):
            return code
        previous = current


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlfleet`` entry point.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).

    Returns:
        The exit status: 0 all serving, 1 any actor not serving, 2 bad arguments.
    """
    args = build_parser().parse_args(argv)
    parser = args.parser
    if args.count is not None and not args.watch:
        parser.error("--count counts the refreshes of --watch: add --watch")
    try:
        return status(args, sys.stdout)
    except ValueError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        return 130
    return 2  # pragma: no cover  # parser.error exits
