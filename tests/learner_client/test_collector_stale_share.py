"""A sync round abandoned for a missing actor leaks none of its shares past a weight push.

The actor that did deliver its share of the abandoned round collected it with the old
weights; once the learner pushes new ones, the batch after the push must hold only
frames acted with them (docs/collector.md, "On-policy by default"). One actor is
stopped with SIGSTOP (no reset: its connection just goes quiet) for the round and the
push, then continued.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import poll_until
from learner_fleet import cartpole_policy, start_actors
from tensordict import TensorDictBase

from learner_client import GrpcCollector, MissingWorkersError, WeightPushError

pytestmark = pytest.mark.long

_ARGS = ["--num-envs", "1", "--policy", "mlp"]


def test_sync_batch_after_a_push_holds_no_share_of_a_round_abandoned_before_it() -> None:
    actors = start_actors([["--worker-id", "0", *_ARGS], ["--worker-id", "1", *_ARGS]])
    stopped = actors[1]
    collector = GrpcCollector(
        [a.address for a in actors],
        frames_per_batch=16,
        sync=True,
        batch_timeout=3,
        call_timeout=3,
    )
    try:
        first = collector.next()
        assert bool((first["policy_version"] == 0).all())
        os.kill(stopped.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(MissingWorkersError) as missing:
            collector.next()
        assert missing.value.worker_ids == [1]
        assert time.monotonic() - started < 3 + 2
        with pytest.raises(WeightPushError) as pushed:
            collector.update_policy_weights_(cartpole_policy())
        assert set(pushed.value.failed) == {1}
        assert set(pushed.value.succeeded) == {0}
        version = pushed.value.succeeded[0]
        os.kill(stopped.process.pid, signal.SIGCONT)
        (batch,) = poll_until(lambda: _next_or_none(collector), timeout=60)
        versions = sorted(set(batch["policy_version"].flatten().tolist()))
        assert versions == [version], f"policy versions in the batch after the push: {versions}"
        assert collector.stats()["discarded"] >= 1
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
        collector.shutdown(timeout=5)
        for actor in actors:
            actor.close()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_an_actor_that_missed_a_push_in_an_outage_its_stream_outlived_catches_up(sync) -> None:
    """Stopped for less than ``batch_timeout`` (its stream stays open: no re-admission), an
    actor misses a push; once it runs again the learner re-sends it what it lacks, and a
    sync batch holds no frame of the older weights (docs/reliability.md, across hosts)."""
    actors = start_actors([["--worker-id", "0", *_ARGS], ["--worker-id", "1", *_ARGS]])
    stopped = actors[1]
    collector = GrpcCollector(
        [a.address for a in actors], frames_per_batch=16, sync=sync, batch_timeout=60,
        call_timeout=2,
    )  # fmt: skip
    try:
        collector.update_policy_weights_(cartpole_policy(action=0))
        collector.next()
        os.kill(stopped.process.pid, signal.SIGSTOP)
        with pytest.raises(WeightPushError) as pushed:
            collector.update_policy_weights_(cartpole_policy(action=1))
        assert set(pushed.value.failed) == {1}
        version = pushed.value.succeeded[0]
        os.kill(stopped.process.pid, signal.SIGCONT)
        if sync:
            batch = collector.next()
            versions = sorted(set(batch["policy_version"].flatten().tolist()))
            assert versions == [version], f"policy versions in the batch after the push: {versions}"
        held = poll_until(
            lambda: collector.actor_state(1)["models"]["policy"]["version"] == version or None,
            timeout=20,
            interval=0.2,
        )
        assert held
        assert collector.worker_states[1] == "streaming"
        assert collector.stats()["reconnects"] == 0  # caught up in the session that went on
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
        collector.shutdown(timeout=5)
        for actor in actors:
            actor.close()


def _next_or_none(collector: GrpcCollector) -> list[TensorDictBase] | None:
    try:
        return [collector.next()]
    except MissingWorkersError:
        return None  # the continued actor is still being re-admitted
