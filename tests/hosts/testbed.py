"""Hosts on one machine: network namespaces on a bridge, with names, link rates and cuts.

A :class:`TestBed` makes a learner host and N actor hosts. Each is a network
namespace with one veth link to a private bridge, an address from RFC 2544's
benchmarking range 198.18.0.0/15 (198.18.0.0/24 on every bed: the addresses
live only inside the bed's namespaces, the machine's own stack holds none, so
nothing leaves the bed) and a name that every host resolves through
``/etc/netns/<ns>/hosts`` (``ip netns exec`` bind-mounts it over
``/etc/hosts``). A link may have a rate (``tc tbf`` on both ends of the veth,
so both directions are shaped); the learner's link is the fleet's shared
uplink. :meth:`TestBed.cut` drops a link silently (its bridge end goes down:
no FIN, no RST, no ICMP reaches the peer), :meth:`TestBed.heal` brings it
back, :meth:`TestBed.reboot` kills a host's processes and brings it back
under the same name with a new address, and :meth:`TestBed.run` starts a
process inside a host, under the host's name as its host name (so rlfleet sees each host as a
machine of its own, and shares memory only within one).

Everything made is named with ``rlfh`` and the creating process's pid:
:func:`sweep` removes what dead processes left behind, and every bed is
removed by :meth:`TestBed.close` (a context manager, an ``atexit`` hook and,
by hand, a SIGTERM/SIGINT handler). Needs root (CAP_NET_ADMIN);
:func:`unavailable` says why a bed cannot be made here.

By hand: ``python -m tests.hosts.testbed --hosts 3 --rate 1gbit`` makes a bed,
prints its hosts and waits for Enter (or a signal) before removing it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import ipaddress
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PREFIX", "Host", "TestBed", "sweep", "unavailable"]

PREFIX = "rlfh"
NETWORK = ipaddress.ip_network("198.18.0.0/24")  # inside 198.18.0.0/15 (RFC 2544)
_NETNS_ETC = pathlib.Path("/etc/netns")
_OWNED = re.compile(rf"^{PREFIX}-?(\d+)[-a-z]")
_RESOLV = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"  # no DNS query leaves a host


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _carries(host: Host) -> bool:
    """Whether both ends of the host's link are up and its bridge port forwards."""
    inside = _ip("-n", host.ns, "-o", "link", "show", "eth0", check=False).stdout
    outside = _ip("-o", "link", "show", host.link, check=False).stdout
    port = subprocess.run(
        ["bridge", "-o", "link", "show", "dev", host.link],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    return "state UP" in inside and "state UP" in outside and "state forwarding" in port


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30, check=True)


