"""Which pushes the learner relays (``learner_client._relay.RelayRoute.relays``)."""

from __future__ import annotations

import pytest

from common.config import is_relay_address
from learner_client._relay import MIN_RELAY_BYTES, RelayRoute

PLAIN = ["10.0.0.1:50051", "10.0.0.2:50051"]


@pytest.mark.parametrize(
    ("route", "size", "addresses", "tls", "relayed"),
    [
        (RelayRoute(), MIN_RELAY_BYTES, PLAIN, False, True),
        (RelayRoute(), MIN_RELAY_BYTES, ["[fd00::1]:50051", "actor-1.actors:50051"], False, True),
        (RelayRoute(), MIN_RELAY_BYTES - 1, PLAIN, False, False),  # a few round trips
        (RelayRoute(), MIN_RELAY_BYTES, PLAIN[:1], False, False),  # one actor
        (RelayRoute(), MIN_RELAY_BYTES, PLAIN, True, False),  # TLS: no actor said it forwards
        (RelayRoute(enabled=False), MIN_RELAY_BYTES, PLAIN, False, False),
        (RelayRoute(), MIN_RELAY_BYTES, [PLAIN[0], "unix:/run/actor.sock"], False, False),
        (RelayRoute(), MIN_RELAY_BYTES, [PLAIN[0], "dns:///actors:50051"], False, False),
        (RelayRoute(), MIN_RELAY_BYTES, [PLAIN[0], "h" * 300 + ":1"], False, False),
    ],
)
def test_a_push_is_relayed_only_where_every_condition_holds(
    route, size, addresses, tls, relayed
) -> None:
    assert route.relays(size, addresses, tls=tls) is relayed


THREE = [*PLAIN, "10.0.0.3:50051"]


@pytest.mark.parametrize(
    ("over_tls", "relayed"),
    [
        ([True, True, False], True),  # the last forwards to no one
        ([True, True, True], True),
        ([True, False, True], False),  # the second would forward in the clear
        ([False, True, True], False),
        ([True, True], False),  # not one flag per address
    ],
)
def test_a_tls_fleet_relays_only_through_actors_that_forward_over_tls(over_tls, relayed) -> None:
    route = RelayRoute()
    assert route.relays(MIN_RELAY_BYTES, THREE, tls=True, over_tls=over_tls) is relayed
    assert route.relays(MIN_RELAY_BYTES, THREE, tls=False, over_tls=over_tls) is True


def test_relay_addresses_are_plain_host_and_port() -> None:
    for address in ("127.0.0.1:1", "actor-0.actors.rl.svc:50051", "[::1]:50051", "a_b:65535"):
        assert is_relay_address(address)
    refused = ("", "localhost", "unix:/tmp/a", "dns:///a:1", "a" * 256 + ":1", "a:0", "a:65536")
    resolvers = ("unix-abstract:x", "unix:50051", "ipv4:127.0.0.1:1", "vsock:2:1", "dns:a:1")
    for address in (*refused, *resolvers, "a..b:1", " a:1"):
        assert not is_relay_address(address), address


def test_the_learners_relay_headers_pass_the_actors_check() -> None:
    """Push id and tickets have the lengths both sides take from common.config."""
    from actor_service._config import ActorConfig
    from actor_service._serve._relay import check_relay
    from common.checksum import crc32c
    from common.config import RELAY_PUSH_ID_BYTES, RELAY_TICKET_BYTES
    from common.rlfleet.v1 import actor_service_pb2 as pb
    from learner_client._transport import push_messages

    blob = bytes(range(256)) * 64
    messages = push_messages("policy", 3, blob, "", crc32c=crc32c(blob))
    addresses = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    sent = RelayRoute().chain(messages, addresses, len(blob))
    relays = [pb.PushWeightsRequest.FromString(s[0]).header.relay for s in sent]
    for relay in relays:
        check_relay(relay, ActorConfig())  # raises ProtocolError on any length out of range
        assert len(relay.push_id) == RELAY_PUSH_ID_BYTES
    low, high = RELAY_TICKET_BYTES
    assert all(low <= len(r.forward_ticket) <= high for r in relays[:-1])
    assert [r.source_ticket for r in relays[1:]] == [r.forward_ticket for r in relays[:-1]]
    assert relays[-1].forward_to == ""


def test_the_relay_counters_follow_chains_fallbacks_and_catch_ups() -> None:
    from common.checksum import crc32c
    from common.rlfleet.v1 import actor_service_pb2 as pb
    from learner_client._transport import push_messages

    blob = bytes(range(256)) * 64
    messages, size = push_messages("policy", 3, blob, "", crc32c=crc32c(blob)), len(blob)
    three = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    route = RelayRoute(stall_seconds=2.5)
    sent = route.chain(messages, three, size)
    relays = [pb.PushWeightsRequest.FromString(s[0]).header.relay for s in sent]
    assert [r.forward_to for r in relays] == [*three[1:], ""]  # each forwards to the next
    assert len({r.push_id for r in relays}) == 1
    assert {r.stall_seconds for r in relays} == {2.5}
    assert route.stats() == {
        "relayed_pushes": 2,
        "relay_fallbacks": 0,
        "relay_bytes_saved": 2 * size,
        "relay_depth": 3,
        "peer_catch_ups": 0,
    }
    route.fell_back(size)  # one of them was sent the bytes directly after all
    assert (route.stats()["relay_fallbacks"], route.stats()["relay_bytes_saved"]) == (1, size)
    forward, _ = route.catch_up(messages, three[0], three[1], size)
    assert forward.relay.forward_to == three[1]
    stats = route.stats()
    assert (stats["peer_catch_ups"], stats["relayed_pushes"]) == (1, 3)
    assert stats["relay_depth"] == 3  # the longest chain so far, not the last (of 2)


def test_a_peer_catch_up_names_the_very_blob_the_peer_must_hold() -> None:
    """The peer forwards only the blob it holds: the request names its model, version, size
    and CRC-32C (the peer compares them); each chain draws its own push id."""
    from common.checksum import crc32c
    from common.rlfleet.v1 import actor_service_pb2 as pb
    from learner_client._transport import push_messages

    blob = bytes(range(256)) * 64
    messages = push_messages("policy", 7, blob, "", crc32c=crc32c(blob))
    header = pb.PushWeightsRequest.FromString(messages[0]).header
    route = RelayRoute()
    forward, second = route.catch_up(messages, "10.0.0.1:50051", "10.0.0.2:50051", len(blob))
    assert (forward.model_id, forward.version) == ("policy", 7)
    assert (forward.total_bytes, forward.crc32c) == (len(blob), crc32c(blob))
    assert forward.crc32c == header.crc32c
    target = pb.PushWeightsRequest.FromString(second[0]).header.relay
    assert target.source_ticket == forward.relay.forward_ticket
    again, _ = route.catch_up(messages, "10.0.0.1:50051", "10.0.0.2:50051", len(blob))
    assert again.relay.push_id != forward.relay.push_id
