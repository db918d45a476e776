"""``host_port``: the one place an address gRPC dials is written from a host and a port."""

from __future__ import annotations

import pytest

from common.config import WILDCARD_HOSTS, host_port


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("10.0.0.7", "10.0.0.7:50051"),
        ("actor-0.actors", "actor-0.actors:50051"),
        ("::1", "[::1]:50051"),
        ("[::1]", "[::1]:50051"),  # bracketed once, not "[[::1]]"
        ("fe80::1%eth0", "[fe80::1%eth0]:50051"),
        ("::", "[::]:50051"),
    ],
)
def test_host_port_brackets_an_ipv6_literal_once(host: str, address: str) -> None:
    assert host_port(host, 50051) == address


def test_the_wildcard_hosts_are_the_any_address_of_each_family_as_written() -> None:
    assert {"0.0.0.0", "::", "[::]"} == WILDCARD_HOSTS
