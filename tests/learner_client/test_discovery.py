"""DNS discovery: target parsing, expansion to one actor per address, and watching joins/leaves.

The real ``getaddrinfo`` path is tested with ``localhost`` and, for names with
several addresses, in a private mount namespace whose ``/etc/hosts`` maps one
name to several loopback addresses (``hosts_namespace``); real actors listen
on those addresses in the end-to-end test.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
import sys
import threading

import pytest
from helpers import free_port_on, poll_until, start_actor
from hosts_namespace import HostsNamespace

from common.config import DEFAULT_PORT
from common.errors import ActorUnavailableError, SessionStateError
from learner_client import _discovery
from learner_client._discovery import (
    DnsChange,
    DnsMembership,
    DnsWatcher,
    getaddrinfo_resolver,
    is_dns_target,
    parse_dns_target,
    resolve_actors,
)

# Child processes load the module by path: importing the learner_client package would
# import the collector and torch, seconds per child for nothing this file tests.
_IMPORT_DISCOVERY = (
    "import importlib.util, sys; "
    f"_spec = importlib.util.spec_from_file_location('discovery', {_discovery.__file__!r}); "
    "sys.modules['discovery'] = importlib.util.module_from_spec(_spec); "
    "_spec.loader.exec_module(sys.modules['discovery'])\n"
)


class FakeResolver:
    """A resolver whose answer the test changes; records the names it was asked for."""

    def __init__(self, *ips: str) -> None:
        self.ips = list(ips)
        self.error: Exception | None = None
        self.asked: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if self.error is not None:
            raise self.error
        return list(self.ips)


# ------------------------------------------------------------------ targets


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("dns:///actors.rlfleet.svc:50051", ("actors.rlfleet.svc", 50051)),
        ("dns:actor:7000", ("actor", 7000)),
        ("dns:///actor", ("actor", DEFAULT_PORT)),
        ("  dns:///actor:1  ", ("actor", 1)),
        ("dns:///[::1]:9", ("::1", 9)),
        ("dns:///10.0.0.7:9", ("10.0.0.7", 9)),
        ("DNS:///actor:9", ("actor", 9)),  # gRPC's schemes are case-blind: was one channel
    ],
)
def test_parse_dns_target_accepts_grpc_forms(target: str, expected: tuple[str, int]) -> None:
    assert is_dns_target(target)
    assert parse_dns_target(target) == expected


@pytest.mark.parametrize(
    "target",
    [
        "actor:50051",
        "dns:",
        "dns:///",
        "dns:///actor:0",
        "dns:///actor:70000",
        "dns:///a b:1",
        "dns:///actor:port",
        "dns://8.8.8.8/actor:50051",
        "dns:////actor:1",
    ],
)
def test_parse_dns_target_raises_if_malformed(target: str) -> None:
    with pytest.raises(ValueError, match=r"dns|port|authorit"):
        parse_dns_target(target)


def test_is_dns_target_is_false_for_plain_addresses() -> None:
    assert not is_dns_target("10.0.0.1:50051")
    assert not is_dns_target("[::1]:50051")


@pytest.mark.parametrize(
    ("address", "hint"),
    [
        ("::1:50051", r"'\[::1\]:port' for an IPv6 address"),
        ("http://127.0.0.1:50051", "not a URL"),
        ("127.0.0.1:1,[::1]:50051", "one address per entry"),
        ("unix:/run/actor.sock:1", "TCP only"),
        ("h\u00e9t\u00e9:50051", "xn-- form"),
        ("127.0.0.1 :50051", "a bracketed IPv6 address$"),
        ("a" * 254 + ":50051", "a bracketed IPv6 address$"),
    ],
)
def test_an_address_grpc_cannot_dial_is_refused_at_once_naming_the_fix(
    address: str, hint: str
) -> None:
    """gRPC took each, then failed after connect_timeout with "Misformatted domain name"."""
    with pytest.raises(ValueError, match=hint):
        resolve_actors([address])


def test_every_form_grpc_dials_is_an_actor_address() -> None:
    forms = ["10.0.0.1:1", "[::1]:2", "ipv4:127.0.0.1:3", "ipv6:[::1]:4", "ipv6:///[::1]:5"]
    forms += ["actor-0.actors.ns.svc.cluster.local:50051", "a" * 253 + ":6"]
    forms += ["actor.example.com.:7", "[fe80::1%eth0]:8", "ipv6:[::1%lo]:9"]  # no search; zones
    assert resolve_actors(forms) == forms


# ------------------------------------------------------------ resolve_actors


def test_resolve_actors_keeps_a_plain_list_as_is() -> None:
    actors = ["10.0.0.2:50051", "10.0.0.1:50051", "actor-host:7"]
    resolver = FakeResolver("127.0.0.1")
    assert resolve_actors(actors, resolver=resolver) == actors
    assert resolver.asked == []


def test_resolve_actors_splits_a_comma_separated_string() -> None:
    assert resolve_actors("a:1, b:2") == ["a:1", "b:2"]


def test_resolve_actors_expands_every_address_sorted_and_deduplicated() -> None:
    resolver = FakeResolver("10.0.0.10", "10.0.0.9", "::1", "10.0.0.9", "10.0.1.2", "fd00::2")
    assert resolve_actors("dns:///actors:6000", resolver=resolver) == [
        "10.0.0.9:6000",
        "10.0.0.10:6000",
        "10.0.1.2:6000",
        "[::1]:6000",
        "[fd00::2]:6000",
    ]
    assert resolver.asked == [("actors", 6000)]


def test_resolve_actors_expands_dns_targets_in_place() -> None:
    resolver = FakeResolver("10.0.0.3", "10.0.0.2")
    assert resolve_actors(["x:1", "dns:actors:5", "y:2"], resolver=resolver) == [
        "x:1",
        "10.0.0.2:5",
        "10.0.0.3:5",
        "y:2",
    ]


def test_resolve_actors_resolves_localhost_with_getaddrinfo() -> None:
    actors = resolve_actors("dns:///localhost:50051")
    assert "127.0.0.1:50051" in actors
    assert actors == sorted(set(actors), key=actors.index)  # no duplicates
    for actor in actors:
        host = actor.rsplit(":", 1)[0].strip("[]")
        assert ipaddress.ip_address(host).is_loopback


def test_getaddrinfo_resolver_returns_every_address_of_a_multi_address_name(tmp_path) -> None:
    namespace = HostsNamespace(tmp_path, {"fleet.test": ["127.0.0.3", "127.0.0.2", "127.0.0.2"]})
    code = (
        f"{_IMPORT_DISCOVERY}import json\n"
        "from discovery import getaddrinfo_resolver, resolve_actors\n"
        "print(json.dumps([getaddrinfo_resolver('fleet.test', 1),"
        " resolve_actors('dns:///fleet.test:7')]))"
    )
    out = _run_in(namespace, [sys.executable, "-c", code])
    raw, actors = json.loads(out)
    assert set(raw) == {"127.0.0.2", "127.0.0.3"}
    assert actors == ["127.0.0.2:7", "127.0.0.3:7"]


def test_resolve_actors_raises_if_the_name_does_not_resolve(tmp_path) -> None:
    # In the namespace nothing answers DNS, so the failure is quick and stays on this machine.
    namespace = HostsNamespace(tmp_path, {})
    code = (
        f"{_IMPORT_DISCOVERY}from discovery import resolve_actors\n"
        "try:\n    resolve_actors('dns:///no-such-actor.test:1')\n"
        "except ConnectionError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = _run_in(namespace, [sys.executable, "-c", code])
    assert out.startswith("ActorUnavailableError cannot resolve 'no-such-actor.test'")


@pytest.mark.parametrize("ips", [[], ["not-an-ip"]])
def test_resolve_actors_raises_if_the_resolver_gives_no_usable_address(ips: list[str]) -> None:
    with pytest.raises(ActorUnavailableError, match="actors"):
        resolve_actors("dns:///actors:1", resolver=FakeResolver(*ips))


@pytest.mark.parametrize("actors", [[], "", "a:1,,b:2", ["a:1", " "]])
def test_resolve_actors_raises_if_empty(actors: object) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        resolve_actors(actors)  # type: ignore[arg-type]


@pytest.mark.parametrize("actors", [None, 5, ["a:1", 2]])
def test_resolve_actors_raises_if_not_strings(actors: object) -> None:
    with pytest.raises(TypeError, match="string"):
        resolve_actors(actors)  # type: ignore[arg-type]


def test_getaddrinfo_resolver_maps_errors_to_actor_unavailable() -> None:
    with pytest.raises(ActorUnavailableError, match="cannot resolve"):
        getaddrinfo_resolver("bad\x00name", 1)


# ---------------------------------------------------------------- DnsWatcher


def test_dns_watcher_reports_joins_and_leaves() -> None:
    resolver = FakeResolver("10.0.0.1", "10.0.0.2")
    changes: list[DnsChange] = []
    watcher = DnsWatcher("dns:///actors:9", on_change=changes.append, resolver=resolver)
    first = watcher.refresh()
    assert first == DnsChange(
        joined=("10.0.0.1:9", "10.0.0.2:9"), left=(), addresses=("10.0.0.1:9", "10.0.0.2:9")
    )
    assert not watcher.refresh()  # unchanged: falsy, and no callback
    resolver.ips = ["10.0.0.3", "10.0.0.2"]
    second = watcher.refresh()
    assert (second.joined, second.left) == (("10.0.0.3:9",), ("10.0.0.1:9",))
    assert watcher.addresses == ("10.0.0.2:9", "10.0.0.3:9")
    assert changes == [first, second]


def test_dns_watcher_calls_back_when_addresses_only_leave() -> None:
    resolver = FakeResolver("10.0.0.1", "10.0.0.2")
    changes: list[DnsChange] = []
    watcher = DnsWatcher("dns:///actors:9", on_change=changes.append, resolver=resolver)
    watcher.refresh()
    resolver.ips = ["10.0.0.2"]
    left = watcher.refresh()
    assert left  # a change, though nothing joined
    assert left == DnsChange(joined=(), left=("10.0.0.1:9",), addresses=("10.0.0.2:9",))
    assert changes[-1] is left


def test_dns_watcher_following_a_lookup_knows_each_address_once_sorted() -> None:
    answer = ["10.0.0.2:7", "10.0.0.1:7", "10.0.0.2:7"]
    changes: list[DnsChange] = []
    watcher = DnsWatcher("fleet", on_change=changes.append, lookup=lambda: list(answer))
    assert watcher.refresh().joined == ("10.0.0.1:7", "10.0.0.2:7")
    assert watcher.addresses == ("10.0.0.1:7", "10.0.0.2:7")
    answer.reverse()  # another order, the same members: no change
    assert not watcher.refresh()
    assert len(changes) == 1


def test_dns_watcher_reports_a_forgotten_address_again() -> None:
    resolver = FakeResolver("10.0.0.1", "10.0.0.2")
    refused: list[str] = []

    def on_change(change: DnsChange) -> None:
        # A caller that could not connect to a joined actor yet asks to hear of it again.
        for address in change.joined:
            if address == "10.0.0.2:9" and not refused:
                refused.append(address)
                watcher.forget(address)

    watcher = DnsWatcher("dns:///actors:9", on_change=on_change, resolver=resolver)
    assert watcher.refresh().joined == ("10.0.0.1:9", "10.0.0.2:9")
    assert watcher.addresses == ("10.0.0.1:9",)
    assert watcher.refresh().joined == ("10.0.0.2:9",)
    assert not watcher.refresh()
    watcher.forget("10.9.9.9:9")  # unknown: ignored
    assert watcher.addresses == ("10.0.0.1:9", "10.0.0.2:9")


def test_dns_watcher_keeps_known_addresses_when_resolution_fails() -> None:
    resolver = FakeResolver("10.0.0.1")
    watcher = DnsWatcher("dns:///actors:9", resolver=resolver)
    watcher.refresh()
    resolver.error = ActorUnavailableError("cannot resolve 'actors': timeout")
    with pytest.raises(ActorUnavailableError):
        watcher.refresh()
    assert watcher.addresses == ("10.0.0.1:9",)
    assert watcher.failures == 1


def test_dns_watcher_background_thread_follows_a_real_hosts_file(tmp_path) -> None:
    # A child process watches a real name while this test rewrites its hosts file.
    namespace = HostsNamespace(tmp_path, {"fleet.test": ["127.0.0.1", "127.0.0.2"]})
    code = (
        "import json, sys\n"
        f"{_IMPORT_DISCOVERY}from discovery import DnsWatcher\n"
        "def show(change):\n"
        "    print(json.dumps([change.joined, change.left]), flush=True)\n"
        "with DnsWatcher('dns:///fleet.test:7', interval=0.05, on_change=show):\n"
        "    sys.stdin.readline()\n"
    )
    process = subprocess.Popen(
        namespace.wrap([sys.executable, "-c", code]),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        lines = _LineReader(process.stdout)
        assert json.loads(lines.next()) == [["127.0.0.1:7", "127.0.0.2:7"], []]
        namespace.update({"fleet.test": ["127.0.0.2", "127.0.0.3"]})
        assert json.loads(lines.next()) == [["127.0.0.3:7"], ["127.0.0.1:7"]]
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.wait(20) == 0, process.stderr.read()
    finally:
        process.kill()
        process.wait(10)
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()


def test_dns_watcher_survives_a_failing_callback() -> None:
    resolver = FakeResolver("10.0.0.1")
    seen: list[DnsChange] = []

    def on_change(change: DnsChange) -> None:
        seen.append(change)
        if len(seen) == 2:
            raise RuntimeError("callback bug")

    with DnsWatcher("dns:///actors:9", interval=0.01, on_change=on_change, resolver=resolver):
        resolver.ips = ["10.0.0.2"]
        poll_until(lambda: len(seen) >= 2, timeout=5, message="second change not reported")
        resolver.ips = ["10.0.0.3"]
        poll_until(lambda: len(seen) >= 3, timeout=5, message="watcher died with its callback")
    assert [change.joined for change in seen] == [("10.0.0.1:9",), ("10.0.0.2:9",), ("10.0.0.3:9",)]


def test_dns_watcher_raises_if_used_after_close() -> None:
    watcher = DnsWatcher("dns:///actors:9", resolver=FakeResolver("10.0.0.1"))
    watcher.close()
    watcher.close()  # idempotent
    with pytest.raises(SessionStateError, match="closed"):
        watcher.refresh()
    with pytest.raises(SessionStateError, match="closed"):
        watcher.start()


@pytest.mark.parametrize(
    ("interval", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (1e12, ValueError),  # the watcher's wait overflowed: its thread died
        ("5", TypeError),
        (True, TypeError),
    ],
)
def test_dns_watcher_raises_if_interval_invalid(interval: object, error: type) -> None:
    with pytest.raises(error, match="interval"):
        DnsWatcher("dns:///actors:9", interval=interval)  # type: ignore[arg-type]


def test_dns_watcher_close_stops_its_thread() -> None:
    watcher = DnsWatcher("dns:///actors:9", interval=0.01, resolver=FakeResolver("10.0.0.1"))
    with watcher:
        assert any(t.name.startswith("rlfleet-dns-") for t in threading.enumerate())
    poll_until(
        lambda: not any(t.name.startswith("rlfleet-dns-") for t in threading.enumerate()),
        timeout=5,
        message="watcher thread still running",
    )


# -------------------------------------------------------------- end to end


@pytest.mark.slow
def test_resolve_actors_finds_real_actors_behind_one_name(tmp_path) -> None:
    ips = ["127.0.0.1", "127.0.0.2"]
    port = free_port_on(ips)
    namespace = HostsNamespace(tmp_path, {"actors.rlfleet.test": ips})
    flags = ["--port", str(port), "--num-envs", "1"]
    with (
        start_actor(["--host", ips[0], "--worker-id", "4", *flags]),
        start_actor(["--host", ips[1], "--worker-id", "5", *flags]),
    ):
        code = (
            "import json, grpc\n"
            f"{_IMPORT_DISCOVERY}from discovery import resolve_actors\n"
            "from common.rlfleet.v1 import actor_service_pb2 as pb, actor_service_pb2_grpc as rpc\n"
            f"actors = resolve_actors('dns:///actors.rlfleet.test:{port}')\n"
            "ids = []\n"
            "for address in actors:\n"
            "    with grpc.insecure_channel(address) as channel:\n"
            "        ids.append(rpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(),"
            " timeout=10).worker_id)\n"
            "print(json.dumps([actors, ids]))\n"
        )
        actors, worker_ids = json.loads(_run_in(namespace, [sys.executable, "-c", code]))
    assert actors == [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]
    assert worker_ids == [4, 5]


# ------------------------------------------------------------------ helpers


def _run_in(namespace: HostsNamespace, argv: list[str]) -> str:
    done = subprocess.run(namespace.wrap(argv), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class _LineReader:
    """Reads a pipe's lines on a thread, so a test can wait for one with a deadline."""

    def __init__(self, stream) -> None:
        self._lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()
        self._taken = 0

    def _pump(self, stream) -> None:
        for line in stream:
            with self._lock:
                self._lines.append(line.strip())

    def next(self, timeout: float = 20.0) -> str:
        poll_until(
            lambda: len(self._lines) > self._taken,
            timeout=timeout,
            message="no line from the child",
        )
        with self._lock:
            line = self._lines[self._taken]
        self._taken += 1
        return line


