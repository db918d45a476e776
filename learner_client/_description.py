"""What an actor says it is: the one decoder of a ``DescribeResponse``.

:class:`ActorDescription` is what the learner (and ``rlfleet status``) knows of an actor
from its ``Describe``: its worker_id, epoch, env, spaces, models and their versions, kind,
device, credits, pushes in flight. Every number is range-checked here before anything
uses it (a hostile or broken peer gets a ``ProtocolError`` naming the field).
"""

from __future__ import annotations

import dataclasses
import hashlib

from common.config import (
    DEFAULT_MODEL_ID,
    MAX_CREDITS,
    MAX_MODEL_ID,
    MAX_NUM_ENVS,
    MAX_POLICY_VERSION,
    MAX_WORKER_ID,
    check_model_id,
    protocol_mismatch,
)
from common.errors import ProtocolError
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = ["ActorDescription", "PushInFlight"]

#: Pushes in flight read from a Describe.
_LISTED_PUSHES = 16
#: Most seconds a Describe reports (317 years): an actor's clock counts from its start.
_MAX_SECONDS = 1e10


@dataclasses.dataclass(frozen=True)
class PushInFlight:
    """A weight push an actor is receiving, as its Describe reports it.

    Attributes:
        model_id: The model it updates.
        version: The version it carries.
        total_bytes: Its blob's size.
        received_bytes: The bytes received and checked so far.
        source: ``"learner"``, ``"relay"`` or ``"shared memory"``.
        seconds: Seconds since its header arrived.
    """

    model_id: str
    version: int
    total_bytes: int
    received_bytes: int
    source: str
    seconds: float

    @classmethod
    def from_proto(cls, push: pb.PushInFlight) -> PushInFlight:
        """Decode one ``PushInFlight`` (at most 64 characters of its text fields kept)."""
        return cls(
            model_id=push.model_id[:MAX_MODEL_ID] or DEFAULT_MODEL_ID,
            version=int(push.version),
            total_bytes=int(push.total_bytes),
            received_bytes=int(push.received_bytes),
            source=push.source[:64],
            seconds=float(push.seconds),
        )


@dataclasses.dataclass(frozen=True)
class ActorDescription:
    """What Describe reports about one actor, as plain values.

    :meth:`from_response` is the one decoder of ``DescribeResponse``, for the
    collector and for ``rlfleet status`` alike.

    Attributes:
        address: ``host:port`` it was reached at.
        worker_id: Its id in the fleet.
        epoch: Its current epoch (new at every process start).
        num_envs: Its env pool size.
        models: ``{model_id: policy version}``.
        max_credits: Most outstanding credits it honours.
        kind: ``"env"``, ``"torchrl"`` or ``"llm"``.
        max_new_tokens_cap: An LLM actor's cap on new tokens per turn.
        env: The env id it collects from (an LLM actor's task).
        spaces: A digest of what its batches' layout follows of its observation and action
            spaces (kind, shape, dtype, counts; not bounds); "" when it reports none (TorchRL
            and LLM actors).
        busy: Whether a learner session is active.
        draining: Whether it is shutting down (it accepts no new session).
        learner_id: The learner holding the active session; empty when none.
        frames: Frames it collected.
        uptime_seconds: Seconds since it started.
        device: Where its policy runs (``--device``).
        part_deadline: Seconds an incomplete multi-part version waits on it before it
            expires; 0: it takes no multi-part pushes (it predates them).
        host_identity: Its host's identity (``common.shm.host_identity``); empty if unknown.
        shm_probe_ok: It read back the probe segment the Describe named.
        relays_over_tls: It forwards relayed pushes over TLS (its ``--relay-ca``).
        pushes_in_flight: The weight pushes it is receiving (at most 16).
        protocol_version: The wire protocol's revision it speaks; 0 for a build before
            revisions (``common.config.PROTOCOL_VERSION``).
        min_peer_protocol: The oldest learner revision it works with.
    """

    address: str
    worker_id: int
    epoch: int
    num_envs: int
    models: dict[str, int]
    max_credits: int
    kind: str = "env"
    max_new_tokens_cap: int = 0
    env: str = ""
    spaces: str = ""
    busy: bool = False
    draining: bool = False
    learner_id: str = ""
    frames: int = 0
    uptime_seconds: float = 0.0
    device: str = "cpu"
    part_deadline: float = 0.0
    host_identity: str = ""
    shm_probe_ok: bool = False
    relays_over_tls: bool = False
    pushes_in_flight: tuple[PushInFlight, ...] = ()
    protocol_version: int = 0
    min_peer_protocol: int = 0

    @classmethod
    def from_response(cls, address: str, reply: pb.DescribeResponse) -> ActorDescription:
        """Decode the ``DescribeResponse`` that the actor at ``address`` sent.

        Raises:
            ProtocolError: An actor of a protocol revision this build does not work with
                (checked before any other field), or a field outside an actor's ranges.

        Example::

            reply = stub.Describe(pb.DescribeRequest(), timeout=5.0)
            ActorDescription.from_response("10.0.0.1:50051", reply).worker_id
        """
        _check_description(address, reply)
        return cls(
            address=address,
            worker_id=int(reply.worker_id),
            epoch=int(reply.epoch),
            num_envs=int(reply.num_envs),
            models={m.model_id: int(m.version) for m in reply.models},
            max_credits=int(reply.max_credits),
            # Actors that predate the kind field collect from gymnasium envs.
            kind=reply.kind or "env",
            max_new_tokens_cap=int(reply.max_new_tokens_cap),
            env=reply.env_id,
            spaces=_spaces_digest(reply),
            busy=bool(reply.busy),
            draining=bool(reply.draining),
            learner_id=reply.learner_id,
            frames=int(reply.frames),
            uptime_seconds=float(reply.uptime_seconds),
            device=reply.device or "cpu",
            part_deadline=float(reply.part_deadline_seconds),
            host_identity=reply.host_identity,
            shm_probe_ok=bool(reply.shm_probe_ok),
            relays_over_tls=bool(reply.relays_over_tls),
            protocol_version=int(reply.protocol_version),
            min_peer_protocol=int(reply.min_peer_protocol),
            pushes_in_flight=tuple(
                PushInFlight.from_proto(p) for p in reply.pushes_in_flight[:_LISTED_PUSHES]
            ),
        )


