"""The actor's Prometheus metrics: what it collected, sent, was pushed and refused.

One :class:`ActorMetrics` per actor holds its own registry (so several actors
in one process never share counters) and is handed to the few collaborators
that count: the collection core records one line per batch, the Collect
stream counts sends, acks, credits and session ends, the servicer counts
errors and weight pushes, the auth interceptor counts refusals. What the
actor *is* right now (session state, credits held, policy versions, retained
batches, threads) is read when Prometheus scrapes, so it costs nothing in
between. The collection loop itself only takes two clock readings per env
step; its latency histograms are filled once per batch (:class:`BatchHistogram`).

Labels stay bounded: model ids are the configured ones (anything else is
``other``), methods are the service's, codes are gRPC status names, reasons
are the proto's end reasons. No label ever names a learner, peer or batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from actor_service._core._protocol import CollectionCore
from actor_service._serve._session import SessionBook
from common.errors import ActorUnavailableError
from common.metrics import new_registry
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = ["ActorMetrics", "BatchHistogram", "WatchedActor"]

#: Buckets of the per-step latencies (forward pass, env step): 10 µs to 2.5 s.
STEP_BUCKETS: tuple[float, ...] = (
    *(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3),
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
#: Buckets of whole-batch and weight-push durations: 1 ms to 2 min.
LONG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
#: Label value of a model id the actor does not hold (keeps cardinality bounded).
OTHER_MODEL = "other"
_SESSION_STATES = ("starting", "free", "held", "draining")
_PREFIX = "rlfleet_actor_"
# EndReason values and their label values (closed, budget_reached, draining, ...).
_END_REASONS = {
    value: name.removeprefix("END_REASON_").lower()
    for name, value in pb.EndReason.items()
    if value != pb.END_REASON_UNSPECIFIED
}


class WatchedActor(Protocol):
    """What the scrape-time gauges read of a serving actor (the runtime).

    ``book`` and ``core`` raise ``ActorUnavailableError`` while the actor starts
    (``core`` also once it stopped).
    """

    draining: bool

    @property
    def ready(self) -> bool:
        """Whether the core is built and the actor is not draining."""
        ...

    @property
    def busy(self) -> bool:
        """Whether a learner session is active or its last batch is being given up."""
        ...

    @property
    def book(self) -> SessionBook[Any]:
        """The session bookkeeping of this actor epoch."""
        ...

    @property
    def core(self) -> CollectionCore:
        """The collection core."""
        ...


class BatchHistogram(Collector):
    """A histogram fed a batch of observations at a time.

    ``prometheus_client.Histogram.observe`` costs about a microsecond; at two
    observations per env step that is measurable on a fast env. The
    collection loop instead writes its timings into an array and this class
    bins the whole array once per batch.

    Args:
        name: Metric name (with its unit suffix, e.g. ``_seconds``).
        documentation: Help text.
        buckets: Upper bounds, increasing (``+Inf`` is implied).
        registry: Where to register.
    """

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name, self._doc = name, documentation
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, samples: np.ndarray) -> None:
        """Add every value of ``samples`` (a 1-d float array)."""
        counts = np.bincount(
            np.searchsorted(self._bounds, samples, side="left"), minlength=len(self._counts)
        )
        total = float(samples.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def collect(self) -> Iterable[Metric]:
        """The histogram as Prometheus sees it (cumulative buckets)."""
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        bounds = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        yield HistogramMetricFamily(
            self._name,
            self._doc,
            buckets=list(zip(bounds, cumulative, strict=True)),
            sum_value=total,
        )


class ActorMetrics:
    """Every metric of one actor, in :attr:`registry`.

    Args:
        worker_id: The actor's worker id (on ``rlfleet_actor_info``).
        env_id: What it collects from (on ``rlfleet_actor_info``).
        model_ids: The models it holds; the only ``model_id`` label values besides ``other``.
    """

    def __init__(self, *, worker_id: int, env_id: str, model_ids: Sequence[str]) -> None:
        self.registry = new_registry()
        self._model_ids = frozenset(model_ids)
        self._info = {"worker_id": str(worker_id), "env": env_id}
        counter = self._counter
        # Collection: what the collection core and the Collect stream count.
        self.frames = counter("frames", "Frames (env transitions) collected.")
        self.env_steps = counter("env_steps", "Steps of the env pool (each steps every env once).")
        self.batches_collected = counter("batches_collected", "Batches collected.")
        self.batches_sent = counter("batches_sent", "Batches written to a learner (re-sends too).")
        self.sessions_ended = counter("sessions_ended", "Collect sessions ended.", "reason")
        self.batch_seconds = self._histogram("batch_collect_seconds", "Seconds per batch.")
        self.forward_seconds = BatchHistogram(
            _PREFIX + "policy_forward_seconds",
            "Seconds of one batched policy forward pass (per step).",
            STEP_BUCKETS,
            self.registry,
        )
        self.env_step_seconds = BatchHistogram(
            _PREFIX + "env_step_seconds",
            "Seconds of one env pool step.",
            STEP_BUCKETS,
            self.registry,
        )
        # Control: errors, refusals and weight pushes.
        self.rpc_errors = counter("rpc_errors", "Calls answered with an error.", "method", "code")
        self.auth_refusals = counter("auth_refusals", "Calls refused for their token.", "method")
        self.weight_pushes = counter(
            "weight_pushes", "Weight pushes by result (OK or a status).", "model_id", "result"
        )
        self.weight_push_bytes = counter("weight_push_bytes", "Weight bytes applied.", "model_id")
        self.weight_push_seconds = self._histogram(
            "weight_push_seconds",
            "Seconds from a push's header to its weights in force.",
            "model_id",
        )
        self.weight_push_pause_seconds = Histogram(
            _PREFIX + "weight_push_pause_seconds",
            "Seconds a push held the model lock for its swap (the generation pause).",
            ("model_id",),
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(_PREFIX + name, documentation, labels, registry=self.registry)

    def _histogram(self, name: str, documentation: str, *labels: str) -> Histogram:
        return Histogram(
            _PREFIX + name, documentation, labels, buckets=LONG_BUCKETS, registry=self.registry
        )

    def session_ended(self, reason: int | None) -> None:
        """Count a Collect session that ended for ``reason`` (an ``EndReason`` value).

        None: its stream broke before an end could be written (``broken``).
        """
        name = "broken" if reason is None else _END_REASONS.get(reason, "unspecified")
        self.sessions_ended.labels(name).inc()

    def model_label(self, model_id: str) -> str:
        """``model_id`` if the actor holds it, else ``other`` (a peer cannot add label values)."""
        return model_id if model_id in self._model_ids else OTHER_MODEL

    def record_batch(self, frames: int, step_seconds: np.ndarray, seconds: float) -> None:
        """Count one collected batch; called once per batch by the collection core.

        Args:
            frames: Frames in the batch.
            step_seconds: ``[steps, 2]``: forward-pass and env-step seconds of each step.
            seconds: Seconds the whole batch took.
        """
        self.frames.inc(frames)
        self.env_steps.inc(len(step_seconds))
        self.batches_collected.inc()
        self.batch_seconds.observe(seconds)
        self.forward_seconds.observe_many(step_seconds[:, 0])
        self.env_step_seconds.observe_many(step_seconds[:, 1])

    def watch(self, runtime: WatchedActor) -> None:
        """Report ``runtime``'s state (session, credits, versions) at every scrape."""
        self.registry.register(_RuntimeCollector(runtime, self._info))


