"""Fixtures of the tests across hosts: a :class:`~testbed.TestBed` per test, removed after it.

Every test here is marked ``hosts`` (``make test-hosts`` runs them); where the kernel
refuses network namespaces (not root, no CAP_NET_ADMIN) they skip with the reason.
A bed is removed when its test ends, passed or failed, at exit, and on SIGTERM (a CI
timeout); what a SIGKILL leaves behind, the next bed sweeps away.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from testbed import TestBed, unavailable

_LIVE: list[TestBed] = []


def _on_sigterm(previous: Any) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        for bed in list(_LIVE):
            bed.close()
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    return handler


def _guard_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        current = signal.getsignal(signal.SIGTERM)
        if getattr(current, "__name__", "") != "handler":
            signal.signal(signal.SIGTERM, _on_sigterm(current))


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
        _guard_sigterm()
        bed = TestBed(hosts, **kwargs)
        beds.append(bed)
        _LIVE.append(bed)
        return bed

    yield make
    for bed in beds:
        bed.close()
        _LIVE.remove(bed)
