"""The learner's Prometheus endpoint (``serve_metrics``), scraped over HTTP from a collector
on live actors and read with prometheus_client's parser."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from helpers import ActorProcess
from learner_fleet import cartpole_policy
from prometheus_client.parser import text_string_to_metric_families

from common.errors import ClosedError
from learner_client import GrpcCollector, WeightPushError, _ledger, _rounds, serve_metrics


def scrape(port: int) -> tuple[str, dict[str, dict[tuple, float]]]:
    """The body of one scrape and ``{sample name: {sorted label items: value}}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return text, samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_learner_metrics_move_as_batches_flow_and_pushes_happen(
    fleet: list[ActorProcess],
) -> None:
    addresses = [actor.address for actor in fleet]
    with GrpcCollector(addresses, frames_per_batch=60, total_frames=-1, sync=True) as collector:
        port = serve_metrics(collector, 0).port
        _, before = scrape(port)
        assert value(before, "rlfleet_learner_batch_wait_seconds_count") == 0
        batches = iter(collector)
        for _ in range(3):
            next(batches)
        with pytest.raises(WeightPushError):  # worker 1 holds another architecture
            collector.update_policy_weights_(cartpole_policy())
        collector.update_policy_weights_(cartpole_policy(), worker_ids=[0, 2])
        for _ in range(3):
            next(batches)
        text, after = scrape(port)
        stats = collector.stats()
    for worker_id in ("0", "1", "2"):
        assert value(after, "rlfleet_learner_batches_total", worker_id=worker_id) == 6
        assert value(after, "rlfleet_learner_frames_total", worker_id=worker_id) == 6 * 20
        assert value(after, "rlfleet_learner_gap_batches_total", worker_id=worker_id) == 0
        assert value(after, "rlfleet_learner_reconnects_total", worker_id=worker_id) == 0
    assert sum(after["rlfleet_learner_frames_total"].values()) == stats["frames"]
    assert value(after, "rlfleet_learner_batch_wait_seconds_count") == 6
    assert value(after, "rlfleet_learner_batch_wait_seconds_sum") > 0
    assert value(after, "rlfleet_learner_policy_lag_count") == 6  # one per batch yielded
    assert value(after, "rlfleet_learner_pushes_total", model_id="policy", result="failed") == 1
    assert value(after, "rlfleet_learner_pushes_total", model_id="policy", result="ok") == 1
    assert value(after, "rlfleet_learner_push_seconds_count", model_id="policy") == 2
    assert value(after, "rlfleet_learner_queue_batches") >= 0
    for key in (
        "relayed_pushes",
        "relay_fallbacks",
        "relay_bytes_saved",
        "peer_catch_ups",
        "striped_pushes",
    ):
        assert value(after, f"rlfleet_learner_{key}_total") == stats[key]
    assert value(after, "rlfleet_learner_shm_pushes_total") == stats["shm_pushes"]
    assert sum(after["rlfleet_learner_workers"].values()) == 3
    assert value(after, "process_resident_memory_bytes") > 0
    # Bounded labels: workers by id, never by address.
    for actor in fleet:
        assert actor.address not in text
        assert f":{actor.port}" not in text
    with pytest.raises(urllib.error.URLError):  # shutdown closed the endpoint
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def _interrupted_once(function):
    """``function`` whose first call raises KeyboardInterrupt (a Ctrl-C)."""
    calls: list[int] = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return function(*args, **kwargs)

    return interrupted