def test_dns_membership_tells_admit_which_listed_addresses_left(monkeypatch) -> None:
    answer = ["10.0.0.1", "10.0.0.2"]
    monkeypatch.setattr(_discovery, "getaddrinfo_resolver", lambda host, port: list(answer))
    members: set[str] = set()
    calls: list[tuple[list[str], list[str]]] = []

    def admit(joined: list[str], gone: set[str]) -> None:
        calls.append((sorted(joined), sorted(gone)))
        members.update(joined)

    membership = DnsMembership("dns:///actors:7", admit, lambda: set(members), interval=0.05)
    members.update({"10.0.0.1:7", "10.0.0.2:7"})  # admitted at construction
    membership.start()
    try:
        answer[:] = ["10.0.0.1", "10.0.0.3"]  # .2 rebooted as .3
        poll_until(lambda: calls, timeout=10)
        assert calls[0] == (["10.0.0.3:7"], ["10.0.0.2:7"])
    finally:
        membership.close()


def test_dns_membership_forgets_addresses_that_left_once_no_member_holds_them(monkeypatch) -> None:
    answer = ["10.0.0.1", "10.0.0.2"]
    monkeypatch.setattr(_discovery, "getaddrinfo_resolver", lambda host, port: list(answer))
    members: set[str] = {"10.0.0.1:7", "10.0.0.2:7"}
    calls: list[tuple[list[str], list[str]]] = []

    def admit(joined: list[str], gone: set[str]) -> None:
        calls.append((sorted(joined), sorted(gone)))
        members.difference_update(gone)  # each newcomer took over the member that left
        members.update(joined)

    membership = DnsMembership("dns:///actors:7", admit, lambda: set(members), interval=0.05)
    membership.start()
    try:
        for old, new in (("2", "3"), ("3", "4"), ("4", "5")):
            answer[:] = ["10.0.0.1", f"10.0.0.{new}"]
            poll_until(lambda new=new: any(f"10.0.0.{new}:7" in c[0] for c in calls), timeout=10)
            # only the member that left, never every address listed once over the run
            assert calls[-1] == ([f"10.0.0.{new}:7"], [f"10.0.0.{old}:7"])
    finally:
        membership.close()


