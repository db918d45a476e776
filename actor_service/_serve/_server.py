"""The actor's gRPC server: ActorService, health, reflection, TLS, auth and graceful drain.

:func:`create_server` builds an :class:`ActorServer` on ``grpc.aio`` (the sync
server starves health checks once streams fill its thread pool). It serves
``rlfleet.v1.ActorService``, ``grpc.health.v1.Health`` (``""`` and
``rlfleet.v1.ActorService`` are NOT_SERVING until the env pool and policy are
built, then SERVING) and server reflection; optionally a second plaintext port
with only health and reflection for probes that cannot do TLS; optionally
Prometheus metrics over HTTP on a port of their own (``metrics_port``). :func:`serve`
is what the CLI runs: start, print the ready line, and on SIGTERM/SIGINT drain
(health NOT_SERVING → no new batches → in-flight batch sent → streams end with
END_REASON_DRAINING → ``stop(grace)`` → env pool closed) and exit 0.

Example (a real server on a free port, for tests and notebooks)::

    with create_server(ActorConfig(port=0, num_envs=2)).run_in_thread() as handle:
        channel = grpc.insecure_channel(f"127.0.0.1:{handle.port}")
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from actor_service._config import ActorConfig
from actor_service._core._protocol import CollectionCore
from actor_service._core._settings import env_name
from actor_service._kinds.registry import core_factory as kind_core_factory
from actor_service._serve._auth import TokenAuthInterceptor
from actor_service._serve._limits import CallLimiter
from actor_service._serve._logging import log_event
from actor_service._serve._memory import keep_freed_memory
from actor_service._serve._metrics import ActorMetrics
from actor_service._serve._runtime import ActorRuntime
from actor_service._serve._servicer import ActorServicer
from actor_service._serve._wire import add_actor_service
from common.config import host_port, server_channel_options
from common.errors import SessionStateError
from common.metrics import MetricsEndpoint
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = [
    "SERVICE_NAME",
    "TEARDOWN_RESERVE",
    "ActorServer",
    "ServerThread",
    "create_server",
    "exit_now",
    "serve",
]

#: Full name of the actor service, as health and reflection report it.
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ActorService"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# No server-wide cap on concurrent RPCs: it counted health, reflection and
# ActorService calls alike, so idle Watch streams could starve probes and the
# learner. Each group is capped on its own instead (``_limits``, ``_servicer``).
_MAX_STREAMS_PER_CONNECTION = 32

#: Seconds of the grace period kept for the teardown after the drain (stopping the
#: servers, closing the env pool, exiting); half the grace period when that is less.
#: The in-flight batch gets what is left before it; one too slow for that is given up.
TEARDOWN_RESERVE = 1.0


class ActorServer:
    """One actor's gRPC server(s) over an :class:`ActorRuntime`.

    Lifecycle: ``await start()`` → serving → ``await stop(grace)``; or
    :meth:`run_in_thread` for a server on a background event loop.

    Args:
        config: The actor's settings.
        core_factory: Builds the collection core (by default the one
            :data:`~actor_service._kinds.registry.CORES` names for ``config.kind``).
    """

    def __init__(
        self,
        config: ActorConfig,
        core_factory: Callable[[ActorConfig], CollectionCore] | None = None,
    ) -> None:
        self.config = config
        self._core_factory = core_factory
        self.runtime: ActorRuntime | None = None
        self._servers: list[grpc.aio.Server] = []
        self._health: Any = None
        self.port: int | None = None
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self.metrics: ActorMetrics | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._stopped = False

    async def start(self) -> int:
        """Bind, serve (NOT_SERVING), build the env pool and policy, then report SERVING.

        Returns:
            The bound port of ActorService (a free one when ``config.port`` is 0).

        Raises:
            RuntimeError: A port cannot be bound.
            Exception: Whatever building the collection core raised.
        """
        if self.runtime is not None:
            raise SessionStateError("ActorServer.start called twice")
        log_event("actor.config", logging.INFO, **self.config.logged())
        if self.config.metrics_port is not None:
            self.metrics = ActorMetrics(
                worker_id=self.config.worker_id,
                env_id=env_name(self.config.env_pool),
                model_ids=[spec.model_id for spec in self.config.models],
            )
        factory = self._core_factory or kind_core_factory(self.config, self.metrics)
        self.runtime = ActorRuntime(self.config, factory, self.metrics)
        if self.metrics is not None:
            self.metrics.watch(self.runtime)
            self._metrics_endpoint = MetricsEndpoint(
                self.metrics.registry, host=self.config.host, port=self.config.metrics_port or 0
            )
            self.metrics_port = self._metrics_endpoint.port
        # grpc_health's stubs predate its asyncio servicer.
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        for name in ("", SERVICE_NAME):
            await self._health.set(name, _NOT_SERVING)
        main = self._new_server(actor=self.runtime)
        self.port = self._bind(main, self.config.port, secure=True)
        await main.start()
        if self.config.health_port is not None:
            probe = self._new_server(actor=None)
            self.health_port = self._bind(probe, self.config.health_port, secure=False)
            await probe.start()
        log_event(
            "actor.listening",
            logging.INFO,
            host=self.config.host,
            port=self.port,
            health_port=self.health_port,
            metrics_port=self.metrics_port,
            tls=bool(self.config.tls_cert),
            auth=bool(self.config.token),
        )
        await self.runtime.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, _SERVING)
        return self.port

    def _new_server(self, *, actor: ActorRuntime | None) -> grpc.aio.Server:
        """A server with health and reflection, and ``actor``'s ActorService unless None."""
        with_actor = actor is not None
        interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = [CallLimiter(self.metrics)]
        if with_actor and self.config.token:
            interceptors.append(TokenAuthInterceptor(self.config.token, self.metrics))
        options = [
            *server_channel_options(),
            ("grpc.max_concurrent_streams", _MAX_STREAMS_PER_CONNECTION),
        ]
        server = grpc.aio.server(options=options, interceptors=interceptors)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [health.SERVICE_NAME, reflection.SERVICE_NAME]
        if actor is not None:
            add_actor_service(ActorServicer(actor, self.metrics), server)
            names.insert(0, SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        self._servers.append(server)
        return server

    def _bind(self, server: grpc.aio.Server, port: int, *, secure: bool) -> int:
        host = self.config.host
        address = host_port(host, port)  # an IPv6 literal ("::1", "::") bracketed
        try:
            if secure and self.config.tls_cert:
                bound = server.add_secure_port(address, self._credentials())
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise RuntimeError(
                f"cannot bind {address} (in use by another process, or not an address of this "
                f"host): {exc}"
            ) from None
        if bound == 0:
            raise RuntimeError(f"cannot bind {address}")
        return bound

    def _credentials(self) -> grpc.ServerCredentials:
        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ca = read(self.config.tls_client_ca) if self.config.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(read(self.config.tls_key), read(self.config.tls_cert))],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    @property
    def ready(self) -> bool:
        """Whether the actor serves (core built, not draining)."""
        return self.runtime is not None and self.runtime.ready

    async def stop(self, grace: float | None = None, *, since: float | None = None) -> None:
        """Drain and stop: NOT_SERVING, end streams with DRAINING, stop servers, close the pool.

        Idempotent. All of it ends ``grace`` seconds (``config.grace_period`` by default)
        after ``since`` (a ``time.monotonic()`` reading: the signal's; now by default).
        The drain and the servers' stop get that but the last :data:`TEARDOWN_RESERVE`
        seconds (at most half of ``grace``); closing the env pool may use the reserve
        but its last quarter, left for the metrics endpoint and the process's exit.
        """
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.grace_period if grace is None else grace
        began = time.monotonic() if since is None else since
        deadline = began + grace
        reserve = min(TEARDOWN_RESERVE, grace / 2)

        def left(until: float) -> float:
            return max(0.0, until - time.monotonic())

        log_event("actor.draining", logging.INFO, grace=grace)
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self.runtime is not None:
            await self.runtime.drain(timeout=left(deadline - reserve))
        await asyncio.gather(*(s.stop(left(deadline - reserve)) for s in self._servers))
        if self.runtime is not None:
            await self.runtime.close(left(deadline - reserve / 4))
        if self._metrics_endpoint is not None:
            await asyncio.to_thread(self._metrics_endpoint.close)
        log_event("actor.stopped", logging.INFO, seconds=round(time.monotonic() - began, 3))

    async def wait(self) -> None:
        """Wait until every server terminated."""
        await asyncio.gather(*(s.wait_for_termination() for s in self._servers))

    def run_in_thread(self, timeout: float = 60.0) -> ServerThread:
        """Start this server on an event loop in a background thread.

        Args:
            timeout: Seconds to wait for SERVING.

        Returns:
            A handle with ``port`` and ``stop()``; also a context manager.
        """
        return ServerThread(self, timeout)


