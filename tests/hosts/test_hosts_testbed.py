"""The test bed itself: names resolve on every host, a cut is silent, a reboot moves the address,
a link rate holds, and nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from testbed import PREFIX, TestBed

pytestmark = pytest.mark.hosts

_SERVE = """
import socket, sys
server = socket.create_server((sys.argv[1], 7000))
print("listening", flush=True)
conn, _ = server.accept()
total = 0
while chunk := conn.recv(1 << 20):
    total += len(chunk)
print(total, flush=True)
"""

_DIAL = """
import socket, sys, time
start = time.monotonic()
try:
    sock = socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2]))
except OSError as exc:
    print(type(exc).__name__, round(time.monotonic() - start, 2), flush=True)
    raise SystemExit(0)
payload = b"x" * int(sys.argv[3])
start = time.monotonic()
sock.sendall(payload)
sock.close()
print("sent", round(time.monotonic() - start, 3), flush=True)
"""


def _py(bed: TestBed, host: str, code: str, *args: str) -> subprocess.Popen[str]:
    return bed.run(host, [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)


def _leftovers(tag: int) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [n for n in (names + links).split() if n.startswith(PREFIX) and str(tag) in n]


def test_testbed_names_cut_reboot_and_cleanup(make_bed) -> None:
    bed = make_bed(2)
    looked_up = subprocess.run(
        ["ip", "netns", "exec", bed.host("host2").ns, "getent", "hosts", "host1", "learner"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert looked_up == [bed.address("host1"), "host1", bed.address("learner"), "learner"]
    named = bed.run("host2", ["hostname"], stdout=subprocess.PIPE, text=True)
    assert named.communicate(timeout=20)[0].strip() == "host2"  # a machine of its own
    server = _py(bed, "learner", _SERVE, "learner")
    assert server.stdout.readline().strip() == "listening"
    bed.cut("host1")
    # Silent: no RST, no refusal; the connect just times out. 2.9 s leaves the cut's last ARP
    # probe unanswered just before the heal: the first dial after it must still get through.
    dial = _py(bed, "host1", _DIAL, "learner", "2.9", "10")
    assert dial.communicate(timeout=20)[0].split()[0] == "TimeoutError"
    bed.heal("host1")
    dial = _py(bed, "host1", _DIAL, "learner", "5", "10")
    assert dial.communicate(timeout=20)[0].split()[0] == "sent"
    assert server.communicate(timeout=20)[0].strip() == "10"
    old = bed.address("host1")
    bed.reboot("host1")
    assert bed.address("host1") != old
    looked_up = subprocess.run(
        ["ip", "netns", "exec", bed.host("learner").ns, "getent", "hosts", "host1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert looked_up == [bed.address("host1"), "host1"]
    sleeper = bed.run("host2", ["sleep", "600"])
    (bed.logs / "host2-sleeper.log").write_text("a process's log\n")
    bed.close()
    assert sleeper.poll() is not None
    assert _leftovers(bed.tag) == []
    assert not bed.logs.exists()  # its processes' logs go with it


def test_testbed_link_rate_holds_in_both_directions(make_bed) -> None:
    bed = make_bed(1, rate="20mbit")
    for sender, receiver in (("host1", "learner"), ("learner", "host1")):
        server = _py(bed, receiver, _SERVE, receiver)
        assert server.stdout.readline().strip() == "listening"
        start = time.monotonic()
        dial = _py(bed, sender, _DIAL, receiver, "5", str(5_000_000))  # 40 Mbit: >= 2 s at 20
        assert dial.communicate(timeout=30)[0].split()[0] == "sent"
        assert server.communicate(timeout=30)[0].strip() == "5000000"
        elapsed = time.monotonic() - start
        assert 1.6 < elapsed < 6.0, f"{sender} -> {receiver}: {elapsed:.2f} s for 40 Mbit at 20"
