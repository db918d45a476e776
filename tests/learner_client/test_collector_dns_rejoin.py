"""A host that comes back under a new address rejoins a ``dns:///`` collector as itself.

The name resolves through a private ``/etc/hosts`` (``hosts_namespace``) to loopback
addresses (127.0.0.1, .2, ...), each a "host" running one real actor process on one port.
worker_id 5 is first killed and started again at a new address (a rebooted host: the
name's answer swaps the old address for the new one), then started a second time at a
third address while the second is still listed and serving (refused), and finally its
serving copy is stopped with SIGSTOP while both stay listed (a cut host: no reset, the
connection just goes quiet), so the newcomer takes over once the old link is declared dead.
Each time worker_id 5 keeps its place: a counted restart, its frames acting with the
newest weights, no gap and nothing twice.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from helpers import free_port_on, start_actor
from hosts_namespace import HostsNamespace

_COLLECT = """
import json, os, sys, time
sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]
from learner_fleet import cartpole_policy
from learner_client import GrpcCollector
port = int(sys.argv[1])
c = GrpcCollector("dns:///actors.rlfleet.test:%d" % port, frames_per_batch=4,
                  dns_refresh_interval=0.2, connect_timeout=20, batch_timeout=2, call_timeout=2)
def say(value):
    print(json.dumps(value), flush=True)
def where(wid):
    return {a.worker_id: a.address for a in c.remote_collectors}.get(wid)
def until(check, what):
    deadline = time.monotonic() + 60
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("%s: %s %s" % (what, [where(w) for w in (4, 5)], c.stats()))
        c.next()
def follow(address):
    # Collect until worker_id 5 serves from ``address`` and a batch of it arrived there;
    # report the policy versions its frames acted with from then on.
    until(lambda: where(5) == address, "worker_id 5 never moved to " + address)
    versions = set()
    def arrived():
        b = c.next()
        ids = b["collector", "worker_id"].flatten()
        versions.update(b["policy_version"].flatten()[ids == 5].tolist())
        return bool((ids == 5).any())
    until(arrived, "no batch of worker_id 5 at " + address)
    stats = c.stats()
    say({"worker_ids": c.worker_ids, "address": where(5), "versions": sorted(versions),
         **{k: stats[k] for k in ("restarts", "gaps", "duplicates")}})
seen = set()
until(lambda: seen.update(c.next()["collector", "worker_id"].flatten().tolist()) or
      seen == {4, 5}, "never saw both actors")
c.update_policy_weights_(cartpole_policy())
version = c.policy_version
fresh = set()
def current():
    b = c.next()
    ids, v = b["collector", "worker_id"].flatten(), b["policy_version"].flatten()
    fresh.update(ids[v == version].tolist())
    return fresh == {4, 5}
until(current, "the push never reached both actors")
say({"version": version, "address": where(5)})
sys.stdin.readline()  # rebooted: the old address left the name, a new one joined
follow(sys.argv[3])
sys.stdin.readline()  # a second worker_id 5 is listed too, while the first serves
time.sleep(2)
for _ in range(4):
    c.next()
try:
    c.add_collectors([sys.argv[4]])
    refused = ""
except ValueError as exc:
    refused = str(exc)
say({"address": where(5), "refused": refused})
sys.stdin.readline()  # the serving one is cut (SIGSTOP), both stay listed
follow(sys.argv[4])
c.shutdown()
"""


@pytest.mark.slow
def test_a_rebooted_host_rejoins_under_its_worker_id_behind_dns(tmp_path) -> None:
    ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = free_port_on(ips)
    at = [f"{ip}:{port}" for ip in ips]
    name = "actors.rlfleet.test"
    namespace = HostsNamespace(tmp_path, {name: ips[:2]})
    flags = ["--port", str(port), "--num-envs", "1", "--policy", "mlp"]
    tests = str(pathlib.Path(__file__).parent)
    actors = [
        start_actor(["--host", ips[0], "--worker-id", "4", *flags]),
        start_actor(["--host", ips[1], "--worker-id", "5", *flags]),
    ]
    child = subprocess.Popen(
        namespace.wrap([sys.executable, "-c", _COLLECT, str(port), tests, at[2], at[3]]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def step() -> dict:
        line = child.stdout.readline()
        assert line, child.communicate(timeout=30)[1][-4000:]
        return json.loads(line)

    def go() -> None:
        child.stdin.write("go\n")
        child.stdin.flush()

    try:
        first = step()
        assert first["address"] == at[1]
        version = first["version"]
        assert version >= 1
        # A reboot: the process dies with its host, which comes back under a new address.
        actors[1].kill()
        actors.append(start_actor(["--host", ips[2], "--worker-id", "5", *flags]))
        namespace.update({name: [ips[0], ips[2]]})
        go()
        rebooted = step()
        assert rebooted == {
            "worker_ids": [4, 5],
            "address": at[2],
            "versions": [version],
            "restarts": 1,
            "gaps": 0,
            "duplicates": 0,
        }
        # A second worker_id 5 while the first is listed and serving: refused.
        actors.append(start_actor(["--host", ips[3], "--worker-id", "5", *flags]))
        namespace.update({name: [ips[0], ips[2], ips[3]]})
        go()
        both = step()
        assert both["address"] == at[2]
        assert "worker_ids must be unique across the fleet" in both["refused"]
        assert "worker_id 5" in both["refused"]
        # The race: the new address is listed while the old one still is, but is cut.
        os.kill(actors[2].process.pid, signal.SIGSTOP)
        go()
        cut = step()
        assert cut == {
            "worker_ids": [4, 5],
            "address": at[3],
            "versions": [version],
            "restarts": 2,
            "gaps": 0,
            "duplicates": 0,
        }
        _, err = child.communicate(timeout=30)
        assert child.returncode == 0, err[-4000:]
    finally:
        child.kill()
        child.wait(30)
        for pipe in (child.stdin, child.stdout, child.stderr):
            pipe.close()
        if len(actors) > 2:
            os.kill(actors[2].process.pid, signal.SIGCONT)
        for actor in actors:
            actor.close()
