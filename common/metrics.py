"""What actors and learners share for Prometheus: a registry to start from and its endpoint.

:func:`new_registry` gives a registry with the library's process, platform and
GC collectors and ``rlfleet_process_threads``. :class:`MetricsEndpoint` serves
one registry over HTTP at ``/metrics`` and nothing else.

Actors and learners expose their metrics on a port of their own, so a scraper
needs no gRPC, no TLS and no token, and the port can never leak anything but
metrics: every path other than ``/metrics`` is answered 404, every method
other than GET and HEAD 405. The exposition format is the one
``prometheus_client`` writes (text, or OpenMetrics when asked for; gzip when
accepted). Requests run on short-lived daemon threads: a connection is cut
once it is older than its deadline (a scraper that stalls or trickles its
request holds nothing for long), and once :data:`_MAX_CONNECTIONS` are open a
new one closes the oldest, so hostile clients cost a bounded number of threads
and sockets, never delay the caller, and never lock an honest scrape out.
Dropped and cut connections are not logged.

Example::

    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("demo_events", "Events seen.", registry=registry).inc()
    with MetricsEndpoint(registry, host="127.0.0.1", port=0) as endpoint:
        print(f"http://127.0.0.1:{endpoint.port}/metrics")
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.config import host_port

__all__ = ["METRICS_PATH", "MetricsEndpoint", "ThreadsCollector", "new_registry"]

#: The only path the endpoint answers.
METRICS_PATH = "/metrics"
# A connection is cut this long after it was accepted (and when it sends nothing for as long).
_REQUEST_TIMEOUT = 10.0
# Connections served at once; a newer one closes the oldest.
_MAX_CONNECTIONS = 64

_StartResponse = Callable[..., Any]
_App = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class ThreadsCollector(Collector):
    """``rlfleet_process_threads``: the process's OS threads."""

    def collect(self) -> Iterable[Metric]:
        """The thread count, read from ``/proc`` where there is one."""
        yield GaugeMetricFamily(
            "rlfleet_process_threads", "Threads of this process.", value=_thread_count()
        )


def _thread_count() -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


def new_registry() -> CollectorRegistry:
    """A registry with the library's process, platform and GC collectors and the thread count.

    Each actor and learner gets its own, so several in one process never share counters.
    """
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(ThreadsCollector())
    return registry


class _Server(ThreadingMixIn, WSGIServer):
    """Serves each connection on a thread, at most ``_MAX_CONNECTIONS`` for their deadline."""

    daemon_threads = True
    # socketserver's backlog of 5 dropped the SYNs of a burst of scrapes (the clients sent
    # them again only after 1, 3, 7... s); accepted ones are capped by _MAX_CONNECTIONS.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        # Accepted sockets by age, with their deadlines; a thread closes its own socket only
        # after taking it out under the lock, so a socket cut under the lock is still open.
        self._open: dict[socket.socket, float] = {}
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` on a thread of its own, cutting the oldest connection at the cap."""
        with self._open_lock:
            while len(self._open) >= _MAX_CONNECTIONS:
                oldest = next(iter(self._open))
                _cut(oldest)
                del self._open[oldest]
            self._open[request] = time.monotonic() + _REQUEST_TIMEOUT
        super().process_request(request, client_address)

    def service_actions(self) -> None:
        """Cut the connections past their deadline (called by ``serve_forever`` every poll)."""
        now = time.monotonic()
        with self._open_lock:
            for request in [r for r, deadline in self._open.items() if deadline <= now]:
                _cut(request)
                del self._open[request]

    def shutdown_request(self, request: Any) -> None:
        """Forget ``request``, then close it."""
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection dropped, stalled or cut is the client's doing: nothing is printed."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _cut(request: socket.socket) -> None:
    """Wake the thread serving ``request``: its reads end, its writes fail."""
    with contextlib.suppress(OSError):  # the client is gone already
        request.shutdown(socket.SHUT_RDWR)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = _REQUEST_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged: one every few seconds would drown the actor's log."""


def _only_metrics(app: _App) -> _App:
    def guarded(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /metrics is served here\n"]
        method = environ.get("REQUEST_METHOD")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        if method == "HEAD":  # GET's headers, no body (prometheus_client answers HEAD 405)
            body = app({**environ, "REQUEST_METHOD": "GET"}, start_response)
            getattr(body, "close", lambda: None)()
            return [b""]
        return app(environ, start_response)

    return guarded


class MetricsEndpoint:
    """Serve ``registry`` at ``http://host:port/metrics`` on a background thread.

    Starts serving on construction; :meth:`close` (idempotent) stops it and
    frees the port. A context manager.

    Args:
        registry: What to expose.
        host: Address to bind (``0.0.0.0`` in containers; IPv6 addresses work).
        port: Port to bind; 0 picks a free one (read it from :attr:`port`).

    Raises:
        OSError: The address cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, *, host: str, port: int) -> None:
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host.strip("[]"), port), _QuietHandler)
        except OSError as exc:  # the errno's text alone names neither the port nor the flag
            where = f"{host_port(host, port)} (--metrics-port)"
            raise OSError(exc.errno, f"cannot serve /metrics on {where}: {exc.strerror}") from None
        self._server.set_app(_only_metrics(make_wsgi_app(registry)))
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"rlfleet-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    def close(self) -> None:
        """Stop serving and release the port; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
