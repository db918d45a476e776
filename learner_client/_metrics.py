"""The learner's Prometheus metrics and :func:`serve_metrics`, which exposes them over HTTP.

Every ``GrpcCollector`` keeps a :class:`LearnerMetrics`: three histograms fed
where the events happen (the time user code waits for a batch, in the
rounds; the policy lag of each delivered batch, in the ledger; the duration
of each push, explicit or automatic, in the pusher) and, read only when
Prometheus scrapes, everything ``GrpcCollector.stats()`` already counts (frames,
batches, gaps and reconnects per worker, queue depth, workers by state). The
hooks cost a few microseconds per batch; nothing is served until
:func:`serve_metrics` asks for it.

Each learner rank serves its own metrics, about the actors it owns, with its ``rank`` and
``world_size`` as gauges; worker_ids never repeat across ranks, so per-worker series
add up over ranks. Labels stay bounded: ``worker_id`` is one of the fleet's actors, ``model_id``
one the learner pushed, ``result`` and ``state`` come from fixed sets. No label
ever names an actor's address.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.errors import ClosedError
from common.metrics import MetricsEndpoint, new_registry

__all__ = ["LearnerMetrics", "check_metrics_port", "serve_metrics"]

T = TypeVar("T")

_PREFIX = "rlfleet_learner_"
#: Buckets of policy lag, in versions.
LAG_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0)
#: Buckets of waits and pushes, in seconds: 100 µs to 2 min.
SECONDS_BUCKETS: tuple[float, ...] = (
    *(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1),
    *(0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0),
)


def check_metrics_port(port: object) -> None:
    """Refuse a ``metrics_port`` that is not None or an int in 0..65535."""
    if port is None:
        return
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"metrics_port must be an int or None, got {port!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics_port must be in 0..65535, got {port}")


class LearnerMetrics:
    """The metrics of one learner (one ``GrpcCollector``), in :attr:`registry`.

    Args:
        stats: ``GrpcCollector.stats``; its ``"both"`` view is read at every scrape.
    """

    def __init__(self, stats: Callable[..., Mapping[str, Any]]) -> None:
        self.registry: CollectorRegistry = new_registry()
        self.batch_wait = Histogram(
            _PREFIX + "batch_wait_seconds",
            "Seconds user code waited in the collector's iterator for the next batch.",
            buckets=SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.policy_lag = Histogram(
            _PREFIX + "policy_lag",
            "Policy versions between the latest push and the version that collected a batch.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.push_seconds = Histogram(
            _PREFIX + "push_seconds",
            "Seconds of one weight push to every target.",
            ["model_id"],
            buckets=SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.pushes = Counter(
            _PREFIX + "pushes",
            "Weight pushes by outcome (ok: every target applied it).",
            ["model_id", "result"],
            registry=self.registry,
        )
        self.registry.register(_StatsCollector(stats))
        self._endpoints: list[MetricsEndpoint] = []
        self._closed = False
        self._lock = threading.Lock()

    def endpoint(self, port: int, host: str) -> MetricsEndpoint:
        """Serve :attr:`registry` on ``host:port`` until :meth:`close`.

        Raises:
            ClosedError: :meth:`close` was called.
        """
        if port is None:
            raise TypeError("metrics_port must be an int, got None")
        check_metrics_port(port)
        with self._lock:
            if self._closed:
                raise ClosedError("the collector is shut down; its metrics are no longer served")
            endpoint = MetricsEndpoint(self.registry, host=host, port=port)
            self._endpoints.append(endpoint)
        return endpoint

    def waited_for(self, take: Callable[[], T]) -> T:
        """Call ``take`` (which blocks until a batch is ready) and observe how long it took."""
        started = time.monotonic()
        batch = take()
        self.batch_wait.observe(time.monotonic() - started)
        return batch

    def close(self) -> None:
        """Stop every endpoint; idempotent."""
        with self._lock:
            self._closed = True
            endpoints, self._endpoints = self._endpoints, []
        for endpoint in endpoints:
            endpoint.close()

    def record_push(self, model_id: str, seconds: float, *, ok: bool) -> None:
        """Count one push of ``model_id`` that took ``seconds`` (ok: every target applied it)."""
        self.push_seconds.labels(model_id).observe(seconds)
        self.pushes.labels(model_id, "ok" if ok else "failed").inc()


class _StatsCollector(Collector):
    """Counters and gauges read from ``GrpcCollector.stats("both")`` when Prometheus scrapes."""

    _PER_WORKER = (
        ("frames", "frames", "Frames received, per worker."),
        ("batches", "batches", "Batches received and delivered, per worker."),
        ("gap_batches", "gaps", "Batches known lost (seq gaps), per worker."),
        ("reconnects", "reconnects", "Collect streams re-opened after a failure, per worker."),
    )

    _RANK = (
        ("rank", "This learner's rank among the ranks sharing the fleet (0 when alone)."),
        ("world_size", "Learner ranks sharing the fleet (1 when alone)."),
    )

    _PUSH_ROUTES = (
        (
            "relayed_pushes",
            "Actors sent a push's bytes by another actor (a relay), not the learner.",
        ),
        (
            "relay_fallbacks",
            "Relayed actors whose bytes failed, sent them by the learner after all.",
        ),
        ("relay_bytes_saved", "Bytes the learner did not upload thanks to relays and catch-ups."),
        ("peer_catch_ups", "Returning actors sent the current weights by a peer."),
        ("striped_pushes", "Actor pushes striped over parallel streams, one part per stream."),
        ("shm_pushes", "Actor pushes read from a shared-memory segment on this host."),
        ("shm_batches", "Batches read from an actor's shared-memory segment on this host."),
        (
            "shm_batch_fallbacks",
            "Batches that could not be read from a segment (their actor then sends bytes).",
        ),
    )

    def __init__(self, stats: Callable[..., Mapping[str, Any]]) -> None:
        self._stats = stats
        # The highest value each counter was exported with, by stat key: stats() takes a
        # withdrawn batch (a kept sync batch dropped after a push) out of its counts, and
        # Prometheus reads a counter that goes down as a restart (rate() then spikes).
        self._highest: dict[str, float] = {}
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        """Per-worker counters, queue depth and workers by liveness, as of now."""
        stats = self._stats(workers="both")
        for name, key, documentation in self._PER_WORKER:
            family = CounterMetricFamily(_PREFIX + name, documentation, labels=["worker_id"])
            for stat, value in stats.items():
                worker, _, metric = stat.partition("/")
                if metric == key and worker.startswith("worker_"):
                    family.add_metric([worker.removeprefix("worker_")], self._count(stat, value))
            yield family
        yield GaugeMetricFamily(
            _PREFIX + "queue_batches",
            "Batches received and not yet taken by user code.",
            stats.get("queued_batches", 0),
        )
        for key, documentation in self._RANK:
            yield GaugeMetricFamily(_PREFIX + key, documentation, int(stats.get(key, 0)))
        for key, documentation in self._PUSH_ROUTES:
            count = self._count(key, int(stats.get(key, 0)))
            yield CounterMetricFamily(_PREFIX + key, documentation, count)
        workers = GaugeMetricFamily(
            _PREFIX + "workers", "Actors this learner owns, alive or down.", labels=["state"]
        )
        alive = int(stats.get("workers_alive", 0))
        workers.add_metric(["alive"], alive)
        workers.add_metric(["down"], int(stats.get("workers", 0)) - alive)
        yield workers

    def _count(self, key: str, value: float) -> float:
        """``value`` of the counter ``key``, never below what a scrape was already given."""
        with self._lock:
            value = max(value, self._highest.get(key, value))
            self._highest[key] = value
        return value


class Measured(Protocol):
    """A collector whose metrics can be served: a ``GrpcCollector``."""

    def _learner_metrics(self) -> LearnerMetrics:
        """The collector's :class:`LearnerMetrics` (its registry, closed with the collector)."""
        ...


def serve_metrics(collector: Measured, port: int, *, host: str = "0.0.0.0") -> MetricsEndpoint:
    """Serve ``collector``'s metrics at ``http://host:port/metrics`` until it shuts down.

    Example::

        collector = GrpcCollector(actors, frames_per_batch=1024, total_frames=-1)
        endpoint = serve_metrics(collector, 9400)   # http://<host>:9400/metrics
        print(endpoint.port)

    Args:
        collector: A ``GrpcCollector``.
        port: Port to bind; 0 picks a free one (``endpoint.port``).
        host: Address to bind; all interfaces by default, so Prometheus can reach it.

    Returns:
        The running endpoint; ``collector.shutdown()`` closes it (so does ``endpoint.close()``).

    Raises:
        ClosedError: The collector is shut down.
        OSError: The address cannot be bound.
    """
    return collector._learner_metrics().endpoint(port, host)