def test_learner_counters_never_go_backwards_when_a_kept_batch_is_dropped(
    fleet: list[ActorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync on demand: a batch kept by a Ctrl-C and dropped after a push is taken out of
    stats()' counts; a scrape then read each worker's frames and batches lower than the
    scrape before (Prometheus reads a counter going down as a restart of the learner)."""
    monkeypatch.setattr(_rounds, "combine", _interrupted_once(_rounds.combine))
    addresses = [fleet[0].address, fleet[2].address]
    scrapes: list[dict[str, dict[tuple, float]]] = []
    with GrpcCollector(addresses, frames_per_batch=8, total_frames=-1, sync=True) as collector:
        port = serve_metrics(collector, 0).port
        withdrawn = _ledger.Ledger.withdrawn

        def scraped_after(
            ledger: _ledger.Ledger,
            frames_by_worker: dict[int, int],
            extra: dict[str, int] | None = None,
        ) -> None:
            withdrawn(ledger, frames_by_worker, extra)
            scrapes.append(scrape(port)[1])  # before the next batch is counted

        monkeypatch.setattr(_ledger.Ledger, "withdrawn", scraped_after)
        with pytest.raises(KeyboardInterrupt):
            collector.next()
        scrapes.append(scrape(port)[1])
        version = collector.policy_version + 1
        collector.update_policy_weights_(cartpole_policy(), version=version)
        collector.next()
        scrapes.append(scrape(port)[1])
        assert collector.stats()["discarded"] == 2
    kept, dropped, after = scrapes
    for name in ("rlfleet_learner_frames_total", "rlfleet_learner_batches_total"):
        for worker_id in ("0", "2"):
            read = [value(samples, name, worker_id=worker_id) for samples in (kept, dropped, after)]
            assert 0 < read[0] <= read[1] <= read[2], (name, worker_id, read)


def test_serve_metrics_exposes_a_running_collector_until_it_shuts_down(
    fleet: list[ActorProcess],
) -> None:
    collector = GrpcCollector([fleet[0].address], frames_per_batch=20, total_frames=40)
    try:
        endpoint = serve_metrics(collector, 0, host="127.0.0.1")
        assert sum(1 for _ in collector) == 2
        _, samples = scrape(endpoint.port)
        assert value(samples, "rlfleet_learner_batches_total", worker_id="0") == 2
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        collector.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=2)


def test_serve_metrics_raises_if_the_port_is_bad_or_the_collector_closed(
    fleet: list[ActorProcess],
) -> None:
    collector = GrpcCollector([fleet[0].address], frames_per_batch=20)
    try:
        for bad in (-1, 65536, 2**64 - 1, "9400", True, None):
            with pytest.raises((ValueError, TypeError), match="metrics_port"):
                serve_metrics(collector, bad)  # type: ignore[arg-type]
    finally:
        collector.shutdown()
    with pytest.raises(ClosedError):
        serve_metrics(collector, 0)


def test_each_exported_value_is_read_from_its_own_stat() -> None:
    """Every family reads its own key of ``stats()`` (distinct values, so a swap shows)."""
    from prometheus_client import CollectorRegistry

    from learner_client._metrics import _StatsCollector

    routes = {key: 100 + i for i, (key, _) in enumerate(_StatsCollector._PUSH_ROUTES)}
    stats = {
        **{"worker_0/frames": 11, "worker_0/batches": 5, "worker_0/gaps": 3},
        **{"worker_0/duplicates": 7, "worker_0/reconnects": 2, "queued_batches": 4},
        **{"rank": 1, "world_size": 2, "workers": 3, "workers_alive": 1},
        **routes,
    }
    registry = CollectorRegistry()
    registry.register(_StatsCollector(lambda workers: stats))
    read = registry.get_sample_value
    worker = {"worker_id": "0"}
    assert read("rlfleet_learner_frames_total", worker) == 11
    assert read("rlfleet_learner_batches_total", worker) == 5
    assert read("rlfleet_learner_gap_batches_total", worker) == 3  # not the duplicates
    assert read("rlfleet_learner_reconnects_total", worker) == 2
    assert read("rlfleet_learner_queue_batches") == 4
    assert (read("rlfleet_learner_rank"), read("rlfleet_learner_world_size")) == (1, 2)
    assert read("rlfleet_learner_workers", {"state": "alive"}) == 1
    assert read("rlfleet_learner_workers", {"state": "down"}) == 2
    for key, count in routes.items():
        assert read(f"rlfleet_learner_{key}_total") == count, key
