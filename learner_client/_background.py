"""Background collection into a replay buffer (``start()``) and the ``pause()`` gate.

:class:`Background` runs the collector's own iterator on one daemon thread;
the iterator stores every batch in the replay buffer. ``pause()`` closes a
gate: the mailbox stops granting credits and handing out batches, the
context manager waits for batches already in flight to arrive (they stay
buffered) and for the thread to finish storing the batch it holds, so the
buffer does not grow while the pause is held. Leaving the context reopens
the gate (with ``resume=False``, once the thread has ended). Errors of the
thread are logged, their text kept in :attr:`Background.error`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

from common.errors import ClosedError, SessionStateError
from learner_client._mailbox import Mailbox
from learner_client._waits import Flag

__all__ = ["Background"]

log = logging.getLogger("learner_client")

_POLL_SECONDS = 0.2


class _Stopped(Exception):
    """Ends the background thread where it waits (raised in it, caught by it)."""


def _left(deadline: float) -> float | None:
    """Seconds until ``deadline``, at least 0; None when it is infinite."""
    return None if math.isinf(deadline) else max(0.0, deadline - time.monotonic())


class Background:
    """The replay-buffer thread and the pause gate of one collector.

    Args:
        mailbox: The collector's mailbox (paused while the gate is closed).
        batch_timeout: Longest wait for in-flight batches when pausing.
        iterate: Returns the collector's iterator (which stores into the buffer).
    """

    def __init__(
        self, mailbox: Mailbox, batch_timeout: float, iterate: Callable[[], Iterator[object]]
    ) -> None:
        self._mailbox = mailbox
        self._batch_timeout = batch_timeout
        self._iterate = iterate
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._resumed = Flag()
        self._resumed.set()
        self._parked = Flag()
        self._pause_lock = threading.Lock()
        self._pauser: threading.Thread | None = None
        # start() against close(); reentrant: a shutdown() from a signal handler may run on
        # the thread that holds it, in start() (waiting for its thread to start).
        self._life = threading.RLock()
        self._closed = False
        self.error: str | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def is_current(self) -> bool:
        """Whether the caller is the background thread (a ``shutdown()`` from its buffer)."""
        return self._thread is threading.current_thread()

    def start(self) -> None:
        """Start the thread (no-op if it runs).

        Raises:
            ClosedError: After :meth:`close` (a ``shutdown()`` that came first).
            RuntimeError: The thread was asked to stop (``pause(resume=False)`` that timed
                out) and still stores its last batch: it would end right after.
        """
        with self._life:  # checked and started as one step, never across a close
            if self._closed:
                raise ClosedError("the collector is shut down")
            if self.running and self._stop.is_set():
                raise RuntimeError(
                    "the background collection thread is still storing its last batch before"
                    " it ends: start() again once is_running() is False"
                )
            if self.running:
                return
            self._stop.clear()
            self.error = None
            if self._closed:  # a signal handler's shutdown() came in between: stays stopped
                self._stop.set()
                raise ClosedError("the collector is shut down")
            self._thread = threading.Thread(
                target=self._main, name="rlfleet-collector", daemon=True
            )
            self._thread.start()

    def _main(self) -> None:
        try:
            for _ in self._iterate():
                if self._stop.is_set():
                    return
                self.wait_resumed()
        except BaseException as exc:
            # The collector's own end only: a replay buffer's error (any type) lost a batch.
            if self._stop.is_set() and isinstance(exc, _Stopped | SessionStateError):
                return
            log.exception("background collection stopped")
            # Its text only: the exception's frames hold the collector (and a live
            # coroutine's frame may be among them), so a dropped collector was never freed.
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._parked.set()

    def wait_resumed(self) -> None:
        """Block while the gate is closed (the background thread counts as parked meanwhile).

        Another consumer waiting here does not park the background thread: ``pause()``
        waits for that thread, which may still be storing a batch.

        Raises:
            RuntimeError: Called from the thread holding the pause (it would wait forever).
            _Stopped: The background thread was asked to stop (it stores nothing more).
        """
        if not self._resumed.is_set() and self._pauser is threading.current_thread():
            raise RuntimeError("cannot collect inside pause() from the thread that paused")
        # Only the thread asked to stop ends here: a stop outlives its thread (pause with
        # resume=False), and any other consumer waits out a later pause on the gate.
        own = self.is_current()
        while not self._resumed.is_set() and not (own and self._stop.is_set()):
            if own:
                self._parked.set()
            self._resumed.wait(_POLL_SECONDS)
        if own and self._stop.is_set():
            raise _Stopped

    @contextlib.contextmanager
    def pause(self, timeout: float | None, resume: bool) -> Iterator[None]:
        """Close the gate while the context is held.

        Args:
            timeout: Longest wait, in seconds, for batches in flight and for the thread
                to park (None: no limit). Batches still owed then arrive while the pause
                is held and stay buffered (logged); a thread that does not park raises.
            resume: Whether the thread collects again when the context ends; if not, it
                ends there and :meth:`start` starts it again.

        Raises:
            RuntimeError: Already paused.
            TimeoutError: The thread did not park within ``timeout`` (the gate reopens).
        """
        if not self._pause_lock.acquire(blocking=False):
            raise RuntimeError("the collector is already paused")
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        try:
            self._pauser = threading.current_thread()
            self._parked.clear()
            self._resumed.clear()
            self._mailbox.set_paused(True)
            busy = self._mailbox.wait_idle(deadline - time.monotonic())
            if busy:
                log.warning("pause: worker_ids %s still owe batches after %s s", busy, timeout)
            if self.running and not self._parked.wait(_left(deadline)):
                raise TimeoutError(
                    f"pause: the background collection thread did not park within {timeout} s"
                    " (it is storing a batch: a slow replay_buffer.extend()?); pass a longer"
                    " timeout, or None to wait as long as it takes"
                )
            yield
        finally:
            if not resume and self.running:  # it ends before the gate reopens: stores no more
                self.stop()
                self.join(1.0 if timeout is None else max(1.0, deadline - time.monotonic()))
            self._mailbox.set_paused(False)
            self._resumed.set()
            self._pauser = None
            self._pause_lock.release()

    def stop(self) -> None:
        """Ask the thread to stop and open the gate; it wakes when the mailbox closes."""
        self._stop.set()
        self._resumed.set()

    def close(self) -> None:
        """:meth:`stop` for good: a later :meth:`start` raises ClosedError."""
        with self._life:
            self._closed = True
            self.stop()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the thread to end."""
        if self._thread is not None and self._thread is not threading.current_thread():
            # Not started yet (RuntimeError): a signal handler's shutdown() interrupted
            # start(); the thread then starts on the closed collector and ends at once.
            with contextlib.suppress(RuntimeError):
                self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("background collection thread still alive after %.1f s", timeout)
