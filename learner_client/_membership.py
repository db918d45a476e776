"""Fleet membership from DNS: actors that join a ``dns:`` target are admitted while running.

:class:`DnsMembership` keeps one :class:`~learner_client._discovery.DnsWatcher`
per ``dns:`` target the user gave and calls ``admit(addresses)`` with the
addresses that joined and are not in the fleet yet. An address that could not
be admitted (not serving yet, say) is forgotten by its watcher, so the next
resolution offers it again. Actors that leave DNS need no action: their links
see the stream break and reconnect with backoff, as for any dead actor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from learner_client._discovery import DnsChange, DnsWatcher, is_dns_target

__all__ = ["DnsMembership"]

_log = logging.getLogger(__name__)


class DnsMembership:
    """Watches the ``dns:`` targets among ``actors`` and admits joining addresses.

    Args:
        actors: What the user passed as ``actors`` (a string or a list).
        admit: Adds addresses to the fleet; raises when it cannot.
        known: Returns the addresses already in the fleet.
        interval: Seconds between re-resolutions.
    """

    def __init__(
        self,
        actors: str | Sequence[str],
        admit: Callable[[list[str]], object],
        known: Callable[[], set[str]],
        *,
        interval: float = 10.0,
    ) -> None:
        targets = [actors] if isinstance(actors, str) else list(actors)
        self._admit = admit
        self._known = known
        self._watchers = [
            DnsWatcher(target, interval=interval, on_change=self._on_change)
            for target in targets
            if is_dns_target(target)
        ]

    def start(self) -> None:
        """Resolve every target once, then re-resolve in the background.

        The first resolution reports every address as joined; those already in
        the fleet are filtered out, so only real newcomers are admitted.
        """
        for watcher in self._watchers:
            watcher.refresh()
            watcher.start()

    def close(self) -> None:
        """Stop every watcher; idempotent."""
        for watcher in self._watchers:
            watcher.close()

    def _on_change(self, change: DnsChange) -> None:
        if change.left:
            _log.info("actors left DNS: %s", list(change.left))
        joined = [a for a in change.joined if a not in self._known()]
        if not joined:
            return
        try:
            self._admit(joined)
            _log.info("admitted actors that joined DNS: %s", joined)
        except Exception as exc:  # retried at the next resolution
            _log.warning("could not admit actors %s yet: %s", joined, exc)
            for watcher in self._watchers:
                for address in joined:
                    watcher.forget(address)