class ServerThread:
    """An :class:`ActorServer` running on its own event loop in a daemon thread.

    Args:
        server: The server to run.
        timeout: Seconds to wait until it is SERVING.

    Raises:
        Exception: Whatever :meth:`ActorServer.start` raised.
    """

    def __init__(self, server: ActorServer, timeout: float = 60.0) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        # Held by the stop under way: a second stop (another thread's, __exit__'s) waits for it
        # instead of stopping the loop under it (the server was left serving, its envs open).
        self._stop_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._loop.run_forever,
            daemon=True,
            name=f"rlfleet-actor-{server.config.worker_id}",
        )
        self._thread.start()
        try:
            self.port: int = self.call(server.start(), timeout)
        except BaseException:
            self.stop(0)
            raise

    def call(self, coroutine: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self, grace: float = 1.0) -> None:
        """Stop the server (drain within ``grace``) and its loop; idempotent, from any thread.

        A call while another thread's stop is under way returns once that stop ended.
        """
        with self._stop_lock:
            if not self._thread.is_alive():
                return
            with contextlib.suppress(Exception):
                self.call(self.server.stop(grace), timeout=grace + 30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_server(
    config: ActorConfig, core_factory: Callable[[ActorConfig], CollectionCore] | None = None
) -> ActorServer:
    """Build (not start) the actor server for ``config``.

    Args:
        config: The actor's settings.
        core_factory: Builds the collection core (by default the one
            :data:`~actor_service._kinds.registry.CORES` names for ``config.kind``).
    """
    return ActorServer(config, core_factory)


def serve(config: ActorConfig) -> int:
    """Run an actor until SIGTERM or SIGINT, then drain and stop within the grace period.

    Prints ``rlfleet-actor ready worker_id=<id> port=<port>`` on stdout once SERVING.
    The process should end with :func:`exit_now` (the CLI's does): the interpreter's
    own teardown would add 0.3-1.5 s after the grace period.

    Args:
        config: The actor's settings.

    Returns:
        0 after a graceful stop, 1 if the actor failed to start.

    Raises:
        RuntimeError: Called off the main thread, which alone may handle signals
            (``create_server(config).run_in_thread()`` serves from any thread).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "serve() stops on SIGTERM/SIGINT, and only the main thread may handle signals: "
            "call it from the main thread, or serve from this one with "
            "create_server(config).run_in_thread() (stop it with .stop())"
        )
    import torch

    torch.set_num_threads(config.torch_threads)
    keep_freed_memory()  # pushes reuse the pages of the last one
    code = asyncio.run(_serve(config))
    # A hung env step would keep the collection thread, and so the process, alive.
    busy = [t for t in threading.enumerate() if t.name.startswith("rlfleet-collect")]
    for thread in busy:
        thread.join(timeout=1.0)
    if any(t.is_alive() for t in busy):
        log_event("actor.exit_forced", logging.WARNING, threads=len(busy))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once :func:`serve` returned: exit handlers, flush, exit.

    Skips the interpreter's finalization (freeing torch's and gRPC's modules and
    objects: 0.3-1.5 s on a loaded machine), which would otherwise come after the
    grace period. Exit handlers still run (logging is flushed, multiprocessing's
    finalizers release what the env pool registered).
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def _serve(config: ActorConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signalled: list[float] = []

    def on_signal() -> None:
        if not signalled:  # the grace period counts from the first signal
            signalled.append(time.monotonic())
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    server = create_server(config)
    starting = asyncio.create_task(server.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await server.stop(0)
        return 0
    if starting.exception() is not None:
        exc = starting.exception()
        log_event("actor.start_failed", logging.ERROR, error=repr(exc))
        await server.stop(0)
        return 1
    print(f"rlfleet-actor ready worker_id={config.worker_id} port={server.port}", flush=True)
    await stopping
    await server.stop(config.grace_period, since=signalled[0])
    return 0
