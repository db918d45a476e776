"""A Ray cluster across the test bed's hosts: RayFleet on two nodes, and one node's link cut.

The Ray head runs in the learner host with a custom resource ``node_a`` and a second Ray
node joins from ``host1`` with ``node_b`` (``ray start --block`` from the Ray venv, each
node with a short temporary directory of its own and a token of the test's own). The
learner script is the Ray driver (a driver attaches on a node of the cluster, so it runs
in the head's host): it places a :class:`~learner_client.RayFleet` actor on each node by
resource, collects sync and async batches from both, and follows the fleet through a cut.

A cut of ``host1`` outlasts Ray's node health check (set short on the head): the collector
names worker 1 ``down`` (HTTP/2 keepalive) while worker 0 keeps flowing, and Ray declares
the node dead. Healed, the cut node's raylet learns it was declared dead and exits, taking
its actor server with it; Ray restarts the actor (``max_restarts``) once a node with
``node_b`` joins again, and the same collector takes worker 1's batches at its new address,
nothing delivered twice. Everything, Ray nodes included, is gone at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import poll_until
from on_hosts import LearnerScript
from testbed import TestBed

pytestmark = [pytest.mark.hosts, pytest.mark.ray]

pytest.importorskip("ray", reason="the Ray venv (make test-ray) runs the Ray cluster tests")

_ROOT = pathlib.Path(__file__).resolve().parents[2]
RAY = str(pathlib.Path(sys.executable).with_name("ray"))
GCS_PORT = 6379
BATCH_TIMEOUT = 4.0
# HTTP/2 keepalive (common.config): a ping every 20 s, 10 s to answer, plus scheduling slack.
KEEPALIVE_BOUND = 20 + 10 + 10
# Ray's node health check on the head: a 1 s check every second, dead after 10 failures.
HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "10",
}
DEAD_BOUND = 40  # seconds from the cut to Ray's verdict, on a loaded 2-core machine


class RayNodes:
    """The ``ray start --block`` processes of one test, their logs and temporary dirs."""

    def __init__(self, bed: TestBed) -> None:
        self.bed = bed
        self.token = secrets.token_hex(32)
        self.dirs: list[pathlib.Path] = []
        self.logs: dict[str, pathlib.Path] = {}

    def env(self) -> dict[str, str]:
        """What every Ray process of the cluster runs with (the head also reads HEALTH_CHECK)."""
        path = os.environ.get("PYTHONPATH", "")
        return {
            **os.environ,
            **HEALTH_CHECK,
            "PYTHONPATH": f"{_ROOT}{os.pathsep}{path}" if path else str(_ROOT),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
        }

    def start(self, host: str, resources: dict[str, float], *, head: bool) -> subprocess.Popen[Any]:
        """``ray start --block`` in ``host``, waiting for it to say the node runs."""
        temp_dir = pathlib.Path(tempfile.mkdtemp(prefix="rlfhray", dir="/tmp"))  # sockets: short
        self.dirs.append(temp_dir)
        log = temp_dir.with_suffix(".log")
        self.logs[host] = log
        argv = [RAY, "start", "--block", f"--node-ip-address={self.bed.address(host)}"]
        argv += ["--num-cpus=2", f"--resources={json.dumps(resources)}", f"--temp-dir={temp_dir}"]
        argv += ["--object-store-memory=100000000", "--disable-usage-stats"]
        if head:
            argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.bed.address(TestBed.LEARNER)}:{GCS_PORT}"]
        with log.open("w") as out:
            process = self.bed.run(
                host, argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(), cwd=_ROOT
            )
        poll_until(
            lambda: "Ray runtime started" in self.log(host) or process.poll() is not None,
            timeout=120,
            interval=0.2,
        )
        assert process.poll() is None, f"ray start in {host} exited: {self.log(host)[-3000:]}"
        return process

    def log(self, host: str) -> str:
        """What ``ray start`` in ``host`` printed so far."""
        return self.logs[host].read_text(errors="replace")

    def remove(self) -> None:
        """Remove the temporary dirs and logs (after the bed killed every process)."""
        for temp_dir in self.dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)
            temp_dir.with_suffix(".log").unlink(missing_ok=True)


@pytest.fixture
def ray_bed(make_bed: Any) -> Iterator[tuple[TestBed, RayNodes]]:
    """A bed with a learner host and ``host1``, and the Ray nodes the test starts in it."""
    bed = make_bed(1)
    nodes = RayNodes(bed)
    try:
        yield bed, nodes
    finally:
        bed.close()  # every process in the bed's hosts first: Ray writes in its dirs
        nodes.remove()


def _inside(bed: TestBed, host: str) -> list[str]:
    """The command lines of the processes in ``host`` now."""
    listed = subprocess.run(
        ["ip", "netns", "pids", bed.host(host).ns], capture_output=True, text=True, timeout=30
    ).stdout.split()
    lines = []
    for pid in listed:
        with contextlib.suppress(OSError):
            raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
            lines.append(raw.replace(b"\0", b" ").decode(errors="replace").strip())
    return lines


def _servers(bed: TestBed, *hosts: str) -> list[str]:
    """The actor servers running in ``hosts`` (every host of the bed if none)."""
    return [c for h in hosts or bed.hosts for c in _inside(bed, h) if "-m actor_service" in c]


_DRIVER = """
import hashlib, os
# Ray prints what its nodes report (a node declared dead...) on stdout: the lines go apart.
lines = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
def say(value):
    lines.write(json.dumps(value) + "\\n")
    lines.flush()
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=sys.argv[2], RAY_USAGE_STATS_ENABLED="0")
import ray
from ray._private import state as ray_state
from learner_client import GrpcCollector, RayFleet

