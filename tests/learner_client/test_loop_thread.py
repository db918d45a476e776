"""The learner's loop thread: grpc completions of a closed collector's loop stay quiet, a
Ctrl-C while a call waits raises KeyboardInterrupt, a run handed over while it closes fails
at once."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time

import grpc
import pytest
from helpers import interrupt_in_condition_wait, poll_until

from common.errors import ClosedError, DeadlineError
from learner_client._loop_thread import LoopThread

pytestmark = pytest.mark.usefixtures("loopback_only")

# Nothing listens on port 9 (discard) here; wait_for_ready keeps a call pending to its deadline.
_NOWHERE = "127.0.0.1:9"
_KEPT: list[object] = []


async def _pending_call(deadline: float) -> None:
    channel = grpc.aio.insecure_channel(_NOWHERE)
    call = channel.unary_unary("/rlfleet.v1.Nowhere/Call")(
        b"", timeout=deadline, wait_for_ready=True
    )
    _KEPT.append((channel, call))  # referenced past this coroutine, as a session's call is


async def _wait_in_grpc(seconds: float) -> None:
    async with grpc.aio.insecure_channel(_NOWHERE) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await channel.unary_unary("/rlfleet.v1.Nowhere/Call")(
                b"", timeout=seconds, wait_for_ready=True
            )


def test_a_late_completion_for_a_closed_loop_is_not_reported_by_the_next_collectors_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """grpc hands a completion whose loop is closed to the loop that reads its poller: the
    next collector's. That loop drops it (debug log) instead of printing grpc's traceback."""
    old = asyncio.new_event_loop()
    thread = threading.Thread(target=old.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(_pending_call(0.5), old).result(5)
    old.call_soon_threadsafe(old.stop)
    thread.join(5)
    old.close()  # the old call is still pending in grpc's core, bound to this closed loop

    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    loop = LoopThread("test-next-collector")
    try:
        loop.run(_wait_in_grpc(1.5), 10)  # the old call's deadline passes meanwhile
    finally:
        loop.close(5)
    assert time.monotonic() - started >= 1.0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "closed event loop" in caplog.text  # it was seen, and dropped
    _KEPT.clear()


def test_other_errors_on_the_loop_are_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    """The filter is narrow: a callback raising "Event loop is closed" itself, or any other
    error, reaches asyncio's handler as before."""

    def fails(message: str) -> None:
        raise RuntimeError(message)

    loop = LoopThread("test-errors")
    try:
        loop.call_soon(fails, "Event loop is closed")
        loop.call_soon(fails, "a user's callback failed")
        loop.run(asyncio.sleep(0.05), 5)
    finally:
        loop.close(5)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, errors
    assert all("Exception in callback" in e for e in errors), errors


def test_an_operations_own_deadline_error_reaches_the_caller_with_its_words() -> None:
    """A call's DeadlineError (a TimeoutError) was replaced by the loop's wait's, naming the
    wait's longer bound ("did not finish within 8.0 s" for a call that gave up at 3 s)."""
    loop = LoopThread("test-loop")

    async def late_call() -> None:
        raise DeadlineError("127.0.0.1:1: DEADLINE_EXCEEDED after call_timeout=3 s")

    async def hangs() -> None:
        await asyncio.sleep(60)

    try:
        with pytest.raises(DeadlineError, match="after call_timeout=3 s"):
            loop.run(late_call(), 8.0)
        start = time.monotonic()
        with pytest.raises(DeadlineError, match=r"operation did not finish within 0\.2 s"):
            loop.run(hangs(), 0.2)
        assert time.monotonic() - start < 2
    finally:
        loop.close(5.0)


def test_a_ctrl_c_while_a_call_waits_raises_keyboard_interrupt_and_the_loop_goes_on() -> None:
    """A push or a stop waits in ``LoopThread.run``; a Ctrl-C there is KeyboardInterrupt. The
    wait was ``Future.result``'s ``Condition.wait``, where an interrupt at one step surfaced as
    ``RuntimeError: cannot release un-acquired lock`` (the trace function raises it there)."""
    loop = LoopThread("test-loop")

    async def slow() -> int:
        await asyncio.sleep(0.5)
        return 1

    ctrl_c = threading.Timer(0.1, signal.pthread_kill, (threading.main_thread().ident, 2))
    try:
        ctrl_c.start()  # its start waits on a Condition itself: before the trace
        sys.settrace(interrupt_in_condition_wait)
        with pytest.raises(KeyboardInterrupt):
            loop.run(slow(), 5.0)
        sys.settrace(None)
        ctrl_c.join()
        assert loop.run(slow(), 5.0) == 1
    finally:
        sys.settrace(None)
        ctrl_c.cancel()
        loop.close(5.0)


def test_a_run_from_another_thread_while_the_loop_closes_raises_closed_error_at_once() -> None:
    """A run submitted while close() waits for the default executor (a large frame decode
    still running) was taken: cancelled by no one, left pending when the loop stopped, it
    waited out its whole timeout (then DeadlineError) after the close had happened."""
    loop = LoopThread("test-loop")
    decoding, decoded = threading.Event(), threading.Event()

    def decode() -> None:
        decoding.set()
        decoded.wait(10)

    async def start_decode() -> None:
        asyncio.get_running_loop().run_in_executor(None, decode)

    loop.run(start_decode(), 5.0)
    assert decoding.wait(5)
    closing = threading.Thread(target=loop.close, args=(5.0,))
    closing.start()
    try:
        # The close's tasks are cancelled; it waits for the executor (asyncio's own flag).
        poll_until(lambda: loop._loop._executor_shutdown_called, 5)  # type: ignore[attr-defined]
        start = time.monotonic()
        with pytest.raises(ClosedError):
            loop.run(asyncio.sleep(60), 3.0)
        assert time.monotonic() - start < 1.0
    finally:
        decoded.set()
        closing.join(10)
    assert not closing.is_alive()
