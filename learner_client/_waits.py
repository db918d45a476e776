"""Waits a Ctrl-C interrupts cleanly: a plain lock's acquire, never ``Condition.wait``.

CPython's ``Condition.wait`` (behind ``Event.wait``, ``Future.result`` and ``queue.Queue``)
releases its lock one step before the ``try`` that takes it back: a signal handler's
exception (Ctrl-C's KeyboardInterrupt, the apps' SIGTERM) landing in that step leaves the
lock released, and the ``with`` around it then raises ``RuntimeError: release unlocked
lock`` over the interrupt. A plain lock's ``acquire`` raises the handler's exception as it
is. Every wait a user's thread (the main thread, where Python runs signal handlers) makes
on another thread goes through here; the mailbox's ``Condition`` takes its lock back itself
(``Mailbox._wait``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Flag", "done_within", "interrupts_held"]


def _acquire(lock: threading.Lock, timeout: float | None) -> bool:
    return lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) while the block runs, then hand it to the handler it replaced.

    For a step that must end whole (a close, a checkpoint's load): interrupted, it would go
    on without its caller and leave the collector's side of it undone. Only on the main
    thread, where Python delivers SIGINT; elsewhere the block runs as it is. The default
    handler raises ``KeyboardInterrupt`` once the block has ended.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        if held and callable(previous):
            previous(signal.SIGINT, None)


def done_within(future: concurrent.futures.Future[Any], timeout: float | None) -> bool:
    """Whether ``future`` finished within ``timeout`` seconds (None: as long as it takes)."""
    finished = threading.Lock()
    finished.acquire()
    future.add_done_callback(lambda _: finished.release())
    return _acquire(finished, timeout)


class Flag:
    """``threading.Event``'s ``set``, ``clear``, ``is_set`` and ``wait``, waited on with a lock.

    Each waiter holds a lock of its own that :meth:`set` releases; a wait that ends
    without it (a timeout, an interrupt) takes its lock off the list itself.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()  # the flag and the waiters' list
        self._set = False
        self._waiters: list[threading.Lock] = []

    def is_set(self) -> bool:
        """Whether the flag is set."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        with self._guard:
            self._set = True
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()

    def clear(self) -> None:
        """Clear the flag: later waits block until the next :meth:`set`."""
        with self._guard:
            self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds pass (None: no limit).

        Returns:
            Whether the flag is set, as ``Event.wait`` returns.
        """
        with self._guard:
            if self._set:
                return True
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        woken = False
        try:
            woken = _acquire(waiter, timeout)
        finally:
            if not woken:
                with self._guard:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        return woken or self._set