def _spaces_digest(reply: pb.DescribeResponse) -> str:
    """A digest of the spaces an actor reports, as far as its batches' layout follows them.

    Kind, shape, dtype and counts; not bounds nor names: two actors of one env whose torque
    limits differ, or one env under two ids, give batches that lie side by side ("" for none).
    """
    if not reply.HasField("observation_spec") and not reply.HasField("action_spec"):
        return ""
    spaces = hashlib.blake2b(digest_size=8)
    for spec in (reply.observation_spec, reply.action_spec):
        layout = pb.SpaceSpec(kind=spec.kind, shape=spec.shape, dtype=spec.dtype, n=spec.n)
        spaces.update(layout.SerializeToString(deterministic=True))
        spaces.update(b"|")
    return spaces.hexdigest()


def _check_description(address: str, reply: pb.DescribeResponse) -> None:
    """Refuse an actor of another protocol revision, then numbers no actor reports.

    The revision comes first: an actor of another one may mean something else by every
    other field (a range a newer build widened), and the fix is the same release on both
    sides, not a look for a broken actor.

    Raises:
        ProtocolError: A revision this build does not work with (0: a build before
            revisions), or a field outside the range an actor's own settings allow.
    """
    peer = f"actor {address} (worker_id {reply.worker_id})"
    mismatch = protocol_mismatch(peer, reply.protocol_version, reply.min_peer_protocol)
    if mismatch:
        raise ProtocolError(mismatch)
    ranges = {
        "worker_id": (reply.worker_id, 0, MAX_WORKER_ID),
        "epoch": (reply.epoch, 1, None),
        "num_envs": (reply.num_envs, 1, MAX_NUM_ENVS),
        "max_credits": (reply.max_credits, 0, MAX_CREDITS),
    }
    ranges |= {
        f"the version of model {m.model_id!r:.80}": (m.version, 0, MAX_POLICY_VERSION)
        for m in reply.models
    }
    for what, (value, low, high) in ranges.items():
        if value < low or (high is not None and value > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise ProtocolError(f"{address}: Describe reports {what} {value}, outside {span}")
    for model in reply.models:
        try:
            check_model_id(model.model_id)
        except ValueError as exc:
            raise ProtocolError(f"{address}: Describe reports a bad model: {exc}") from None
    _check_progress(address, reply)


def _check_progress(address: str, reply: pb.DescribeResponse) -> None:
    """Refuse an uptime or a push in flight that no actor's clock or counters give.

    NaN, inf or 1e300 seconds would break or fill ``rlfleet status``'s table.

    Raises:
        ProtocolError: Seconds outside 0.._MAX_SECONDS, or more bytes received than a push has.
    """
    pushes = reply.pushes_in_flight[:_LISTED_PUSHES]
    seconds = [("uptime_seconds", reply.uptime_seconds)]
    seconds += [("a push in flight's seconds", p.seconds) for p in pushes]
    for what, value in seconds:
        if not 0.0 <= value <= _MAX_SECONDS:
            raise ProtocolError(
                f"{address}: Describe reports {what} {value}, outside 0..{_MAX_SECONDS:g}"
            )
    for p in pushes:
        if p.received_bytes > p.total_bytes:
            raise ProtocolError(
                f"{address}: Describe reports a push in flight of {p.received_bytes} bytes "
                f"received, more than its {p.total_bytes}"
            )