class _RuntimeCollector(Collector):
    """Gauges read from the runtime when Prometheus scrapes."""

    def __init__(self, runtime: WatchedActor, info: dict[str, str]) -> None:
        self._rt = runtime
        self._info = info
        self._started = time.time()

    def collect(self) -> Iterable[Metric]:
        """Info, session state, credits, retention and policy versions, as of now."""
        p = _PREFIX
        info = GaugeMetricFamily(p + "info", "This actor (always 1).", labels=list(self._info))
        info.add_metric(list(self._info.values()), 1)
        yield info
        yield GaugeMetricFamily(p + "start_time_seconds", "Unix time it started.", self._started)
        state = _session_state(self._rt)
        states = GaugeMetricFamily(
            p + "session_state", "1 for the current state.", labels=["state"]
        )
        for name in _SESSION_STATES:
            states.add_metric([name], 1 if name == state else 0)
        yield states
        try:
            book = self._rt.book
        except ActorUnavailableError:  # still starting (perhaps already draining): no book yet
            book = None
        yield GaugeMetricFamily(
            p + "credits_outstanding",
            "Credits granted and not yet used.",
            book.credits if book else 0,
        )
        yield GaugeMetricFamily(
            p + "batches_retained",
            "Batches kept until acknowledged.",
            len(book.retained_seqs) if book else 0,
        )
        counters = (
            (
                "credits_granted",
                "Credits accepted from learners (after the cap).",
                "credits_granted",
            ),
            ("batches_acked", "Batches a learner acknowledged.", "batches_acked"),
            (
                "batches_dropped",
                "Batches retained for a learner that did not resume, dropped at the next open.",
                "batches_dropped",
            ),
        )
        for name, documentation, attribute in counters:
            value = getattr(book, attribute) if book else 0
            yield CounterMetricFamily(p + name, documentation, value)
        yield self._versions()

    def _versions(self) -> Metric:
        versions = GaugeMetricFamily(
            _PREFIX + "policy_version", "Policy version in force.", labels=["model_id"]
        )
        try:
            models = self._rt.core.models
        except ActorUnavailableError:  # starting or stopped: no versions to report
            return versions
        for model_id in models.model_ids:
            versions.add_metric([model_id], models.policy_version(model_id))
        return versions


def _session_state(runtime: WatchedActor) -> str:
    if runtime.draining:
        return "draining"
    if not runtime.ready:
        return "starting"
    return "held" if runtime.busy else "free"