def unavailable() -> str | None:
    """Why no bed can be made here (one line), or None when namespaces work."""
    if os.geteuid() != 0:
        return "host test bed needs root (CAP_NET_ADMIN) for network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"host test bed needs the {tool!r} command (iproute2)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode:
            return f"the kernel refused a network namespace: {made.stderr.strip()}"
        link = _ip("link", "add", f"{PREFIX}{os.getpid()}q", "type", "bridge", check=False)
        if link.returncode:
            return f"the kernel refused a bridge: {link.stderr.strip()}"
        _ip("link", "del", f"{PREFIX}{os.getpid()}q", check=False)
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns`` and wait for them to go."""
    for _ in range(50):
        listed = _ip("netns", "pids", ns, check=False).stdout.split()
        if not listed:
            return
        for pid in listed:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)


def sweep(owner: int | None = None) -> list[str]:
    """Remove namespaces, links, ``/etc/netns`` entries and logs left by dead beds (or ``owner``).

    Returns:
        The names removed.
    """
    removed = []

    def stale(name: str) -> bool:
        match = _OWNED.match(name)
        if not match:
            return False
        pid = int(match.group(1))
        return pid == owner if owner is not None else not _alive(pid)

    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if stale(ns):
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if stale(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    if _NETNS_ETC.is_dir():
        for entry in _NETNS_ETC.iterdir():
            if stale(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(str(entry))
    for entry in pathlib.Path(tempfile.gettempdir()).glob(f"{PREFIX}*-logs"):
        if stale(entry.name):  # the logs of its processes (TestBed.logs)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
    return removed


@dataclasses.dataclass
class Host:
    """One host of a bed.

    Attributes:
        name: Its name, resolved by every host of the bed.
        ns: Its network namespace.
        address: Its address now (a reboot changes it).
        link: The bridge end of its veth (what :meth:`TestBed.cut` takes down).
        rate: Its link rate (``tc`` syntax, e.g. ``"1gbit"``), or None for unshaped.
        processes: What :meth:`TestBed.run` started in it.
    """

    name: str
    ns: str
    address: str
    link: str
    rate: str | None = None
    processes: list[subprocess.Popen[Any]] = dataclasses.field(default_factory=list)


class TestBed:
    """A learner host and ``hosts`` actor hosts on a bridge (see the module docstring).

    Args:
        hosts: Actor hosts, named ``host1`` … ``hostN``.
        rate: Every actor host's link rate (``tc`` syntax), or None.
        learner_rate: The learner host's link rate (the shared uplink), or None.

    Usage::

        with TestBed(hosts=2, rate="1gbit") as bed:
            actor = bed.run("host1", ["python", "-m", "actor_service", "--host", "host1"])
            bed.cut("host1")
            bed.heal("host1")
    """

    LEARNER = "learner"
    __test__ = False  # not a pytest test class

    def __init__(
        self, hosts: int = 2, *, rate: str | None = None, learner_rate: str | None = None
    ) -> None:
        if hosts < 1 or hosts > 200:
            raise ValueError(f"hosts must be 1 to 200, got {hosts}")
        self.tag = os.getpid()
        self.bridge = f"{PREFIX}{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self._aliases: dict[str, list[str]] = {}
        self._next_address = 1
        self._next_link = 0
        self._closed = False
        sweep()
        atexit.register(self.close)
        #: Where the processes started in its hosts log (removed with the bed).
        self.logs = pathlib.Path(tempfile.gettempdir()) / f"{PREFIX}{self.tag}-logs"
        self.logs.mkdir(exist_ok=True)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            self._add(self.LEARNER, learner_rate)
            for index in range(1, hosts + 1):
                self._add(f"host{index}", rate)
            self._write_names()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ making hosts

    def _take_address(self) -> str:
        address = NETWORK.network_address + self._next_address
        if address not in NETWORK or address == NETWORK.broadcast_address:
            raise RuntimeError(f"the bed's network {NETWORK} is full")
        self._next_address += 1
        return str(address)

    def _add(self, name: str, rate: str | None) -> Host:
        ns = f"{PREFIX}-{self.tag}-{name}"
        link = f"{PREFIX}{self.tag}x{self._next_link}"
        peer = f"{PREFIX}{self.tag}p{self._next_link}"
        self._next_link += 1
        host = Host(name=name, ns=ns, address=self._take_address(), link=link, rate=rate)
        self.hosts[name] = host
        _ip("netns", "add", ns)
        (_NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (_NETNS_ETC / ns / "resolv.conf").write_text(_RESOLV)
        (_NETNS_ETC / ns / "hosts").write_text("127.0.0.1 localhost\n")
        _ip("link", "add", link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{host.address}/{NETWORK.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        if rate is not None:
            self._shape(host, rate)
        return host

    def _shape(self, host: Host, rate: str) -> None:
        """tbf on both ends of the host's veth: both directions carry at most ``rate``."""
        burst = str(max(_bits(rate) // 8 // 100, 256 * 1024))  # 10 ms, and whole GSO packets
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "200ms"]
        _tc("qdisc", "replace", "dev", host.link, *tbf)
        subprocess.run(
            ["ip", "netns", "exec", host.ns, "tc", "qdisc", "replace", "dev", "eth0", *tbf],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )

    def _write_names(self) -> None:
        """Every host's ``/etc/hosts``, rewritten in place (running processes see the change)."""
        lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in self.hosts.values()]
        lines += [f"{self.hosts[h].address} {a}" for a, hs in self._aliases.items() for h in hs]
        text = "\n".join(lines) + "\n"
        for host in self.hosts.values():
            with (_NETNS_ETC / host.ns / "hosts").open("r+") as handle:
                handle.truncate(0)
                handle.write(text)

    # ------------------------------------------------------------------ faults

    def host(self, name: str) -> Host:
        """The host called ``name`` (KeyError naming the known hosts otherwise)."""
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in the bed (hosts: {sorted(self.hosts)})") from None

    def alias(self, name: str, hosts: Sequence[str]) -> None:
        """Let ``name`` resolve to every one of ``hosts`` (a DNS name over a fleet)."""
        for host in hosts:
            self.host(host)
        self._aliases[name] = list(hosts)
        self._write_names()

    def address(self, name: str) -> str:
        """The host's address now."""
        return self.host(name).address

    def cut(self, name: str) -> None:
        """Drop the host's link silently: its bridge end goes down, packets vanish both ways."""
        _ip("link", "set", self.host(name).link, "down")

    def heal(self, name: str) -> None:
        """Bring a cut link back, as a cable plugged in again and settled.

        Returns once both ends carry (the bridge port forwards, the host's ``eth0`` is up) and
        no host keeps a neighbour entry the cut left unresolved: such an entry fails its last
        probe shortly after the heal and takes the first new connection with it
        (``EHOSTUNREACH``), which is the cut's echo, not the heal.
        """
        host = self.host(name)
        _ip("link", "set", host.link, "up")
        deadline = time.monotonic() + 10
        while not _carries(host):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s link did not come back up within 10 s")
            time.sleep(0.01)
        for other in self.hosts.values():
            for state in ("incomplete", "failed"):
                _ip("-n", other.ns, "neigh", "flush", "dev", "eth0", "nud", state)

    def shape(self, name: str, rate: str | None) -> None:
        """Set the host's link rate now, both directions (None: unshaped); connections stay."""
        host = self.host(name)
        if rate is not None:
            self._shape(host, rate)
        elif host.rate is not None:
            _tc("qdisc", "del", "dev", host.link, "root")
            _ip("netns", "exec", host.ns, "tc", "qdisc", "del", "dev", "eth0", "root")
        host.rate = rate

    def reboot(self, name: str) -> Host:
        """Kill the host's processes and bring it back with the same name and a new address.

        Returns:
            The new host (its ``address`` differs; every host's name table follows).
        """
        old = self.host(name)
        for process in old.processes:
            _reap(process)
        _kill_inside(old.ns)
        _ip("netns", "del", old.ns, check=False)
        _ip("link", "del", old.link, check=False)
        del self.hosts[name]
        host = self._add(name, old.rate)
        self._write_names()
        return host

    def run(self, name: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host (``ip netns exec``); it is killed at :meth:`close`.

        ``popen`` goes to ``subprocess.Popen`` (stdout, stderr, env, text …). The process
        gets its own session, so killing it reaches its children too, and its own UTS
        namespace named after the host: hosts of the bed share the machine's kernel and
        ``/dev/shm``, and their names are what tells them apart as machines (rlfleet's host
        identity, so shared memory is used only within one host, as across real machines).
        """
        host = self.host(name)
        named = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', name]
        process = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *named, *argv], start_new_session=True, **popen
        )
        host.processes.append(process)
        return process

    def names(self) -> Mapping[str, str]:
        """``{name: address}`` of every host now."""
        return {h.name: h.address for h in self.hosts.values()}

    # ---------------------------------------------------------------- removing

    def close(self) -> None:
        """Kill every process the bed started and remove everything it made; idempotent."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            for process in host.processes:
                _reap(process)
        sweep(owner=self.tag)
        atexit.unregister(self.close)

    def __enter__(self) -> TestBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h.name}={h.address}" for h in self.hosts.values())
        return f"TestBed({hosts})"


def _reap(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def _bits(rate: str) -> int:
    """Bits per second of a ``tc`` rate such as ``"100mbit"`` or ``"1gbit"``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)bit", rate.strip().lower())
    if match is None:
        raise ValueError(f"rate must look like '100mbit' or '1gbit', got {rate!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def main(argv: Sequence[str] | None = None) -> int:
    """Make a bed, print its hosts, wait for Enter or a signal, remove it."""
    parser = argparse.ArgumentParser(prog="python -m tests.hosts.testbed", description=__doc__)
    parser.add_argument("--hosts", type=int, default=2, help="actor hosts (default 2)")
    parser.add_argument("--rate", default=None, help="each actor host's link rate, e.g. 1gbit")
    parser.add_argument("--learner-rate", default=None, help="the learner's link rate")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    bed = TestBed(args.hosts, rate=args.rate, learner_rate=args.learner_rate)

    def stop(signum: int, frame: object) -> None:
        bed.close()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for host in bed.hosts.values():
            print(f"{host.name:10} {host.address:15} ip netns exec {host.ns} ...", flush=True)
        print("Enter removes the bed.", flush=True)
        sys.stdin.readline()
    finally:
        bed.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
