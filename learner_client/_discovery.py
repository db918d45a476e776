"""DNS discovery of actors: one ``dns:///name:port`` target becomes one actor per address.

A Kubernetes headless Service (``clusterIP: None``) and Docker's embedded DNS
both answer a name with every replica's address. The learner must open one
channel per address: a load-balanced virtual IP would pin each long-lived
Collect stream to whichever pod the first connection hit, so most actors
would never be asked for data and worker ids could not be addressed.

:func:`resolve_actors` expands such a target once, at start-up;
:class:`DnsWatcher` re-resolves it periodically and reports which addresses
joined and left, so a learner can open and close channels as the fleet is
scaled. A failed re-resolution keeps the last known set: a DNS blip must not
look like the whole fleet leaving. :class:`DnsMembership` is the collector's
use of them: it admits the addresses that join; one that could not be admitted
is forgotten by its watcher, so the next resolution offers it again. Actors
that leave DNS need no action: their links see the stream break and reconnect
with backoff, as for any dead actor. A host that comes back under a new address
(a rebooted or rescheduled one) presents the worker_id of such a member: it takes
the member's place once the old address has left DNS, or once the old link is
declared dead (it could not be reached); while the old address is both listed and
reachable the newcomer is refused and offered again at each resolution.

Target syntax (gRPC's naming scheme, without an authority)::

    dns:///actors.rlfleet.svc.cluster.local:50051
    dns:actor:50051
    dns:///actor            # port defaults to 50051
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from common.config import DEFAULT_PORT, check_actor_address, host_port, positive_timeout
from common.errors import ActorUnavailableError, ClosedError, SessionStateError

__all__ = [
    "DnsChange",
    "DnsMembership",
    "DnsWatcher",
    "Resolver",
    "getaddrinfo_resolver",
    "is_dns_target",
    "parse_dns_target",
    "resolve_actors",
]

_log = logging.getLogger(__name__)

#: ``resolver(host, port)`` returns the IP addresses (as strings) that ``host`` resolves to.
Resolver = Callable[[str, int], Iterable[str]]

# dns:[//authority/]host[:port]; host may be a bracketed IPv6 literal.
_TARGET_RE = re.compile(
    r"^(?i:dns):(?://(?P<authority>[^/]*)/)?(?P<host>\[[0-9A-Fa-f:.%\w]+\]|[^\s:/\[\]]+)(?::(?P<port>\d+))?$"
)


def is_dns_target(target: str) -> bool:
    """Whether ``target`` uses the ``dns:`` scheme (and so names a fleet, not one actor)."""
    return isinstance(target, str) and target.strip()[:4].lower() == "dns:"


def parse_dns_target(target: str) -> tuple[str, int]:
    """Split a ``dns:`` target into its host name and port.

    Args:
        target: ``dns:///name:port``, ``dns:name:port`` or either without ``:port``
            (then :data:`common.config.DEFAULT_PORT`).

    Returns:
        ``(host, port)``; an IPv6 literal host is returned without brackets.

    Raises:
        ValueError: The target is malformed, names a DNS server (an authority,
            which the system resolver cannot honour) or has a port outside 1..65535.
    """
    match = _TARGET_RE.match(target.strip()) if isinstance(target, str) else None
    if match is None:
        raise ValueError(f"expected a target like dns:///name:port, got {target!r}")
    if match.group("authority"):
        raise ValueError(
            f"DNS server authorities are not supported (the system resolver is used), "
            f"got {match.group('authority')!r} in {target!r}; write dns:///name:port"
        )
    port = int(match.group("port")) if match.group("port") is not None else DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port} in {target!r}")
    return match.group("host").strip("[]"), port


def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (hosts file, then DNS): every A and AAAA.

    Args:
        host: The name to resolve.
        port: The port (passed to ``getaddrinfo``; it does not change the answer).

    Returns:
        The addresses, in the resolver's order, possibly with duplicates.

    Raises:
        ActorUnavailableError: The name does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise ActorUnavailableError(f"cannot resolve {host!r}: {exc}") from None
    return [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]


def _actor_addresses(host: str, port: int, resolver: Resolver) -> tuple[str, ...]:
    """Resolve to sorted, deduplicated ``ip:port`` / ``[ip6]:port`` actor addresses."""
    ips: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for text in resolver(host, port):
        try:
            ips.add(ipaddress.ip_address(text))
        except ValueError:
            raise ActorUnavailableError(
                f"resolver returned a non-IP address {text!r} for {host!r}"
            ) from None
    if not ips:
        raise ActorUnavailableError(f"{host!r} resolved to no address")
    ordered = sorted(ips, key=lambda ip: (ip.version, int(ip), str(ip)))
    return tuple(host_port(str(ip), port) for ip in ordered)


def resolve_actors(actors: str | Sequence[str], *, resolver: Resolver | None = None) -> list[str]:
    """Expand a fleet description into one ``host:port`` per actor.

    A plain address stays as it is. A ``dns:`` target becomes every address
    its name resolves to, sorted (IPv4 first, numerically) and deduplicated,
    each with the target's port. A string is split on commas first, so the
    ``--actors a:1,b:2`` form of a command line can be passed as is.

    Example::

        resolve_actors("dns:///actors.rlfleet.svc.cluster.local:50051")
        # -> ["10.1.0.7:50051", "10.1.2.3:50051", ...]
        resolve_actors(["10.0.0.1:50051", "10.0.0.2:50051"])   # unchanged

    Args:
        actors: Addresses and/or ``dns:`` targets, as a list or a comma-separated string.
        resolver: Replaces :func:`getaddrinfo_resolver` (tests, custom service discovery).

    Returns:
        The actor addresses, in the order given, each ``dns:`` target expanded in place.

    Raises:
        TypeError: ``actors`` is not a string or a sequence of strings.
        ValueError: ``actors`` is empty or holds an empty entry or a malformed target.
        ActorUnavailableError: A ``dns:`` name does not resolve to any address.
    """
    entries = _entries(actors)
    result: list[str] = []
    for entry in entries:
        if is_dns_target(entry):
            host, port = parse_dns_target(entry)
            result.extend(_actor_addresses(host, port, resolver or getaddrinfo_resolver))
        else:
            result.append(check_actor_address(entry))
    return result


def _entries(actors: str | Sequence[str]) -> list[str]:
    if isinstance(actors, str):
        items: list[object] = list(actors.split(","))
    elif isinstance(actors, Sequence):
        items = list(actors)
    else:
        raise TypeError(
            f"actors must be a string or a list of strings, got {type(actors).__name__}"
        )
    bad = [item for item in items if not isinstance(item, str)]
    if bad:
        raise TypeError(f"every actor must be a string, got {bad!r}")
    entries = [str(item).strip() for item in items]
    if not entries or any(not entry for entry in entries):
        raise ValueError(f"expected one or more non-empty actor addresses, got {actors!r}")
    return entries


@dataclasses.dataclass(frozen=True)
class DnsChange:
    """What one re-resolution found, compared with the previous one.

    Attributes:
        joined: Addresses that are new, sorted.
        left: Addresses that disappeared, sorted.
        addresses: Every address known now, sorted.
    """

    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.joined or self.left)


class DnsWatcher:
    """Re-resolves one ``dns:`` target periodically and reports joins and leaves.

    ``on_change`` is called with a :class:`DnsChange` for every change,
    including the first resolution (everything joins), one call at a time and
    in order. A resolution that fails is logged and counted in ``failures``
    and leaves the known addresses as they were.

    Example::

        def on_change(change: DnsChange) -> None:
            for address in change.joined: collector_add(address)
            for address in change.left: collector_remove(address)

        with DnsWatcher("dns:///actor:50051", interval=5.0, on_change=on_change) as watcher:
            ...  # entering resolves once (raising if nothing resolves), then watches

    Args:
        target: A ``dns:`` target (see :func:`parse_dns_target`).
        interval: Seconds between background resolutions.
        on_change: Called with each non-empty change.
        resolver: Replaces :func:`getaddrinfo_resolver`.
        lookup: Replaces the resolution of ``target`` altogether: returns the addresses
            known now (a fleet object's live members); ``target`` is then only its name.
    """

    def __init__(
        self,
        target: str,
        *,
        interval: float = 10.0,
        on_change: Callable[[DnsChange], None] | None = None,
        resolver: Resolver | None = None,
        lookup: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self._host, self._port = (target, 0) if lookup else parse_dns_target(target)
        self._lookup = lookup
        self.target = target
        self._interval = positive_timeout("interval", interval)
        self._on_change = on_change
        self._resolver = resolver or getaddrinfo_resolver
        self._lock = threading.RLock()  # on_change may call forget() from inside refresh()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._addresses: tuple[str, ...] = ()
        self._closed = False
        self.failures = 0

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses known after the last successful resolution, sorted."""
        return self._addresses

    def refresh(self) -> DnsChange:
        """Resolve now, update the known addresses and report the change.

        Returns:
            The change (falsy when nothing changed).

        Raises:
            ActorUnavailableError: The name did not resolve; the known addresses are kept.
            SessionStateError: The watcher is closed.
        """
        with self._lock:
            if self._closed:
                raise ClosedError(f"DnsWatcher({self.target!r}) is closed")
            try:
                now = self._look_up()
            except ActorUnavailableError:
                self.failures += 1
                raise
            before = set(self._addresses)
            change = DnsChange(
                joined=tuple(a for a in now if a not in before),
                left=tuple(a for a in self._addresses if a not in set(now)),
                addresses=now,
            )
            self._addresses = now
            if change and self._on_change is not None:
                self._on_change(change)
            return change

    def _look_up(self) -> tuple[str, ...]:
        if self._lookup is not None:
            return tuple(sorted(set(self._lookup())))
        return _actor_addresses(self._host, self._port, self._resolver)

    def forget(self, address: str) -> None:
        """Drop ``address`` from the known set, so the next resolution reports it joined again.

        For a caller that could not use a joined address (e.g. the actor was not
        reachable yet): the watcher reports each join once, so without this the
        address would not come up again while it stays in DNS.

        Args:
            address: An ``ip:port`` from a reported change; unknown addresses are ignored.
        """
        with self._lock:
            self._addresses = tuple(a for a in self._addresses if a != address)

    def start(self) -> DnsWatcher:
        """Start re-resolving every ``interval`` seconds on a daemon thread.

        Returns:
            ``self``.

        Raises:
            SessionStateError: The watcher is closed or already started.
        """
        if self._closed or self._thread is not None:
            state = "closed" if self._closed else "already started"
            raise SessionStateError(f"DnsWatcher({self.target!r}) is {state}")
        self._thread = threading.Thread(
            target=self._run, name=f"rlfleet-dns-{self._host}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.refresh()
            except ActorUnavailableError as exc:
                _log.warning(
                    "dns re-resolution failed, keeping %d known actors: %s",
                    len(self._addresses),
                    exc,
                )
            except SessionStateError:
                return
            except Exception:  # a failing callback must not end the watch
                _log.exception("DnsWatcher on_change callback failed for %s", self.target)

    def stop(self) -> None:
        """Stop watching without waiting for the thread (a refresh under way goes on)."""
        # No lock here: a refresh may be blocked in the resolver, or this may be
        # called from on_change itself; the flag is checked under the lock.
        self._stop.set()
        self._closed = True

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching; idempotent. Waits up to ``timeout`` seconds for the thread."""
        self.stop()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> DnsWatcher:
        self.refresh()
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DnsWatcher({self.target!r}, addresses={list(self._addresses)!r})"


class DnsMembership:
    """Watches the ``dns:`` targets among ``actors`` and admits joining addresses.

    A fleet object that reports its live members (``RayFleet.live_addresses``, whose
    actors Ray restarts at new addresses) is followed the same way: ``follow`` is polled
    as a target is resolved, and an address that answers for a member that is down is
    admitted by moving that member's link there (``admit`` does it).

    Args:
        actors: What the user passed as ``actors`` (a list, or a comma-separated string).
        admit: ``admit(joined, gone)`` adds the ``joined`` addresses to the fleet, where
            ``gone`` are the addresses DNS listed once and lists no more (members there
            may be succeeded by a newcomer presenting their worker_id); raises when it
            cannot.
        known: Returns the addresses already in the fleet.
        interval: Seconds between re-resolutions.
        follow: The live addresses of the fleet object the collector was given, if any.
    """

    def __init__(
        self,
        actors: str | Sequence[str],
        admit: Callable[[list[str], set[str]], object],
        known: Callable[[], set[str]],
        *,
        interval: float = 10.0,
        follow: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        targets = _entries(actors)  # "a:1,dns:///b:2" as resolve_actors reads it
        self._admit = admit
        self._known = known
        self._seen: set[str] = set()  # listed once, and still listed or a member's
        self._refused: dict[str, str] = {}  # listed, not admitted: why, as last warned
        self._watchers = [
            DnsWatcher(target, interval=interval, on_change=self._on_change)
            for target in targets
            if is_dns_target(target)
        ]
        if follow is not None:
            self._watchers.append(
                DnsWatcher("fleet", interval=interval, on_change=self._on_change, lookup=follow)
            )

    def start(self) -> None:
        """Resolve every target once, then re-resolve in the background.

        The first resolution reports every address as joined; those already in
        the fleet are filtered out, so only real newcomers are admitted.
        """
        for watcher in self._watchers:
            watcher.refresh()
            watcher.start()

    def stop(self) -> None:
        """Admit nothing more: every watcher stops (an admission under way goes on)."""
        for watcher in self._watchers:
            watcher.stop()

    def close(self, timeout: float = 5.0) -> None:
        """Stop every watcher; idempotent. Waits up to ``timeout`` seconds for their threads.

        A watcher's thread admitting an actor waits on its Describe (up to the collector's
        ``connect_timeout``): :meth:`stop` first, and close once that call was cut off.
        """
        deadline = time.monotonic() + timeout
        for watcher in self._watchers:
            watcher.close(max(0.0, deadline - time.monotonic()))

    def _on_change(self, change: DnsChange) -> None:
        if change.left:
            _log.info("actors left DNS: %s", list(change.left))
        known = self._known()
        listed = {a for watcher in self._watchers for a in watcher.addresses}
        listed.update(change.addresses)  # the calling watcher's, set before this call
        # What left DNS matters only while a member holds it: the set stays bounded by the
        # listing and the fleet, however many addresses come and go over a long run.
        self._seen = {a for a in self._seen | set(change.joined) if a in listed or a in known}
        self._refused = {a: why for a, why in self._refused.items() if a in listed}
        joined = [a for a in change.joined if a not in known]
        if not joined:
            return
        gone = self._seen - listed
        try:
            self._admit(joined, gone)
            _log.info("admitted actors that joined DNS: %s", joined)
            for address in joined:
                self._refused.pop(address, None)
        except Exception as exc:  # each on its own: one refused keeps no other out
            if len(joined) == 1:
                self._retry_later(joined[0], exc)
                return
            for address in joined:
                try:
                    self._admit([address], gone)
                    _log.info("admitted an actor that joined DNS: %s", address)
                    self._refused.pop(address, None)
                except Exception as alone:
                    self._retry_later(address, alone)

    def _retry_later(self, address: str, exc: Exception) -> None:
        """Offer ``address`` again at the next resolution (it was refused now).

        The warning is logged once per reason: an actor refused for good (another env, a
        ``frames_per_batch`` it does not divide) would repeat it at every resolution.

        Raises:
            ClosedError: ``exc``, the collector shut down: nothing is offered again.
        """
        if isinstance(exc, ClosedError):  # the collector shut down meanwhile: the watch ends
            raise exc
        why = str(exc)
        repeated = self._refused.get(address) == why
        self._refused[address] = why
        level = logging.DEBUG if repeated else logging.WARNING
        _log.log(
            level, "could not admit actor %s yet (retried at each resolution): %s", address, why
        )
        for watcher in self._watchers:
            watcher.forget(address)
