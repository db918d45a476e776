"""Relayed pushes on the learner: one blob sent once, down a chain of actors.

When several remote actors get the same bytes (one model, version and form), the learner
sends them once, to the first actor of a chain; each actor forwards every chunk to the
next as it arrives (``actor_service._serve._relay``), so the push takes about one
chunk-time per actor more than a push to one actor, and the learner's link carries the
blob once instead of once per actor. Every actor still gets its own ``PushWeights`` call
from the learner (header only but for the first), with the blob's digests and the ticket
its relay must present, and answers on it: its verdict is its own, never a relay's. An
actor whose relayed bytes fail (the relay died, stalled, was cut or sent damaged bytes)
answers ``relay_failed`` having applied nothing, and is sent the bytes directly at once.

*Peer catch-up.* An actor that returns (restarted, reconnected, joined late) lacking the
current weights gets them from a peer that applied that very push, over a chain of two: the
learner opens the push on the returning actor and asks the peer (``ForwardWeights``) to
forward the blob its receive buffer still holds; the learner's link carries headers only.

What goes direct: actors on this host (shared memory), a blob under
:data:`MIN_RELAY_BYTES` (a few round trips, which a chain would add per actor), a push to
one actor, actors known by other than a plain ``host:port`` (``ipv4:``, ``ipv6:``), and TLS fleets
(actors hold a server identity, not credentials for each other).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Sequence

from common.config import RELAY_PUSH_ID_BYTES, is_relay_address
from common.rlfleet.v1 import actor_service_pb2 as pb
from learner_client._transport import PushMessages, encode_header

__all__ = ["MIN_RELAY_BYTES", "RelayRoute"]

#: The smallest blob that is relayed.
MIN_RELAY_BYTES = 8 << 20
#: The tickets the learner draws (within ``common.config.RELAY_TICKET_BYTES``).
_TICKET_BYTES = 32


@dataclasses.dataclass(eq=False)
class RelayRoute:
    """Which pushes are relayed, how, and what came of it.

    Attributes:
        enabled: Relay at all (``WeightPushSettings.relay``).
        stall_seconds: How long an actor waits for new relayed bytes before it gives them
            up and the learner sends them itself (``WeightPushSettings.relay_stall_seconds``).
    """

    enabled: bool = True
    stall_seconds: float = 5.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: {
            "relayed_pushes": 0,
            "relay_fallbacks": 0,
            "relay_bytes_saved": 0,
            "relay_depth": 0,
            "peer_catch_ups": 0,
        },
        init=False,
    )

    def relays(
        self,
        total_bytes: int,
        addresses: Sequence[str],
        *,
        tls: bool,
        over_tls: Sequence[bool] = (),
    ) -> bool:
        """Whether a blob of ``total_bytes`` to remote actors at ``addresses`` is relayed.

        Only to plain ``host:port`` addresses (``common.config.is_relay_address``); in a
        TLS fleet (``tls``) only when every actor that forwards (all but the last) does so
        over TLS (``over_tls``, per address: its Describe's ``relays_over_tls``).
        """
        forwarders_ok = not tls or (
            len(over_tls) == len(addresses) and all(over_tls[: len(addresses) - 1])
        )
        return (
            self.enabled
            and forwarders_ok
            and len(addresses) >= 2
            and total_bytes >= MIN_RELAY_BYTES
            and all(is_relay_address(a) for a in addresses)
        )

    def chain(
        self, messages: PushMessages, addresses: Sequence[str], total_bytes: int
    ) -> list[Sequence[bytes]]:
        """The messages each actor of a chain gets, in chain order (``addresses``' order).

        The first gets the header and every chunk and forwards to the second; each next
        one gets its header alone, naming the ticket its relay presents.
        """
        push_id = secrets.token_bytes(RELAY_PUSH_ID_BYTES)
        tickets = [secrets.token_bytes(_TICKET_BYTES) for _ in addresses[1:]]
        base = pb.PushWeightsRequest.FromString(messages[0]).header
        sent: list[Sequence[bytes]] = []
        for i in range(len(addresses)):
            relay = pb.Relay(push_id=push_id, stall_seconds=self.stall_seconds)
            if i > 0:
                relay.source_ticket = tickets[i - 1]
            if i + 1 < len(addresses):
                relay.forward_to, relay.forward_ticket = addresses[i + 1], tickets[i]
            header = pb.WeightsHeader()
            header.CopyFrom(base)
            header.relay.CopyFrom(relay)
            encoded = encode_header(header)
            sent.append(messages.with_header(encoded) if i == 0 else [encoded])
        with self._lock:
            self._counts["relayed_pushes"] += len(addresses) - 1
            self._counts["relay_bytes_saved"] += (len(addresses) - 1) * total_bytes
            self._counts["relay_depth"] = max(self._counts["relay_depth"], len(addresses))
        return sent

    def catch_up(
        self, messages: PushMessages, peer: str, target: str, total_bytes: int
    ) -> tuple[pb.ForwardRequest, Sequence[bytes]]:
        """A chain of two for a returning actor: the peer's ForwardRequest, the target's messages.

        The peer forwards the blob it holds (the last whole push it applied, these bytes).
        """
        first, second = self.chain(messages, [peer, target], total_bytes)
        header = pb.PushWeightsRequest.FromString(first[0]).header
        request = pb.ForwardRequest(
            model_id=header.model_id,
            version=header.version,
            total_bytes=header.total_bytes,
            crc32c=header.crc32c,
            relay=header.relay,
        )
        with self._lock:
            self._counts["peer_catch_ups"] += 1
        return request, second

    def fell_back(self, total_bytes: int) -> None:
        """Count an actor whose relayed bytes failed and that was sent them directly."""
        with self._lock:
            self._counts["relay_fallbacks"] += 1
            self._counts["relay_bytes_saved"] -= total_bytes

    def stats(self) -> dict[str, int]:
        """The relay counters of ``GrpcCollector.stats()``.

        ``relayed_pushes`` (actors a push was routed to through a relay, those that fell
        back included), ``relay_fallbacks`` (of those, actors sent the bytes directly after
        all), ``relay_bytes_saved`` (bytes the learner did not send, net of fallbacks),
        ``relay_depth`` (the longest chain so far), ``peer_catch_ups`` (returning actors
        sent the current weights by a peer that holds them).
        """
        with self._lock:
            return dict(self._counts)
