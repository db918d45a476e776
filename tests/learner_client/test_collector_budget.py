"""A finite run asks the actors for no frame the learner will not use: their own counters.

The frame budget handed to the mailbox shrinks after each batch (``_rounds.py``), so the
credits each actor accepts, and the batches it collects, are exactly the batches yielded;
but an async run waiting on a slow actor for its last batches asks an idle one for a spare.
"""

from __future__ import annotations

import pathlib
import time
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import ActorProcess, free_port, poll_until, start_actor
from learner_fleet import start_actors
from prometheus_client.parser import text_string_to_metric_families

from learner_client import GrpcCollector

_COUNTERS = ("rlfleet_actor_credits_granted_total", "rlfleet_actor_batches_collected_total")


@pytest.fixture(scope="module")
def metered() -> Iterator[list[tuple[ActorProcess, int]]]:
    """Two actors (2 envs each), each with its metrics port."""
    ports = [free_port(), free_port()]
    args = [
        ["--worker-id", str(w), "--num-envs", "2", "--seed", str(w), "--metrics-port", str(p)]
        for w, p in enumerate(ports)
    ]
    actors = start_actors(args)
    yield list(zip(actors, ports, strict=True))
    for actor in actors:
        actor.close()


def _scrape(port: int) -> dict[str, float]:
    """The actor's unlabelled samples by name, and its session state."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels or sample.labels == {"state": "free"}:
                samples[sample.name] = sample.value
    return samples


def _counts(metered: list[tuple[ActorProcess, int]]) -> list[tuple[float, ...]]:
    """Each actor's credits accepted and batches collected so far."""
    return [tuple(_scrape(port)[name] for name in _COUNTERS) for _, port in metered]


@pytest.mark.parametrize(
    ("sync", "prefetch", "total_frames"),
    [(False, None, 12), (False, 3, 8), (True, 1, 16)],
    ids=["async", "async-prefetch-3", "sync-prefetch-1"],
)
def test_a_finite_run_asks_the_actors_for_no_batch_beyond_the_budget(
    metered, sync, prefetch, total_frames
):
    """Async: 3 (then 2) batches of 4 frames in all; sync: 2 rounds of 4 frames an actor.
    Once the sessions ended, the actors accepted as many credits and collected as many
    batches as were yielded (none asked ahead for a batch past ``total_frames``)."""
    before = _counts(metered)
    with GrpcCollector(
        [actor.address for actor, _ in metered],
        frames_per_batch=8 if sync else 4,
        total_frames=total_frames,
        sync=sync,
        prefetch=prefetch,
    ) as collector:
        per_worker = {0: 0, 1: 0}
        for batch in collector:
            for worker_id in batch.get(("collector", "worker_id")).flatten().unique().tolist():
                per_worker[worker_id] += 1
    for _, port in metered:
        poll_until(lambda port=port: _scrape(port)["rlfleet_actor_session_state"] == 1)
    after = _counts(metered)
    asked = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    assert asked == [(per_worker[0],) * 2, (per_worker[1],) * 2]  # credits, batches
    assert sum(per_worker.values()) == (4 if sync else -(-total_frames // 4))


@pytest.mark.long
def test_a_finite_async_run_ends_without_waiting_for_a_slow_actor(metered):
    """Two fast actors and one taking ~8 s a batch: its credit held the last batch of the
    budget, so the fast actors idled and the run ended only when the slow batch came
    (TorchRL's ``MultiAsyncCollector`` takes its last batches from whichever worker is first).
    Every batch but the slow one's must come within seconds, and the budget still holds."""
    envs = str(pathlib.Path(__file__).parents[1] / "actor_service")
    slow = ["--env-factory", "rlfleet_test_envs:slow_cartpole", "--env-kwargs", '{"delay": 2.0}']
    with start_actor(
        ["--worker-id", "2", "--num-envs", "2", *slow], env={"PYTHONPATH": envs}
    ) as laggard:
        addresses = [actor.address for actor, _ in metered] + [laggard.address]
        with GrpcCollector(addresses, frames_per_batch=4, total_frames=24, sync=False) as c:
            started = time.monotonic()
            workers = [int(b["collector", "worker_id"].flatten()[0]) for b in c]
            took = time.monotonic() - started
            assert took < 6.0, f"the run waited {took:.1f} s for the slow actor"
            assert len(workers) == 6
            assert c.stats()["frames"] == 24
            assert 2 not in workers  # its one batch is still on its way