head, batch_timeout = sys.argv[1], float(sys.argv[3])
ray.init(address="%s:%s" % (head, sys.argv[4]), _node_ip_address=head, log_to_driver=False)
t = time.monotonic()
while sum(n["Alive"] for n in ray.nodes()) < 2:
    assert time.monotonic() - t < 120, ray.nodes()
    time.sleep(0.5)

def nodes():
    return {n["NodeID"]: {"ip": n["NodeManagerAddress"], "alive": n["Alive"],
                          "resources": sorted(n["Resources"])} for n in ray.nodes()}

def table(fleet_ids):
    # The GCS actor table (ray.util.state reads the same through the dashboard, not run here).
    rows = {w: ray_state.actors(actor_id=a) for w, a in fleet_ids.items()}
    return {w: {"state": r["State"], "node": r["Address"]["NodeID"], "restarts": r["NumRestarts"]}
            for w, r in rows.items()}

def worker(b):
    return int(b["collector", "worker_id"].flatten()[0])

configs = [{"resources": {"node_a": 1}, "max_restarts": 1},
           {"resources": {"node_b": 1}, "max_restarts": 1}]
fleet = RayFleet(2, num_envs=1, seed=0, grace_period=1.0, remote_configs=configs).start()
ids = {w: h._actor_id.hex() for w, h in fleet.actor_handles.items()}
addresses = fleet.addresses
say({"nodes": nodes(), "actors": table(ids), "addresses": addresses})
with GrpcCollector(addresses, frames_per_batch=16, total_frames=48, sync=True) as c:
    say([[list(b.batch_size), sorted(set(b["collector", "worker_id"].flatten().tolist()))]
         for b in c])
"""

_FOLLOW = """
c = GrpcCollector(fleet, frames_per_batch=8, batch_timeout=batch_timeout, dns_refresh_interval=0.5)
prints, seen = [], set()
def take():
    b = c.next()
    prints.append(hashlib.sha256(b["observation"].numpy().tobytes()).hexdigest())
    return b
while seen != {0, 1}:
    seen.add(worker(take()))
node_b = table(ids)[1]["node"]
say("both")
wait()  # host1 is cut
t, during, down, dead, polled = time.monotonic(), [], None, None, 0.0
while down is None or dead is None or time.monotonic() - t < down + 5:
    assert time.monotonic() - t < 120, (during, c.worker_states, nodes())
    during.append([time.monotonic() - t, worker(take())])
    if down is None and c.worker_states[1] == "down":
        down = time.monotonic() - t
    if dead is None and time.monotonic() - polled > 0.5:
        polled = time.monotonic()
        dead = None if nodes()[node_b]["alive"] else polled - t
say({"during": during, "down": down, "dead": dead, "actors": table(ids)})
wait()  # host1 is healed; its old raylet gone, a new Ray node started there
t = time.monotonic()
while True:
    b = take()
    if worker(b) == 1 and c.stats()["restarts"] >= 1:
        break
    assert time.monotonic() - t < 120, ("worker 1 never came back", c.stats(), table(ids))
