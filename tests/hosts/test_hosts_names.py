"""Names across hosts: a rebooted host rejoins under its name behind ``dns:///`` discovery, and
TLS with a bearer token works against certificates that name hosts, not 127.0.0.1."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from on_hosts import LearnerScript, start_actor_on, start_actors_on
from testbed import TestBed

pytestmark = pytest.mark.hosts

PORT = 50051
_ARGS = ["--num-envs", "1", "--policy", "random", "--port", str(PORT)]

_DNS = """
from learner_client import GrpcCollector, MissingWorkersError
c = GrpcCollector("dns:///actors:%d" % int(sys.argv[1]), frames_per_batch=8, batch_timeout=4,
                  dns_refresh_interval=0.5, connect_timeout=30)
seen = set()
while seen != {1, 2}:
    seen.add(int(c.next()["collector", "worker_id"].flatten()[0]))
say(sorted(c.worker_ids))
wait()  # host1 was rebooted (a new address) and its actor started again
deadline = time.monotonic() + 120
while True:
    try:
        b = c.next()
    except MissingWorkersError:
        b = None
    if b is not None and int(b["collector", "worker_id"].flatten()[0]) == 1:
        break
    if time.monotonic() > deadline:
        raise SystemExit("worker_id 1 never rejoined: %s" % c.stats())
stats = c.stats()
say({"worker_ids": sorted(c.worker_ids), "restarts": stats["restarts"],
     "shm_batches": stats["shm_batches"]})
c.shutdown()
"""


def test_hosts_a_rebooted_host_rejoins_under_its_name_behind_dns(make_bed) -> None:
    bed = make_bed(2)
    bed.alias("actors", ["host1", "host2"])
    start_actors_on(bed, [(f"host{i}", ["--worker-id", str(i), *_ARGS]) for i in (1, 2)])
    learner = LearnerScript(bed, _DNS, [str(PORT)])
    assert learner.read() == [1, 2]
    old = bed.address("host1")
    bed.reboot("host1")  # its actor is killed with it
    assert bed.address("host1") != old
    start_actor_on(bed, "host1", ["--worker-id", "1", *_ARGS])
    learner.say()
    rejoined = learner.read(timeout=180)
    assert rejoined["worker_ids"] == [1, 2], rejoined
    assert rejoined["shm_batches"] == 0, rejoined  # other hosts: every batch over the link
    learner.finish()


def _certificate(directory: pathlib.Path, hosts: list[str]) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate naming ``hosts`` (DNS names only: no IP address)."""
    cert, key = directory / "fleet.crt", directory / "fleet.key"
    names = ",".join(f"DNS:{h}" for h in hosts)
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1"),
            *("-subj", f"/CN={hosts[0]}", "-addext", f"subjectAltName={names}"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


_TLS = """
import grpc
from learner_client import GrpcCollector
from common.errors import RlfleetError
ca = open(sys.argv[1], "rb").read()
targets = sys.argv[2].split(",")
def collector(targets, token):
    return GrpcCollector(targets, frames_per_batch=8, connect_timeout=8, token=token,
                         channel_credentials=grpc.ssl_channel_credentials(root_certificates=ca))
with collector(targets, sys.argv[3]) as c:
    b = c.next()
    say(sorted(c.worker_ids))
for label, dial, token in (("by address", sys.argv[4].split(","), sys.argv[3]),
                           ("wrong token", targets, "not-the-token")):
    try:
        collector(dial, token).shutdown()
        say([label, "connected"])
    except RlfleetError as exc:
        say([label, type(exc).__name__])
"""


def test_hosts_tls_and_a_token_against_certificates_naming_the_hosts(make_bed, tmp_path) -> None:
    bed: TestBed = make_bed(2)
    cert, key = _certificate(tmp_path, ["host1", "host2"])
    token = "fleet-token-0123456789"
    tls = ["--tls-cert", str(cert), "--tls-key", str(key), "--token", token]
    start_actors_on(bed, [(f"host{i}", ["--worker-id", str(i), *_ARGS, *tls]) for i in (1, 2)])
    targets = ",".join(f"host{i}:{PORT}" for i in (1, 2))
    by_address = ",".join(f"{bed.address(f'host{i}')}:{PORT}" for i in (1, 2))
    learner = LearnerScript(bed, _TLS, [str(cert), targets, token, by_address])
    assert learner.read() == [1, 2]
    by_ip = learner.read(timeout=60)
    assert by_ip[0] == "by address"
    assert by_ip[1] != "connected"  # the certificates name hosts, not addresses
    wrong = learner.read(timeout=60)
    assert wrong[0] == "wrong token"
    assert wrong[1] != "connected"
    learner.finish()
