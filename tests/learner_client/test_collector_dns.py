"""GrpcCollector given one DNS name: every address is an actor, and newcomers are admitted.

The name resolves to several loopback addresses through a private ``/etc/hosts``
(``hosts_namespace``); the collector runs in a child process inside that
namespace, against real actor subprocesses listening on 127.0.0.1 and 127.0.0.2.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import free_port_on, start_actor
from hosts_namespace import HostsNamespace
from learner_fleet import start_actors

from learner_client import GrpcCollector

_COLLECT = """
import json, sys, time
from learner_client import GrpcCollector
port = int(sys.argv[1])
with GrpcCollector("dns:///actors.rlfleet.test:%d" % port, frames_per_batch=4,
                   dns_refresh_interval=0.2, connect_timeout=20) as collector:
    first = sorted(collector.worker_ids)
    print(json.dumps(first), flush=True)
    sys.stdin.readline()  # the test edits the hosts file, then says go
    deadline = time.monotonic() + 30
    while len(collector.worker_ids) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = set()
    for batch in collector:
        seen.update(batch["collector", "worker_id"].unique().tolist())
        if len(seen) == 2 or time.monotonic() > deadline:
            break
    print(json.dumps([sorted(collector.worker_ids), sorted(seen)]), flush=True)
"""


@pytest.mark.slow
def test_collector_follows_a_dns_name_as_actors_join(tmp_path) -> None:
    ips = ["127.0.0.1", "127.0.0.2"]
    port = free_port_on(ips)
    namespace = HostsNamespace(tmp_path, {"actors.rlfleet.test": ips[:1]})
    flags = ["--port", str(port), "--num-envs", "2", "--policy", "random"]
    with (
        start_actor(["--host", ips[0], "--worker-id", "4", *flags]),
        start_actor(["--host", ips[1], "--worker-id", "5", *flags]),
    ):
        child = subprocess.Popen(
            namespace.wrap([sys.executable, "-c", _COLLECT, str(port)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert json.loads(child.stdout.readline()) == [4]
            namespace.update({"actors.rlfleet.test": ips})
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=60)
        finally:
            child.kill()
        assert child.returncode == 0, err
    worker_ids, seen = json.loads(out.strip().splitlines()[-1])
    assert worker_ids == [4, 5]
    assert seen == [4, 5]


def test_collector_follows_a_dns_target_given_in_a_comma_separated_string(fleet) -> None:
    """``"dns:///name:port,host:port"`` is read entry by entry, the name watched as in a list."""
    dns, plain = fleet[0], fleet[1]
    for actors in (
        f"dns:///127.0.0.1:{dns.port},{plain.address}",
        f"{plain.address},dns:///127.0.0.1:{dns.port}",
    ):
        with GrpcCollector(actors, frames_per_batch=4, dns_refresh_interval=60) as collector:
            assert collector.worker_ids == [0, 1]
            watched = [w.target for w in collector._membership._watchers]
            assert watched == [f"dns:///127.0.0.1:{dns.port}"]


def test_collector_refuses_one_actor_at_two_addresses_naming_the_fix(fleet) -> None:
    """A name with both an A and an AAAA record lists each actor twice: the error says so."""
    twice = [fleet[0].address, f"localhost:{fleet[0].port}"]
    with pytest.raises(ValueError, match=r"worker_id 0 at .*one actor reached at each address"):
        GrpcCollector(twice, frames_per_batch=4)


@pytest.mark.long
def test_collector_refuses_two_actors_started_with_one_worker_id_naming_the_fix() -> None:
    flags = ["--worker-id", "9", "--num-envs", "2"]
    actors = start_actors([flags, flags])
    try:
        with pytest.raises(ValueError, match=r"worker_id 9 at .*start each with its own --worker"):
            GrpcCollector([a.address for a in actors], frames_per_batch=4)
    finally:
        for actor in actors:
            actor.close()
