"""The learner's one background thread: an asyncio event loop running every actor's calls.

User-facing methods are synchronous; they hand coroutines to this loop with
:meth:`LoopThread.run` (bounded by a deadline) and callbacks with
:meth:`LoopThread.call_soon`. :meth:`LoopThread.close` cancels what is left,
shuts the default executor (large frame decodes) down and joins the thread,
within a bound, so no thread outlives the collector.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from common.errors import ClosedError, DeadlineError, RlfleetError, SessionStateError
from learner_client._waits import done_within

__all__ = ["WAIT_MARGIN_S", "LoopThread", "settle"]

T = TypeVar("T")
log = logging.getLogger("learner_client")

#: Extra seconds a blocking wait allows beyond the per-call deadline it wraps.
WAIT_MARGIN_S = 5.0


def _drop_completions_of_closed_loops(
    loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    """Report a loop's unhandled errors, less grpc's hand-offs to a closed loop.

    grpc.aio's poller gives every completion to whichever loop reads its socket first, and
    that loop forwards it to the call's own loop. A call of an earlier collector in this
    process (its channel closed, its call cancelled) can complete after that collector's
    loop closed; the forward then raises "Event loop is closed" here. Nothing waits on that
    call any more and grpc goes on with the next completions, so it is dropped (debug log).
    """
    error = context.get("exception")
    if (
        isinstance(error, RuntimeError)
        and str(error) == "Event loop is closed"
        and "PollerCompletionQueue._handle_events" in repr(context.get("handle"))
    ):
        log.debug("dropped a grpc completion for a closed event loop (an earlier collector's)")
        return
    loop.default_exception_handler(context)


class LoopThread:
    """An event loop running in a daemon thread.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str = "rlfleet-learner") -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_drop_completions_of_closed_loops)
        self._closed = False  # set as close() begins: no run or callback is taken after it
        # A run's check and its hand-over, atomic against close(): whatever was handed over
        # before close() is on the loop when its cancellation looks for tasks. Reentrant: a
        # shutdown() from a signal handler may run on the thread that holds it, mid hand-over.
        self._taking = threading.RLock()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the loop and wait for its result.

        Raises:
            ClosedError: The loop is closed, or closing.
            DeadlineError: It did not finish within ``timeout`` seconds (it is cancelled).
        """
        with self._taking:
            future = None
            if not self._closed:
                # RuntimeError: a signal handler's shutdown() on this thread closed it meanwhile.
                with contextlib.suppress(RuntimeError):
                    future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            if future is None:
                coro.close()
                raise ClosedError("the collector is shut down")
        return self._result(future, timeout)

    def _result(self, future: concurrent.futures.Future[T], timeout: float | None) -> T:
        try:
            if not done_within(future, timeout):
                raise concurrent.futures.TimeoutError
            return future.result(0)
        except concurrent.futures.TimeoutError as exc:
            if isinstance(exc, RlfleetError):  # the operation's own DeadlineError names its call
                raise
            future.cancel()
            raise DeadlineError(f"operation did not finish within {timeout} s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop soon; ignored once the loop is closed."""
        with self._taking, contextlib.suppress(RuntimeError):  # a loop that died: closed
            if not self._closed:  # close() closes the loop only once this is set
                self._loop.call_soon_threadsafe(fn, *args)

    def close(self, timeout: float) -> None:
        """Cancel every task, stop the loop and join the thread (idempotent, bounded)."""
        with self._taking:
            if self._closed:
                return
            if threading.current_thread() is self._thread:
                raise SessionStateError("LoopThread.close called from its own thread")
            self._closed = True  # a run from another thread now raises ClosedError at once
            cancelling = asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop)
        try:
            self._result(cancelling, timeout)
        except (DeadlineError, RuntimeError) as exc:
            log.warning("learner event loop did not wind down cleanly: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    async def _cancel_all(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._loop.shutdown_asyncgens()
        await self._loop.shutdown_default_executor()


async def settle(calls: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Await every call concurrently (on the loop); failures are returned, not raised."""
    return await asyncio.gather(*calls, return_exceptions=True)
