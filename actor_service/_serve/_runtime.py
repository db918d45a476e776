"""What one actor process holds while it serves: the collection core, its thread, sessions, drain.

:class:`ActorRuntime` holds the collection core (a
:class:`~actor_service._core.CollectionCore`, built off the event loop by the
factory the server picked, since building it starts the env pool or loads the
model), the single collection thread every call that steps or reseeds the core
runs on (so those calls never overlap and never block the event loop), the
:class:`~actor_service._serve._session.SessionBook` of the actor epoch, the one
active ``Collect`` stream, and the draining flag set on SIGTERM. The gRPC
servicer and server are thin layers over it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from actor_service._config import ActorConfig
from actor_service._core._protocol import CollectionCore
from actor_service._serve._logging import log_event
from actor_service._serve._metrics import ActorMetrics
from actor_service._serve._session import SessionBook
from actor_service._serve._shm import BatchSegments
from common.errors import ActorBusyError, ActorUnavailableError

__all__ = ["SHUTDOWN_REAP_BOUND", "ActiveSession", "ActorRuntime", "Caller"]

#: Seconds beyond the grace period within which a stopping actor has reaped every
#: child it started, even when an env step hangs: closing the pool gets what is
#: left of the grace period (at least 0.1 s); if the collection thread is stuck,
#: the env subprocesses are killed (SIGKILL, 1 s each to be reaped) and the
#: process exits after 1 s more (the multiprocessing resource tracker exits
#: once its last client is gone).
SHUTDOWN_REAP_BOUND = 5.0

T = TypeVar("T")


class ActiveSession(Protocol):
    """What the runtime uses of the active ``Collect`` session (``CollectSession``)."""

    active: bool
    learner_id: str

    @property
    def collecting(self) -> bool: ...

    def take_over(self, *, by_its_learner: bool = False) -> None: ...
    def drain(self, close_by: float | None = None) -> None: ...
    async def wait_collector_idle(self) -> None: ...
    async def wait_finished(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who makes a call that changes what a session collects (a push, a state load, a reseed).

    Attributes:
        learner_id: The learner's id from the call's metadata; None when it names none
            (an older learner, a tool): such a call is judged as before, by the token alone.
        take_over: The learner takes sessions over (``take_over``).
    """

    learner_id: str | None = None
    take_over: bool = False