def test_dns_membership_warns_once_per_reason_for_an_actor_it_cannot_admit(
    monkeypatch, caplog
) -> None:
    answer = ["10.0.0.1"]
    monkeypatch.setattr(_discovery, "getaddrinfo_resolver", lambda host, port: list(answer))
    reason = ["another env"]
    offered: list[str] = []

    def admit(joined: list[str], gone: set[str]) -> None:
        offered.extend(joined)
        raise ValueError(reason[0])

    caplog.set_level(logging.DEBUG, logger=_discovery.__name__)
    membership = DnsMembership("dns:///actors:7", admit, lambda: {"10.0.0.1:7"}, interval=0.02)
    membership.start()
    try:
        answer[:] = ["10.0.0.1", "10.0.0.3"]
        poll_until(lambda: offered.count("10.0.0.3:7") >= 4, timeout=10)
        reason[0] = "frames_per_batch"
        count = offered.count("10.0.0.3:7")
        poll_until(lambda: offered.count("10.0.0.3:7") >= count + 3, timeout=10)
    finally:
        membership.close()
    refusals = [r for r in caplog.records if "could not admit actor 10.0.0.3:7" in r.message]
    warned = [r.message.rsplit(": ", 1)[1] for r in refusals if r.levelno == logging.WARNING]
    assert warned == ["another env", "frames_per_batch"]  # once per reason, not per resolution
    assert len(refusals) >= 7


