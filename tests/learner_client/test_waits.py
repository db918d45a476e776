"""Waits a Ctrl-C interrupts cleanly: ``Flag`` (the pause gate's, a second ``shutdown()``'s)
behaves as ``threading.Event``, and a real SIGINT while ``pause()`` or an iteration waits on
the gate raises KeyboardInterrupt, leaving the gate usable."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import interrupt_in_condition_wait

from learner_client._background import Background
from learner_client._mailbox import Mailbox
from learner_client._waits import Flag


def test_a_flag_waits_as_an_event_does() -> None:
    flag = Flag()
    began = time.monotonic()
    assert flag.wait(0.2) is False
    assert time.monotonic() - began >= 0.19
    assert flag.wait(0) is False
    assert flag.wait(-1) is False
    assert flag._waiters == []  # a timed-out waiter leaves no lock behind
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(flag.wait(10))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.1)
    flag.set()
    for waiter in waiters:
        waiter.join(5)
    assert woken == [True, True, True]
    assert flag.is_set()
    assert flag.wait() is True
    assert flag.wait(0) is True
    flag.clear()
    assert not flag.is_set()
    assert flag.wait(0.05) is False
    flag.set()
    flag.set()  # twice: no waiter's lock released twice
    assert flag.wait(0) is True


@contextlib.contextmanager
def _ctrl_c_after(seconds: float) -> Iterator[None]:
    """A real SIGINT to the main thread after ``seconds``, with the trace function raising
    KeyboardInterrupt inside any ``Condition.wait`` where it leaves its lock released."""
    ctrl_c = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, 2))
    try:
        ctrl_c.start()  # its start waits on a Condition itself: before the trace
        sys.settrace(interrupt_in_condition_wait)
        yield
    finally:
        sys.settrace(None)
        ctrl_c.cancel()
        ctrl_c.join()


def _background(storing: threading.Event) -> Background:
    """A gate whose thread stores one batch until ``storing`` is set, then parks."""
    mailbox = Mailbox(2, lambda worker_id, credits: None, lambda worker_id, epoch, seq: None)

    def iterate() -> Iterator[None]:
        storing.wait(30)  # a slow replay_buffer.extend()
        yield None
        storing.wait(30)

    return Background(mailbox, batch_timeout=5.0, iterate=iterate)


def test_a_ctrl_c_while_pause_waits_for_the_thread_to_park_raises_keyboard_interrupt() -> None:
    """``pause()`` waits for the background thread to park (an ``Event.wait`` before, where
    an interrupt at one step raised ``RuntimeError: release unlocked lock`` instead)."""
    storing = threading.Event()
    background = _background(storing)
    background.start()
    with _ctrl_c_after(0.1), pytest.raises(KeyboardInterrupt), background.pause(None, True):
        pass
    storing.set()
    with background.pause(10.0, True):  # the gate is free again and the thread parks
        assert background.running
    background.stop()
    background.join(5)
    assert not background.running


def test_a_ctrl_c_while_an_iteration_waits_on_the_gate_raises_keyboard_interrupt() -> None:
    """A batch taken from the main thread waits at the gate while another thread pauses."""
    background = _background(threading.Event())
    held, release = threading.Event(), threading.Event()

    def pauser() -> None:
        with background.pause(5.0, True):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=pauser)
    thread.start()
    try:
        assert held.wait(10)
        with _ctrl_c_after(0.3), pytest.raises(KeyboardInterrupt):
            background.wait_resumed()
    finally:
        release.set()
        thread.join(10)
    background.wait_resumed()  # the gate reopened: no wait
