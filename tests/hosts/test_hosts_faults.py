"""The fleet's network promises across hosts: silent cuts of an actor host and of the learner host.

Real actors run through their command line inside the actor hosts; the learner runs in
the learner host and dials them by name. A cut drops packets silently (no FIN, no RST),
as a dead switch port does: what is named, and when, comes from ``batch_timeout`` on the
learner and HTTP/2 keepalive (``common.config``: a ping every 20 s, 10 s to answer) on
the actor. Every test ends with the learner's books: nothing lost (``gaps``), nothing
delivered twice (each batch's fingerprint is unique), no actor restarted.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from on_hosts import HostActor, LearnerScript, start_actors_on
from testbed import TestBed

pytestmark = pytest.mark.hosts

PORT = 50051
METRICS_PORT = 9100
BATCH_TIMEOUT = 4.0
# HTTP/2 keepalive (common.config): a ping every 20 s, the connection closed 10 s after an
# unanswered one. A ghost learner is released within that, plus scheduling slack.
KEEPALIVE_BOUND = 20 + 10 + 10


def _actors(bed: TestBed, hosts: int = 2, *extra: str) -> list[HostActor]:
    args = ["--num-envs", "1", "--policy", "mlp", "--metrics-port", str(METRICS_PORT), *extra]
    specs = [
        (f"host{i}", ["--worker-id", str(i), "--seed", str(i), *args]) for i in range(1, hosts + 1)
    ]
    return start_actors_on(bed, [(host, [*a, "--port", str(PORT)]) for host, a in specs])


def _scrape(bed: TestBed, host: str) -> dict[str, float]:
    """The actor's Prometheus samples, read from inside its host."""
    code = (
        "import sys, urllib.request\n"
        "url = 'http://%s:%d/metrics' % (sys.argv[1], int(sys.argv[2]))\n"
        "print(urllib.request.urlopen(url, timeout=5).read().decode())"
    )
    process = bed.run(
        host,
        [sys.executable, "-c", code, host, str(METRICS_PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out = process.communicate(timeout=20)[0]
    samples = {}
    for line in out.splitlines():
        match = re.match(r"^(rlfleet_actor_[^ ]+) ([-+0-9.e]+)$", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


_LEARNER_HEAD = """
import hashlib
import gymnasium
from common.policies import make_policy
from learner_client import GrpcCollector, MissingWorkersError, WeightPushError

def fingerprint(batch):
    return hashlib.sha256(batch["observation"].numpy().tobytes()).hexdigest()

def books(collector, prints):
    stats = collector.stats()
    return {
        "gaps": stats["gaps"], "restarts": stats["restarts"], "discarded": stats["discarded"],
        "unique": len(set(prints)) == len(prints), "batches": len(prints),
    }

def policy():
    env = gymnasium.make("CartPole-v1")
    return make_policy("mlp", env.observation_space, env.action_space, hidden=(64, 64))
"""

_SYNC_CUT = (
    _LEARNER_HEAD
    + """
targets = sys.argv[1].split(",")
c = GrpcCollector(targets, frames_per_batch=16, sync=True, batch_timeout=float(sys.argv[2]),
                  call_timeout=float(sys.argv[2]))
prints = []
b = c.next(); prints.append(fingerprint(b))
say(sorted(set(b["policy_version"].flatten().tolist())))
wait()  # host1 is cut
t = time.monotonic()
try:
    c.next()
    say({"missing": None})
except MissingWorkersError as exc:
    say({"missing": exc.worker_ids, "seconds": time.monotonic() - t})
t = time.monotonic()
try:
    say({"applied": c.update_policy_weights_(policy())})
except WeightPushError as exc:
    say({"succeeded": {str(w): v for w, v in exc.succeeded.items()}, "failed": sorted(exc.failed),
         "seconds": time.monotonic() - t})
wait()  # host1 is healed
deadline = time.monotonic() + 120
while True:
    try:
        b = c.next()
        break
    except MissingWorkersError:
        if time.monotonic() > deadline:
            raise
prints.append(fingerprint(b))
versions = {str(w): sorted(set(b["policy_version"][i].flatten().tolist()))
            for i, w in enumerate(c.worker_ids)}
say({"versions": versions, "books": books(c, prints)})
c.shutdown()
"""
)


def test_hosts_sync_names_a_cut_actor_pushes_fail_there_and_it_returns_current(make_bed) -> None:
    bed = make_bed(2)
    actors = _actors(bed)
    learner = LearnerScript(
        bed, _SYNC_CUT, [",".join(a.target for a in actors), str(BATCH_TIMEOUT)]
    )
    assert learner.read() == [0]
    bed.cut("host1")
    learner.say()
    missing = learner.read()
    assert missing["missing"] == [1]  # named, within batch_timeout: no hang
    assert missing["seconds"] < BATCH_TIMEOUT + 2
    pushed = learner.read()
    assert pushed.get("failed") == [1], pushed  # never reported applied where it was not
    assert set(pushed["succeeded"]) == {"2"}, pushed
    version = pushed["succeeded"]["2"]
    assert pushed["seconds"] < BATCH_TIMEOUT + 2, pushed
    bed.heal("host1")
    learner.say()
    after = learner.read(timeout=180)
    # Every frame of the batch after the push acts with it: the healed actor caught up
    # before its frames counted, and the other's share of the abandoned round is gone.
    assert after["versions"] == {"1": [version], "2": [version]}, after
    assert after["books"]["gaps"] == 0
    assert after["books"]["restarts"] == 0
    assert after["books"]["unique"]
    learner.finish()


_SHORT_CUT = (
    _LEARNER_HEAD
    + """
targets = sys.argv[1].split(",")
c = GrpcCollector(targets, frames_per_batch=16, sync=True, batch_timeout=60.0,
                  call_timeout=float(sys.argv[2]))
prints = []
c.update_policy_weights_(policy())
b = c.next(); prints.append(fingerprint(b))
say(sorted(set(b["policy_version"].flatten().tolist())))
wait()  # host1 is cut, for less than batch_timeout: its stream stays open
try:
    say({"applied": c.update_policy_weights_(policy())})
except WeightPushError as exc:
    say({"succeeded": {str(w): v for w, v in exc.succeeded.items()}, "failed": sorted(exc.failed)})
wait()  # host1 is healed
b = c.next(); prints.append(fingerprint(b))
versions = {str(w): sorted(set(b["policy_version"][i].flatten().tolist()))
            for i, w in enumerate(c.worker_ids)}
say({"versions": versions, "books": books(c, prints), "reconnects": c.stats()["reconnects"]})
c.shutdown()
"""
)


def test_hosts_a_push_missed_in_a_cut_shorter_than_batch_timeout_is_caught_up(make_bed) -> None:
    """The cut ends before the stream is given up (no reconnection re-admits host1): the
    push it missed is re-sent once it answers, and the next sync batch acts with it alone."""
    bed = make_bed(2)
    actors = _actors(bed)
    learner = LearnerScript(bed, _SHORT_CUT, [",".join(a.target for a in actors), "3"])
    assert learner.read() == [1]
    bed.cut("host1")
    learner.say()
    pushed = learner.read()
    assert pushed.get("failed") == [1], pushed
    version = pushed["succeeded"]["2"]
    bed.heal("host1")
    learner.say()
    after = learner.read(timeout=120)
    assert after["versions"] == {"1": [version], "2": [version]}, after
    assert after["reconnects"] == 0, after  # caught up in the session that went on
    assert after["books"]["gaps"] == 0
    assert after["books"]["unique"]
    learner.finish()


_ASYNC_CUT = (
    _LEARNER_HEAD
    + """
targets = sys.argv[1].split(",")
c = GrpcCollector(targets, frames_per_batch=8, batch_timeout=float(sys.argv[2]))
prints, seen = [], set()
while seen != {1, 2}:
    b = c.next(); prints.append(fingerprint(b))
    seen.add(int(b["collector", "worker_id"].flatten()[0]))
say("both")
wait()  # host1 is cut
t = time.monotonic()
during = []
while time.monotonic() - t < 3 * float(sys.argv[2]):
    b = c.next(); prints.append(fingerprint(b))
    during.append([time.monotonic() - t, int(b["collector", "worker_id"].flatten()[0])])
say(during)
wait()  # host1 is healed
t = time.monotonic()
while True:
    b = c.next(); prints.append(fingerprint(b))
    if int(b["collector", "worker_id"].flatten()[0]) == 1:
        break
    if time.monotonic() - t > 120:
        raise SystemExit("worker_id 1 never came back")
say({"back_after": time.monotonic() - t, "books": books(c, prints)})
c.shutdown()
"""
)


def test_hosts_async_keeps_the_others_flowing_and_a_healed_actor_loses_nothing(
    make_bed,
) -> None:
    bed = make_bed(2)
    actors = _actors(bed)
    learner = LearnerScript(
        bed, _ASYNC_CUT, [",".join(a.target for a in actors), str(BATCH_TIMEOUT)]
    )
    assert learner.read() == "both"
    bed.cut("host1")
    learner.say()
    during = learner.read(timeout=60)
    late = [w for t, w in during if t > 1.0]  # what worker 1 had buffered may still come first
    assert late.count(2) >= 10, during  # the others keep flowing, no MissingWorkersError
    assert 1 not in late, during
    bed.heal("host1")
    learner.say()
    back = learner.read(timeout=180)
    assert back["books"]["gaps"] == 0, back
    assert back["books"]["restarts"] == 0, back
    assert back["books"]["unique"], back
    learner.finish()


_LEARNER_CUT = (
    _LEARNER_HEAD
    + """
targets = sys.argv[1].split(",")
c = GrpcCollector(targets, frames_per_batch=8, batch_timeout=float(sys.argv[2]))
prints, seen = [], set()
while seen != {1, 2}:
    b = c.next(); prints.append(fingerprint(b))
    seen.add(int(b["collector", "worker_id"].flatten()[0]))
say("both")
wait()  # the learner host is cut from every actor
errors, after = [], set()
t = time.monotonic()
while after != {1, 2}:
    try:
        b = c.next()
    except MissingWorkersError:
        errors.append(time.monotonic() - t)
        continue
    prints.append(fingerprint(b))
    if errors:
        after.add(int(b["collector", "worker_id"].flatten()[0]))
    if time.monotonic() - t > 300:
        raise SystemExit("the fleet never came back")
say({"errors": errors, "resumed_after": time.monotonic() - t, "books": books(c, prints)})
c.shutdown()
"""
)


_SLOW_LINK = (
    _LEARNER_HEAD
    + """
c = GrpcCollector(sys.argv[1].split(","), frames_per_batch=4096, batch_timeout=2.0)
prints = [fingerprint(c.next())]
say("first")
wait()  # the link is now slower than a batch per batch_timeout
errors, t = 0, time.monotonic()
while time.monotonic() - t < 40:
    try:
        prints.append(fingerprint(c.next()))
    except MissingWorkersError:
        errors += 1
say({"errors": errors, "batches": len(prints) - 1})
wait()  # the link is fast again
t = time.monotonic()
while time.monotonic() - t < 15:
    prints.append(fingerprint(c.next()))
say({"books": books(c, prints)})
c.shutdown()
"""
)


def test_hosts_a_link_slower_than_batch_timeout_loses_no_batch(make_bed) -> None:
    """A batch that takes longer on the wire than ``batch_timeout`` is cut at the deadline
    again and again (the stream reconnects); each reconnect grants credits anew, and the
    actor dropped unacknowledged batches to make room for new ones. It now stops at its
    ``max_credits`` awaiting their ack: once the link is fast, every batch arrives once."""
    bed = make_bed(1)
    (actor,) = _actors(bed, 1)
    learner = LearnerScript(bed, _SLOW_LINK, [actor.target])
    assert learner.read() == "first"
    bed.shape("host1", "1mbit")  # a 4096-frame CartPole batch (~420 kB) takes ~3.4 s
    learner.say()
    slow = learner.read(timeout=120)
    assert slow["errors"] >= 5, slow  # the deadline cut it again and again
    retained = _scrape(bed, "host1")["rlfleet_actor_batches_retained"]
    bed.shape("host1", None)
    learner.say()
    back = learner.read(timeout=120)
    assert retained <= 4, retained  # the actor's max_credits
    assert back["books"]["gaps"] == 0, back
    assert back["books"]["unique"], back
    assert back["books"]["batches"] >= slow["batches"] + 10, back
    learner.finish()


def _held(samples: dict[str, float]) -> bool:
    return samples.get('rlfleet_actor_session_state{state="held"}') == 1.0


def test_hosts_a_cut_learner_is_released_by_actors_that_pause_and_resume_it(make_bed) -> None:
    bed = make_bed(2)
    actors = _actors(bed)
    learner = LearnerScript(
        bed, _LEARNER_CUT, [",".join(a.target for a in actors), str(BATCH_TIMEOUT)]
    )
    assert learner.read() == "both"
    started = {a.host: _scrape(bed, a.host)["rlfleet_actor_start_time_seconds"] for a in actors}
    bed.cut("learner")
    cut_at = time.monotonic()
    learner.say()
    before = {a.host: _scrape(bed, a.host)["rlfleet_actor_batches_collected_total"] for a in actors}
    # Each actor notices the ghost learner (keepalive) and releases its session.
    freed = {}
    while len(freed) < len(actors) and time.monotonic() - cut_at < KEEPALIVE_BOUND + 10:
        for actor in actors:
            if actor.host not in freed and not _held(_scrape(bed, actor.host)):
                freed[actor.host] = time.monotonic() - cut_at
        time.sleep(0.5)
    assert len(freed) == len(actors), f"sessions still held {KEEPALIVE_BOUND + 10} s after a cut"
    assert max(freed.values()) < KEEPALIVE_BOUND, freed
    for actor in actors:  # paused on credits: at most its credit window (4) and one in progress
        now = _scrape(bed, actor.host)
        assert now["rlfleet_actor_batches_collected_total"] - before[actor.host] <= 4 + 1
        assert now["rlfleet_actor_start_time_seconds"] == started[actor.host]  # same process
    bed.heal("learner")
    result = learner.read(timeout=240)
    assert result["errors"], result  # the learner stopped waiting on its ghost actors
    assert result["errors"][0] < 2 * BATCH_TIMEOUT + 2, result
    assert result["books"]["gaps"] == 0, result
    assert result["books"]["restarts"] == 0, result
    assert result["books"]["unique"], result
    learner.finish()