class ActorRuntime:
    """The actor's serving state, shared by every RPC handler on one event loop.

    Args:
        config: The actor's settings.
        core_factory: Builds the collection core from the config (the server picks
            it); called once, on the collection thread.
        metrics: What the ``Collect`` streams count into; None counts nothing.
    """

    def __init__(
        self,
        config: ActorConfig,
        core_factory: Callable[[ActorConfig], CollectionCore],
        metrics: ActorMetrics | None = None,
    ) -> None:
        self.config = config
        self._core_factory = core_factory
        self.metrics = metrics  # None when the actor serves no metrics
        self.started_at = time.monotonic()
        self._core: CollectionCore | None = None
        self._book: SessionBook[Any] | None = None
        # One thread for everything that steps, resets or reseeds the env pool.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"rlfleet-collect-{config.worker_id}"
        )
        self.current: ActiveSession | None = None
        # Seq of the last batch collected in this epoch; written on the collection thread only.
        self.last_collected_seq = 0
        self.draining = False
        self._closed = False
        self._open_lock = asyncio.Lock()
        self._batch_segments: BatchSegments | None = None

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Build the collection core (env pool or chat slots, models) on the collection thread."""
        core = await self.run_collect(self._core_factory, self.config)
        self._book = SessionBook(epoch=core.epoch, max_credits=self.config.max_credits)
        self._core = core
        log_event("actor.ready", logging.INFO, epoch=core.epoch, num_envs=core.num_slots)

    @property
    def ready(self) -> bool:
        """Whether the core is built and the actor is not draining."""
        return self._core is not None and not self.draining and not self._closed

    def require_core(self) -> CollectionCore:
        """The collection core, once it is built and while the actor runs.

        Raises:
            ActorUnavailableError: The core is still being built, or the actor stopped.
        """
        if self._core is None or self._closed:
            raise ActorUnavailableError(
                f"actor {self.config.worker_id} is {'stopped' if self._closed else 'starting'}"
            )
        return self._core

    @property
    def core(self) -> CollectionCore:
        """The collection core (as :meth:`require_core`, which raises while it is unavailable)."""
        return self.require_core()

    @property
    def book(self) -> SessionBook[Any]:
        """The session bookkeeping of this actor epoch.

        Raises:
            ActorUnavailableError: The core is still being built.
        """
        if self._book is None:
            raise ActorUnavailableError(f"actor {self.config.worker_id} is starting")
        return self._book

    def batch_segments(self) -> BatchSegments | None:
        """Where batches for a learner on this host go; None with shared memory off."""
        if not self.config.shared_memory or self._closed:
            return None
        if self._batch_segments is None:
            # At most max_credits batches are unacked (one starts only while fewer are
            # retained); two more for leftovers of batches a resume let go (removed first).
            self._batch_segments = BatchSegments(self.config.max_credits + 2)
        return self._batch_segments

    async def run_collect(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the collection thread and wait for it without blocking the loop."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    async def reseed(self, seed: int, static_seed: bool) -> tuple[int, int]:
        """Seed the core between two batches.

        Returns:
            ``(next_seed, first_seq)``: the seed to chain to the next actor, and the
            seq of the first batch collected after the seeding (every batch with a
            lower seq ran with the old seed). Both are read on the collection thread,
            so no batch can slip between the seeding and the count.
        """
        core = self.core

        def seed_now() -> tuple[int, int]:
            return core.set_seed(seed, static_seed), self.last_collected_seq + 1

        return await self.run_collect(seed_now)

    async def run_side(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` (weight loading, describe, decoding) off the loop, beside collection."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -------------------------------------------------------------- sessions

    async def acquire(
        self,
        stream: ActiveSession,
        *,
        take_over: bool,
        learner_id: str,
        resume_epoch: int,
        peer: str,
    ) -> None:
        """Make ``stream`` the active session, ending or refusing the current one.

        A learner may replace only its own session (same ``learner_id``, resuming
        this epoch: its old stream may be half-open); ending another learner's
        session needs ``take_over``, an explicit choice logged as a warning.
        Waits for the previous session's in-flight batch to be given up, so the
        core is never driven by two sessions at once.

        Raises:
            ActorUnavailableError: The actor is starting or draining.
            ActorBusyError: Another learner's session is active and ``take_over`` is false.
        """
        async with self._open_lock:
            self._check_open()
            previous = self.current
            if previous is not None and previous.active:
                own = previous.learner_id == learner_id and resume_epoch == self.book.epoch
                if own:
                    log_event("session.reconnected", logging.INFO, learner=learner_id, peer=peer)
                elif take_over:
                    log_event(
                        "session.taken_over",
                        logging.WARNING,
                        old=previous.learner_id,
                        new=learner_id,
                        peer=peer,
                    )
                else:
                    raise ActorBusyError.held(
                        self.config.worker_id, previous.learner_id, "resumes only its own session"
                    )
                previous.take_over(by_its_learner=own)
            if previous is not None:
                await previous.wait_collector_idle()
            self._check_open()
            self.current = stream
            stream.active = True

    def check_caller(self, caller: Caller, call: str) -> None:
        """Refuse ``call`` (``"pushes weights"``, ...) of a learner while another's session holds.

        While a learner's session is in force, only that learner changes the weights,
        state or seeds it collects with, as only it holds the session: another learner's
        call is refused as its ``open`` is, unless it takes sessions over.

        Raises:
            ActorBusyError: Another learner's session is in force.
        """
        current = self.current
        if caller.learner_id is None or caller.take_over or current is None:
            return
        if current.active and current.learner_id != caller.learner_id:
            rule = f"{call} only on an actor no other learner's session holds"
            raise ActorBusyError.held(self.config.worker_id, current.learner_id, rule)

    def _check_open(self) -> None:
        if self.draining or self._closed:
            raise ActorUnavailableError(f"actor {self.config.worker_id} is draining")
        self.require_core()

    @property
    def busy(self) -> bool:
        """Whether a learner session is active, or its last batch is still being given up."""
        current = self.current
        return current is not None and (current.active or current.collecting)

    async def drain(self, timeout: float) -> None:
        """Refuse new sessions and end the active one with END_REASON_DRAINING.

        The in-flight batch is finished and sent first. Returns when the stream
        ended or after ``timeout`` seconds.
        """
        self.draining = True
        stream = self.current
        if stream is None or not stream.active:
            return
        # Half the budget is the most its status waits for the learner to close (a learner
        # that never does, an older build's, is answered before the drain gives up on it).
        stream.drain(close_by=time.monotonic() + timeout / 2)
        try:
            await asyncio.wait_for(stream.wait_finished(), timeout)
        except TimeoutError:
            log_event("actor.drain_timeout", logging.WARNING, timeout=timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Close the core (env pool, subprocesses) once the collection thread is idle.

        If the collection thread is still busy after ``timeout`` seconds (a hung env
        step), the env subprocesses are killed instead, so none outlives the actor.
        """
        if self._closed:
            return
        self._closed = True
        core = self._core
        if core is not None:
            try:
                await asyncio.wait_for(self.run_collect(core.close), max(0.1, timeout))
            except TimeoutError:
                killed = await asyncio.to_thread(core.force_close)
                log_event(
                    "actor.children_killed",
                    logging.WARNING,
                    processes=killed,
                    reason="the collection thread is stuck (a hung env step?)",
                )
            except Exception as exc:  # a failing close must not keep the process alive
                log_event("actor.close_failed", logging.ERROR, error=repr(exc))
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._batch_segments is not None:
            self._batch_segments.close()