stats = c.stats()
say({"back_after": time.monotonic() - t, "address": c.remote_collectors[1].address,
     "fleet_address": fleet.addresses[1], "actors": table(ids), "nodes": nodes(),
     "books": {"duplicates": stats["duplicates"], "restarts": stats["restarts"],
               "unique": len(set(prints)) == len(prints), "batches": len(prints)}})
c.shutdown()  # the collector owns the fleet it was given: its Ray actors are killed
t = time.monotonic()
while {r["state"] for r in table(ids).values()} != {"DEAD"} and time.monotonic() - t < 30:
    time.sleep(0.2)
say({"actors": table(ids)})
ray.shutdown()
"""


def test_hosts_ray_fleet_on_two_nodes_collects_and_follows_a_cut_node_back(ray_bed) -> None:
    bed, ray = ray_bed
    ray.start(TestBed.LEARNER, {"node_a": 4}, head=True)
    old_node = ray.start("host1", {"node_b": 4}, head=False)
    head_ip, host1_ip = bed.address(TestBed.LEARNER), bed.address("host1")
    learner = LearnerScript(
        bed, _DRIVER + _FOLLOW, [head_ip, ray.token, str(BATCH_TIMEOUT), str(GCS_PORT)]
    )
    placed = learner.read(timeout=240)
    nodes, actors = placed["nodes"], placed["actors"]
    # Each actor is on the node whose resource it asked, and its server binds that node's IP.
    assert nodes[actors["0"]["node"]]["ip"] == head_ip, placed
    assert "node_a" in nodes[actors["0"]["node"]]["resources"], placed
    assert nodes[actors["1"]["node"]]["ip"] == host1_ip, placed
    assert "node_b" in nodes[actors["1"]["node"]]["resources"], placed
    assert [a.rsplit(":", 1)[0] for a in placed["addresses"]] == [head_ip, host1_ip], placed
    assert learner.read() == [[[2, 1, 8], [0, 1]]] * 3  # sync: both workers in every batch
    assert learner.read() == "both"  # async, the collector given the fleet itself
    bed.cut("host1")
    learner.say()
    cut = learner.read(timeout=180)
    late = [w for t, w in cut["during"] if t > 1.0]  # what worker 1 had buffered may come first
    assert 1 not in late, cut
    assert late.count(0) >= 10, cut  # worker 0 keeps flowing
    assert cut["down"] < KEEPALIVE_BOUND, cut  # the collector names worker 1 down
    assert cut["dead"] < DEAD_BOUND, cut  # Ray declares host1's node dead
    # Its actor waits for a node with node_b (none alive); worker 0's is untouched.
    assert cut["actors"]["1"]["state"] == "RESTARTING", cut
    assert cut["actors"]["0"] == actors["0"], cut
    bed.heal("host1")
    # Declared dead, the old raylet is refused when it reaches the head again, and ends with
    # its workers, the actor server among them.
    old_node.wait(timeout=120)
    poll_until(lambda: not _servers(bed, "host1"), timeout=30, message="a server outlived its node")
    ray.start("host1", {"node_b": 4}, head=False)  # what a node's supervisor does
    learner.say()
    back = learner.read(timeout=240)
    assert back["back_after"] < 60, back
    assert back["actors"]["1"]["state"] == "ALIVE", back
    assert back["actors"]["1"]["restarts"] == 1, back
    assert back["actors"]["1"]["node"] != actors["1"]["node"], back  # the new node on host1
    assert back["nodes"][back["actors"]["1"]["node"]]["ip"] == host1_ip, back
    assert back["address"] == back["fleet_address"] != placed["addresses"][1], back
    assert back["address"].startswith(f"{host1_ip}:"), back
    assert back["actors"]["0"] == actors["0"], back
    books = back["books"]
    assert books["duplicates"] == 0, back
    assert books["unique"], back  # nothing delivered twice
    assert learner.read() == {"actors": {"0": _dead(actors["0"]), "1": _dead(back["actors"]["1"])}}
    learner.finish()
    _assert_stops_clean(bed)


def _dead(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "state": "DEAD"}


def _assert_stops_clean(bed: TestBed) -> None:
    """No actor server is left; SIGTERM ends each Ray node with every process it started."""
    assert _servers(bed) == []
    for host in bed.hosts.values():
        for process in host.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    for name in bed.hosts:
        poll_until(
            lambda n=name: _inside(bed, n) == [],
            timeout=60,
            interval=0.5,
            message=f"processes left in {name}: {_inside(bed, name)}",
        )
