"""A learner and its actors on a ``/dev/shm`` that is full, or too small for their segments.

Each run is a real fleet (``LocalFleet``) and collector in a private mount namespace whose
``/dev/shm`` is a tmpfs of its own (``unshare --mount``, as root), so the host's is never
filled. Whatever does not fit goes as bytes: every batch arrives once, every push is
applied, and each process says so in one warning, not one per batch or push.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)

#: Mounts a tmpfs of size $0 on /dev/shm, in the mount namespace unshare made, then runs "$@".
_OWN_DEV_SHM = 'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"'

#: The learner: fills /dev/shm first when argv[1] is "full", then collects 6 batches of 400
#: frames from 2 actors, pushing weights after each; prints what it saw as JSON.
_RUN = r"""
import json, logging, os, sys
import gymnasium
from common.policies import make_policy
from learner_client import GrpcCollector, LocalFleet

warned = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warned.append(record.getMessage())
logging.getLogger().addHandler(handler)
if sys.argv[1] == "full":
    fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError:
        os.close(fd)
env = gymnasium.make("CartPole-v1")
policy = make_policy("mlp", env.observation_space, env.action_space, hidden=(64, 64))
with LocalFleet(2, "CartPole-v1", num_envs=2, seed=0, grace_period=1.0) as fleet:
    with GrpcCollector(fleet.addresses, frames_per_batch=400, total_frames=2400) as collector:
        versions = [collector.update_policy_weights_(policy) for _batch in collector]
        stats = collector.stats()
    tails = [fleet.stderr_tail(w) for w in range(2)]
left = sorted(n for n in os.listdir("/dev/shm") if n.startswith("rlfleet-shm-"))
print(json.dumps({"stats": stats, "versions": [sorted(v.values()) for v in versions],
                  "warned": warned, "tails": tails, "left": left}))
"""


def run_on_own_dev_shm(size: str, mode: str) -> dict:
    """What :data:`_RUN` saw, run in ``mode`` on a ``/dev/shm`` of ``size`` of its own."""
    own_dev_shm = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _OWN_DEV_SHM]
    run = subprocess.run(
        [*own_dev_shm, size, sys.executable, "-c", _RUN, mode],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_nothing_lost(seen: dict) -> None:
    stats = seen["stats"]
    assert stats["batches"] == 6
    assert (stats["gaps"], stats["duplicates"]) == (0, 0)
    assert seen["versions"] == [[v, v] for v in range(1, 7)]  # both actors, every push
    assert seen["left"] == []  # no segment left behind, half-written or whole


@pytest.mark.long
def test_a_full_dev_shm_before_the_run_sends_everything_as_bytes():
    """The probe segment that finds local actors could not be written: the collector used
    to fail to start with a bare OSError (ENOSPC) from inside its Describe."""
    seen = run_on_own_dev_shm("1m", "full")
    assert_nothing_lost(seen)
    stats = seen["stats"]
    assert stats["shm_batches"] + stats["shm_pushes"] == 0
    assert len(seen["warned"]) == 1, seen["warned"]
    assert "as bytes" in seen["warned"][0]


@pytest.mark.long
def test_a_dev_shm_too_small_for_batches_and_pushes_is_warned_of_once():
    """Local actors (the probe fits) whose batches and pushes do not: the actors used to warn
    at every batch, the learner twice at every push."""
    seen = run_on_own_dev_shm("12k", "small")
    assert_nothing_lost(seen)
    stats = seen["stats"]
    assert (stats["shm_batches"], stats["shm_pushes"], stats["shm_fallbacks"]) == (0, 0, 12)
    assert len(seen["warned"]) == 1, seen["warned"]
    assert "No space left on device" in seen["warned"][0]
    for tail in seen["tails"]:
        warnings = [line for line in tail.splitlines() if "WARNING" in line]
        assert len(warnings) == 1, warnings
        assert "a batch goes to the learner as bytes" in warnings[0]
