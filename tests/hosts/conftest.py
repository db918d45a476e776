"""Fixtures of the tests across hosts: a :class:`~testbed.TestBed` per test, removed after it.

Every test here is marked ``hosts`` (``make test-hosts`` runs them); where the kernel
refuses network namespaces (not root, no CAP_NET_ADMIN) they skip with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from testbed import TestBed, unavailable


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the host tests, with one line saying why, where no test bed can be made."""
    mine = [item for item in items if "hosts" in item.keywords]
    if not mine:
        return
    reason = unavailable()
    if reason is not None:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def make_bed() -> Iterator[Callable[..., TestBed]]:
    """``make_bed(hosts=2, rate=None, learner_rate=None)``: a bed removed when the test ends."""
    beds: list[TestBed] = []

    def make(hosts: int = 2, **kwargs: str | None) -> TestBed:
        bed = TestBed(hosts, **kwargs)
        beds.append(bed)
        return bed

    yield make
    for bed in beds:
        bed.close()
