"""LocalFleet closed from another thread while it starts or restarts an actor."""

from __future__ import annotations

import threading

import pytest
from helpers import poll_until, process_alive

from common.errors import SessionStateError
from learner_client._local_fleet import LocalFleet


def test_a_fleet_closed_while_it_starts_its_actors_leaves_none_running(monkeypatch):
    """close() on another thread between two actors' starts: the start raises and no actor
    is left, the one started after the close among them."""
    spawn, gate, held = LocalFleet._spawn, threading.Event(), threading.Event()
    spawned: list[int] = []

    def held_spawn(fleet, worker_id, *, port, seed):
        if worker_id == 1:
            held.set()
            gate.wait(10)
        actor = spawn(fleet, worker_id, port=port, seed=seed)
        spawned.append(actor.process.pid)
        return actor

    monkeypatch.setattr(LocalFleet, "_spawn", held_spawn)
    fleet = LocalFleet(2, num_envs=1, grace_period=0)
    _close_while(fleet, fleet.start, held, gate, spawned)


def _close_while(fleet, call, held, gate, spawned: list[int]) -> None:
    """Close ``fleet`` while ``call`` (on a thread) is held at ``held`` before a spawn: the
    call raises SessionStateError and none of the two actors spawned is left running."""
    errors: list[BaseException] = []
    caller = _on_thread(call, errors)
    assert held.wait(10)
    fleet.close()
    gate.set()
    caller.join(30)
    assert not caller.is_alive()
    assert len(spawned) == 2
    poll_until(lambda: not any(process_alive(p) for p in spawned), timeout=5)
    assert [type(e) for e in errors] == [SessionStateError], errors


def _on_thread(call, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.long  # an actor started and made ready: 3-5 s on 2 loaded cores
def test_a_fleet_closed_while_it_restarts_an_actor_leaves_none_running(monkeypatch):
    """close() on another thread while restart() starts the new actor: the restart raises
    and the new actor is stopped with the fleet, not left serving a stopped fleet."""
    spawn, gate, held = LocalFleet._spawn, threading.Event(), threading.Event()
    fleet = LocalFleet(1, num_envs=1, grace_period=0).start()
    spawned = list(fleet.pids)

    def held_spawn(fleet, worker_id, *, port, seed):
        held.set()
        gate.wait(10)
        actor = spawn(fleet, worker_id, port=port, seed=seed)
        spawned.append(actor.process.pid)
        return actor

    monkeypatch.setattr(LocalFleet, "_spawn", held_spawn)
    _close_while(fleet, lambda: fleet.restart(0), held, gate, spawned)


@pytest.mark.long  # an actor started and made ready: 3-5 s on 2 loaded cores
def test_a_second_close_from_another_thread_returns_once_every_actor_is_reaped(monkeypatch):
    """Two threads close the fleet: the second returns only after the first reaped the
    actors (it used to return at once, the actors still running)."""
    stop_actors, gate, held = LocalFleet._stop_actors, threading.Event(), threading.Event()
    fleet = LocalFleet(1, num_envs=1, grace_period=0).start()
    pids = list(fleet.pids)

    def held_stop(fleet, actors):
        if not held.is_set():
            held.set()
            gate.wait(10)
        stop_actors(fleet, actors)

    monkeypatch.setattr(LocalFleet, "_stop_actors", held_stop)
    errors: list[BaseException] = []
    first = _on_thread(fleet.close, errors)
    assert held.wait(10)
    alive_after_second: list[bool] = []
    second = _on_thread(
        lambda: (fleet.close(), alive_after_second.extend(map(process_alive, pids))), errors
    )
    second.join(1.0)  # returns at once if it does not wait for the first
    gate.set()
    first.join(30)
    second.join(30)
    assert not errors
    assert alive_after_second == [False] * len(pids)


def test_a_fleet_stopped_by_a_signal_handler_while_it_starts_raises_session_state_error(
    monkeypatch,
):
    """A signal handler on the starting thread (the lock is reentrant) stopping the fleet while
    start() reads an actor's ready line: start() says the fleet was stopped, not a ValueError
    from the file the stop closed, and no actor is left."""
    fleet = LocalFleet(1, num_envs=1, grace_period=0)
    _stop_at_ready_line(monkeypatch, fleet, fleet.start)


@pytest.mark.long  # an actor started and made ready: 3-5 s on 2 loaded cores
def test_a_fleet_stopped_by_a_signal_handler_while_it_restarts_raises_session_state_error(
    monkeypatch,
):
    """The same during restart(): the restart says the fleet was stopped; no actor is left."""
    fleet = LocalFleet(1, num_envs=1, grace_period=0).start()
    _stop_at_ready_line(monkeypatch, fleet, lambda: fleet.restart(0))


def _stop_at_ready_line(monkeypatch, fleet: LocalFleet, call) -> None:
    """Stop ``fleet`` on the calling thread when ``call`` first reads a ready line, as a
    signal handler would: ``call`` raises SessionStateError and no actor is left running."""
    from learner_client import _local_fleet

    head, pids = _local_fleet._head, []

    def stopped_then_read(stream):
        if not pids:  # the handler runs between two of the call's steps, once
            pids.extend(fleet.pids)
            fleet.stop()
        return head(stream)

    monkeypatch.setattr(_local_fleet, "_head", stopped_then_read)
    with pytest.raises(SessionStateError, match="stopped while its actors started"):
        call()
    assert pids
    assert not any(process_alive(p) for p in pids)