def test_dns_membership_admits_each_joiner_on_its_own_when_one_is_refused(monkeypatch) -> None:
    answer = ["10.0.0.1"]
    monkeypatch.setattr(_discovery, "getaddrinfo_resolver", lambda host, port: list(answer))
    members: set[str] = {"10.0.0.1:7"}
    offered: list[list[str]] = []

    def admit(joined: list[str], gone: set[str]) -> None:
        offered.append(sorted(joined))
        if "10.0.0.3:7" in joined:  # unreachable, a duplicate worker_id...: refused
            raise ValueError("refused")
        members.update(joined)

    membership = DnsMembership("dns:///actors:7", admit, lambda: set(members), interval=0.05)
    membership.start()
    try:
        answer[:] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        poll_until(lambda: offered.count(["10.0.0.3:7"]) >= 2, timeout=10)
        assert members == {"10.0.0.1:7", "10.0.0.2:7", "10.0.0.4:7"}
        assert offered[0] == ["10.0.0.2:7", "10.0.0.3:7", "10.0.0.4:7"]
        assert offered.count(["10.0.0.2:7"]) == offered.count(["10.0.0.4:7"]) == 1
    finally:
        membership.close()


@pytest.mark.parametrize("actors", ["10.0.0.9:7,dns:///actors:7", " dns:///actors:7 , 10.0.0.9:7"])
def test_dns_membership_follows_a_dns_target_in_a_comma_separated_string(
    monkeypatch, actors: str
) -> None:
    """``actors`` is read as resolve_actors reads it: each entry on its own."""
    answer = ["10.0.0.1"]
    monkeypatch.setattr(_discovery, "getaddrinfo_resolver", lambda host, port: list(answer))
    members: set[str] = {"10.0.0.9:7", "10.0.0.1:7"}
    offered: list[list[str]] = []

    def admit(joined: list[str], gone: set[str]) -> None:
        offered.append(sorted(joined))
        members.update(joined)

    membership = DnsMembership(actors, admit, lambda: set(members), interval=0.05)
    membership.start()
    try:
        answer[:] = ["10.0.0.1", "10.0.0.2"]
        poll_until(lambda: offered, timeout=10)
        assert offered == [["10.0.0.2:7"]]
    finally:
        membership.close()


def test_dns_watcher_refuses_a_second_start() -> None:
    """One watcher, one background thread: a second start raises instead of adding another."""
    watcher = DnsWatcher("dns:///actor:50051", interval=60.0, resolver=lambda h, p: ["10.0.0.1"])
    try:
        watcher.start()
        with pytest.raises(SessionStateError, match="already started"):
            watcher.start()
    finally:
        watcher.close()
