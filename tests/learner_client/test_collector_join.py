"""Actors joining a collector while it collects, from the user's thread and a watcher's.

``add_collectors`` (or a ``dns:`` joiner) resplits a sync fleet on another thread: every
session restarts with the smaller per-actor share. A round that read the fleet's
worker_ids before the join must not stack its actors' shares of the new split alone (a
batch of fewer than ``frames_per_batch`` frames); it starts over with the joiner. An actor
that a watcher lists while another is added by hand is admitted as well, and a shutdown while
the watcher waits on a joiner that never answers keeps its bound.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import torch
from helpers import poll_until
from tensordict import TensorDictBase

from learner_client import GrpcCollector
from learner_client._fleet import Fleet
from learner_client._link import ActorLink


def test_a_sync_round_waiting_while_an_actor_joins_yields_a_whole_batch_of_the_grown_fleet(
    fleet,
) -> None:
    with GrpcCollector([fleet[0].address], frames_per_batch=8, sync=True) as collector:
        assert collector.next().batch_size == torch.Size([1, 2, 4])
        in_round, go_round = threading.Event(), threading.Event()
        slabs = collector._rounds.slabs
        set_layout = slabs.set_layout

        def round_held(worker_ids: list[int]) -> None:  # the round has read the worker_ids
            in_round.set()
            assert go_round.wait(30)
            set_layout(worker_ids)

        slabs.set_layout = round_held  # type: ignore[method-assign]
        outcome: list[object] = []
        taking = threading.Thread(target=lambda: outcome.append(_outcome_of(collector.next)))
        try:
            taking.start()
            assert in_round.wait(30)
            slabs.set_layout = set_layout  # type: ignore[method-assign]
            collector.add_collectors([fleet[2].address])  # resplit: 4 frames per actor
        finally:
            go_round.set()
            taking.join(60)
        batch = outcome[0]
        assert isinstance(batch, TensorDictBase), repr(batch)
        assert batch.batch_size == torch.Size([2, 2, 2])  # the whole batch, both shares
        assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 2]
        assert collector.next().batch_size == torch.Size([2, 2, 2])


def _outcome_of(call: Callable[[], object]) -> object:
    """``call()``'s result, or the exception it raised."""
    try:
        return call()
    except BaseException as exc:
        return exc


class _MovingFleet:
    """A fleet object whose live addresses the test sets (``RayFleet.live_addresses``)."""

    def __init__(self, addresses: list[str], worker_ids: list[int]) -> None:
        self.addresses, self.worker_ids = addresses, worker_ids
        self.live = list(addresses)

    def live_addresses(self) -> list[str]:
        """The addresses its members serve at now."""
        return list(self.live)

    def close(self) -> None:
        """Nothing to stop: the actors are the session's."""


def test_an_actor_listed_while_another_is_added_by_hand_is_admitted(fleet, monkeypatch) -> None:
    """The watcher reads the fleet's addresses while ``add_collectors`` registers an actor
    on the user's thread: the listed newcomer is still admitted (it is not dropped with an
    error of the watcher's thread, never offered again)."""
    reading, go_on = threading.Event(), threading.Event()

    def address(link: ActorLink) -> str:  # the watcher pauses as it reads the members'
        if threading.current_thread().name == "rlfleet-dns-fleet" and not go_on.is_set():
            reading.set()
            assert go_on.wait(30)
        return link.__dict__["address"]

    def move(link: ActorLink, value: str) -> None:
        link.__dict__["address"] = value

    given = _MovingFleet([fleet[0].address], [0])
    with GrpcCollector(given, frames_per_batch=4, dns_refresh_interval=0.05) as collector:
        monkeypatch.setattr(ActorLink, "address", property(address, move), raising=False)
        try:
            given.live = [fleet[0].address, fleet[1].address]  # worker_id 1 is listed
            assert reading.wait(30)
            collector.add_collectors([fleet[2].address])  # worker_id 2, added by hand
        finally:
            go_on.set()
        poll_until(lambda: collector.worker_ids == [0, 1, 2], timeout=20)


def test_a_shutdown_while_a_watcher_admits_a_silent_actor_keeps_its_bound(
    fleet, monkeypatch, caplog
) -> None:
    """The fleet lists an address that accepts connections and never answers; while the
    watcher's thread describes it (up to ``connect_timeout``), ``shutdown(timeout=1)`` on the
    user's thread returns within its bound (it waited 5 s for that thread) and the thread
    ends with it, offering the address no more (no "could not admit" warning)."""
    silent = socket.socket()  # listens: the kernel takes the connection, nothing answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    describing = threading.Event()
    describe = Fleet.describe

    def describe_seen(self: Fleet, addresses: list[str]) -> list:
        if threading.current_thread().name == "rlfleet-dns-fleet":
            describing.set()  # the watcher's Describe of the silent address begins
        return describe(self, addresses)

    monkeypatch.setattr(Fleet, "describe", describe_seen)
    given = _MovingFleet([fleet[0].address], [0])
    collector = GrpcCollector(given, frames_per_batch=4, dns_refresh_interval=0.05)
    try:
        given.live = [fleet[0].address, f"127.0.0.1:{silent.getsockname()[1]}"]
        assert describing.wait(30)
        start = time.monotonic()
        collector.shutdown(timeout=1)
        took = time.monotonic() - start
        assert took < 3, f"shutdown(timeout=1) took {took:.1f} s"
        assert not [t for t in threading.enumerate() if t.name == "rlfleet-dns-fleet"]
        assert "could not admit" not in caplog.text
    finally:
        collector.shutdown(timeout=1)
        silent.close()
