"""``rlfleet status``: ask every actor of a fleet for its health and description, print a row each.

One round asks each actor, in parallel, for ``grpc.health.v1.Health/Check``
and ``rlfleet.v1.ActorService/Describe`` (nothing else: a status check never
opens a session or changes an actor). Frames per second come from two rounds:
the frames an actor reports between them over the uptime it reports between
them, so the clock is the actor's own. An actor that restarted in between (a
new epoch) has no rate until the next round.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.config import client_channel_options
from common.errors import ProtocolError, tls_mismatch_hint
from common.replies import parsing_channel
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import ActorDescription

__all__ = ["ActorStatus", "Probe", "format_table", "shared_worker_ids", "with_rates"]

_SERVING = "SERVING"
_MAX_PARALLEL = 32


@dataclasses.dataclass(frozen=True)
class ActorStatus:
    """What one round learned about one actor.

    Attributes:
        address: ``host:port`` asked.
        health: ``SERVING``, ``NOT_SERVING``, ``UNREACHABLE``, ``TIMEOUT``, ...
        worker_id: From Describe; None when Describe failed.
        kind: ``env`` (the kind of actor; LLM actors report their own).
        env: The env id (or task) it collects from.
        session: ``free``, ``held`` or ``draining``.
        learner_id: The learner holding the session; empty when free.
        policy_versions: ``{model_id: version}``.
        epoch: The actor's epoch (changes when it restarts).
        frames: Frames it collected.
        uptime_seconds: Seconds since it started.
        frames_per_second: Rate since the previous round; None when unknown.
        pushes: The weight pushes it is receiving now (model_id, version, total and
            received bytes, source, seconds).
        error: Why Describe failed (status code and details, or a field no actor reports);
            empty when it did not.
    """

    address: str
    health: str
    worker_id: int | None = None
    kind: str = ""
    env: str = ""
    session: str = ""
    learner_id: str = ""
    policy_versions: dict[str, int] = dataclasses.field(default_factory=dict)
    epoch: int = 0
    frames: int = 0
    uptime_seconds: float = 0.0
    frames_per_second: float | None = None
    pushes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str = ""

    @property
    def serving(self) -> bool:
        """Whether the actor answered SERVING and described itself."""
        return self.health == _SERVING and not self.error

    def as_json(self) -> dict[str, Any]:
        """A plain dict for ``--json`` (``serving`` included)."""
        return dataclasses.asdict(self) | {"serving": self.serving}


class Probe:
    """Ask actors for their status, with the learner's TLS and token settings.

    Args:
        credentials: Channel credentials for TLS; None for plaintext.
        token: Bearer token for Describe; empty for none.
        timeout: Seconds each call may take.
    """

    def __init__(
        self, *, credentials: grpc.ChannelCredentials | None, token: str, timeout: float
    ) -> None:
        self._credentials = credentials
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout

    def round(self, addresses: Sequence[str]) -> list[ActorStatus]:
        """One status per address, in the given order (asked in parallel)."""
        workers = max(1, min(_MAX_PARALLEL, len(addresses)))
        with concurrent.futures.ThreadPoolExecutor(workers, "rlfleet-status") as pool:
            return list(pool.map(self.one, addresses))

    def one(self, address: str) -> ActorStatus:
        """Health and Describe of one actor."""
        options = [*client_channel_options(), ("grpc.enable_retries", 0)]
        if self._credentials is None:
            channel = grpc.insecure_channel(address, options=options)
        else:
            channel = grpc.secure_channel(address, self._credentials, options=options)
        with channel:
            replies = parsing_channel(channel, address)  # replies that do not parse: ProtocolError
            try:
                health = self._health(replies)
            except ProtocolError as exc:
                return ActorStatus(address, "UNKNOWN", error=str(exc))
            try:
                reply = pb_grpc.ActorServiceStub(replies).Describe(
                    pb.DescribeRequest(), metadata=self._metadata, timeout=self._timeout
                )
            except ProtocolError as exc:
                return ActorStatus(address, health, error=str(exc))
            except grpc.RpcError as exc:
                hint = tls_mismatch_hint(
                    str(exc.details()) if isinstance(exc, grpc.Call) else "",
                    tls=self._credentials is not None,
                    add_tls="pass --tls-ca (the CA of its certificate)",
                    drop_tls="drop --tls-ca",
                    add_client_cert="pass --tls-cert and --tls-key",
                )
                return ActorStatus(address, health, error=_rpc_error(exc) + hint)
        try:
            return _from_describe(address, health, reply)
        except ProtocolError as exc:  # a Describe no actor sends: shown, not raised
            return ActorStatus(address, health, error=str(exc))

    def _health(self, channel: Any) -> str:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "TIMEOUT"
            return "UNREACHABLE" if code == grpc.StatusCode.UNAVAILABLE else _code_name(code)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def _from_describe(address: str, health: str, reply: pb.DescribeResponse) -> ActorStatus:
    actor = ActorDescription.from_response(address, reply)
    session = "draining" if actor.draining else ("held" if actor.busy else "free")
    return ActorStatus(
        address=address,
        health=health,
        worker_id=actor.worker_id,
        kind=actor.kind,
        env=actor.env,
        session=session,
        learner_id=actor.learner_id,
        policy_versions=actor.models,
        epoch=actor.epoch,
        frames=actor.frames,
        uptime_seconds=actor.uptime_seconds,
        pushes=[dataclasses.asdict(p) for p in actor.pushes_in_flight],
    )


def _code_name(code: grpc.StatusCode | None) -> str:
    return code.name if code is not None else "UNREACHABLE"


def _rpc_error(exc: grpc.RpcError) -> str:
    if not isinstance(exc, grpc.Call):
        return "UNKNOWN"
    details = (exc.details() or "").splitlines()[0][:120] if exc.details() else ""
    return f"{_code_name(exc.code())}: {details}" if details else _code_name(exc.code())


def with_rates(current: list[ActorStatus], previous: list[ActorStatus]) -> list[ActorStatus]:
    """``current`` with ``frames_per_second`` measured against ``previous`` (same address+epoch)."""
    before = {s.address: s for s in previous if s.worker_id is not None}
    rated = []
    for status in current:
        old = before.get(status.address)
        rate = None
        if old is not None and old.epoch == status.epoch and status.worker_id is not None:
            elapsed = status.uptime_seconds - old.uptime_seconds
            if elapsed > 0 and status.frames >= old.frames:
                rate = (status.frames - old.frames) / elapsed
        rated.append(dataclasses.replace(status, frames_per_second=rate))
    return rated


_COLUMNS = ("WORKER", "KIND", "ENV", "HEALTH", "SESSION", "POLICY", "FRAMES/S", "UPTIME", "ADDRESS")


def format_table(statuses: Sequence[ActorStatus]) -> str:
    """The statuses as an aligned text table, one actor per line, then a summary line."""
    rows = [_COLUMNS, *(_row(s) for s in statuses)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    serving = sum(s.serving for s in statuses)
    total = sum(s.frames_per_second or 0.0 for s in statuses)
    lines.append(f"{serving}/{len(statuses)} serving, {total:,.0f} frames/s")
    lines.extend(f"{s.address}: {s.error}" for s in statuses if s.error)
    lines.extend(
        f"worker_id {w} answers at {', '.join(addresses)}: one actor under several addresses, "
        "or actors sharing a worker_id (a learner refuses this fleet)"
        for w, addresses in shared_worker_ids(statuses).items()
    )
    return "\n".join(line.rstrip() for line in lines)


def shared_worker_ids(statuses: Sequence[ActorStatus]) -> dict[int, list[str]]:
    """The worker_ids more than one address answered with, and those addresses."""
    by_id: dict[int, list[str]] = {}
    for s in statuses:
        if s.worker_id is not None:
            by_id.setdefault(s.worker_id, []).append(s.address)
    return {w: addresses for w, addresses in sorted(by_id.items()) if len(addresses) > 1}


def _row(s: ActorStatus) -> tuple[str, ...]:
    if s.worker_id is None:
        return ("-", "-", "-", s.health, "-", "-", "-", "-", s.address)
    session = f"held by {s.learner_id}" if s.session == "held" and s.learner_id else s.session
    policy = " ".join(f"{mid}={v}" for mid, v in sorted(s.policy_versions.items())) or "-"
    for push in s.pushes:  # e.g. "policy=4 (<- policy=5 40% from relay)"
        done = push["received_bytes"] / max(1, push["total_bytes"])
        policy += f" (<- {push['model_id']}={push['version']} {done:.0%} from {push['source']})"
    rate = "-" if s.frames_per_second is None else f"{s.frames_per_second:,.0f}"
    return (
        str(s.worker_id),
        s.kind,
        s.env,
        s.health,
        session,
        policy,
        rate,
        _duration(s.uptime_seconds),
        s.address,
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
