"""A collector's first argument: actor addresses, or a fleet object whose lifetime it takes.

TorchRL scripts build their collector in a helper (``make_collector(cfg, ...)``) and return
it, so a ``with LocalFleet(...)`` block around the collector line cannot hold the fleet for
the run. Given the fleet object itself, the collector owns it: :class:`FleetOwner` starts a
fleet that was not started, reads its addresses and closes it when the collector shuts down
(or fails to construct). Given ``fleet.addresses``, the fleet stays the caller's.

Anything with ``addresses``, ``worker_ids`` and ``close()`` (:class:`ActorFleet`) fits the
slot; one with ``started`` False and a ``start()`` method is started first. The same module
refuses TorchRL's positional ``(create_env_fn, policy)`` with the keywords that fix it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["ActorFleet", "FleetOwner", "check_positional", "is_fleet"]

_FLEET_MEMBERS = ("addresses", "worker_ids", "close")


class ActorFleet(Protocol):
    """A fleet of actors a collector can take instead of addresses (``LocalFleet``...).

    ``addresses`` are the actors' ``host:port`` in worker-id order, ``worker_ids`` their
    ids, and ``close()`` stops them (idempotent). A fleet with ``started`` False and a
    ``start()`` method is started by the collector that takes it.
    """

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every actor, in worker-id order."""
        ...

    @property
    def worker_ids(self) -> list[int]:
        """The actors' worker ids."""
        ...

    def close(self) -> None:
        """Stop every actor (a second call does nothing)."""
        ...


def is_fleet(actors: object) -> bool:
    """Whether ``actors`` is a fleet object (not addresses); reads no property."""
    if isinstance(actors, str | Sequence):
        return False
    for name in _FLEET_MEMBERS:
        try:
            inspect.getattr_static(actors, name)
        except AttributeError:
            return False
    return True


class FleetOwner:
    """The fleet a collector was given, if any, and its lifetime.

    Args:
        actors: The collector's first argument: addresses, a ``dns:`` target or a fleet.
        ends_with_frames: The collector shuts down when iteration reaches ``total_frames``
            (RayCollector's drop-in form: as RayCollector does, its Ray actors then free
            their CPUs for the script's next collector).
    """

    def __init__(self, actors: object, *, ends_with_frames: bool = False) -> None:
        self.fleet: ActorFleet | None = actors if is_fleet(actors) else None  # type: ignore[assignment]
        self._given = actors
        self.ends_with_frames = ends_with_frames

    def addresses(self) -> Any:
        """The addresses to connect to: the fleet's (started here if it was not), else as given."""
        fleet = self.fleet
        if fleet is None:
            return self._given
        if getattr(fleet, "started", True) is False and callable(getattr(fleet, "start", None)):
            fleet.start()  # type: ignore[attr-defined]
        return list(fleet.addresses)

    def unstarted_size(self) -> int | None:
        """The actors a fleet not started yet will have (its ``num_actors``), else None."""
        fleet = self.fleet
        if fleet is None or getattr(fleet, "started", True) is not False:
            return None
        size = getattr(fleet, "num_actors", None)
        return size if isinstance(size, int) and size > 0 else None

    def token(self, given: str | None) -> str | None:
        """The collector's ``token``, else the fleet's (a ``LocalFleet`` started with one)."""
        fleet_token = getattr(self.fleet, "token", None)
        return given if given is not None else fleet_token

    def worker_ids(self) -> list[int]:
        """The worker ids of the fleet object given (none for addresses)."""
        return [] if self.fleet is None else list(self.fleet.worker_ids)

    def follow(self) -> Callable[[], Sequence[str]] | None:
        """The fleet's ``live_addresses`` to poll for members that moved, if it has one.

        A fleet whose actors can come back elsewhere (``RayFleet``: Ray restarts a dead
        actor on a new port, maybe another node) reports its members' current addresses;
        the collector follows them as it follows a ``dns:`` target.
        """
        live = getattr(self.fleet, "live_addresses", None)
        return live if callable(live) else None

    @contextlib.contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """Close the fleet if the block raises (a collector that never was owns nothing)."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the fleet the collector was given (nothing for addresses; idempotent)."""
        if self.fleet is not None:
            self.fleet.close()


def check_positional(actors: object, extra: tuple[Any, ...]) -> None:
    """Refuse a TorchRL script's positional ``(create_env_fn, policy)``, naming the fix.

    Raises:
        TypeError: More than one positional argument, or an env, env constructor or
            module where the fleet or its addresses belong.
    """
    fix = (
        "GrpcCollector takes the fleet (or its addresses) first and TorchRL's arguments "
        "by keyword: GrpcCollector(fleet, create_env_fn=env, policy=policy, ...)"
    )
    if extra:
        raise TypeError(
            f"GrpcCollector got {1 + len(extra)} positional arguments, as TorchRL's "
            f"Collector(create_env_fn, policy, ...) takes them; {fix}"
        )
    if isinstance(actors, Sequence) and not isinstance(actors, str):
        if any(_env_or_policy(item) for item in actors):
            raise TypeError(
                "GrpcCollector's first argument is the fleet or its addresses, got a list "
                "holding envs or env constructors (RayCollector's create_env_fn?); pass it "
                "by keyword: GrpcCollector(create_env_fn=[...], policy=policy, ...)"
            )
        return
    if isinstance(actors, str) or is_fleet(actors):
        return
    if _env_or_policy(actors):
        raise TypeError(
            f"GrpcCollector's first argument is the fleet or its addresses, "
            f"got {type(actors).__name__} (an env or a policy?); {fix}"
        )


def _env_or_policy(value: object) -> bool:
    """Whether ``value`` looks like an env, an env constructor or a module (not an address)."""
    return callable(value) or hasattr(value, "fake_tensordict")
