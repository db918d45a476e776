"""The actors a collector talks to, and every fleet-wide operation, driven from the user thread.

:class:`Fleet` holds one :class:`~learner_client._link.ActorLink` per actor
(keyed by worker_id) and is given what its links and calls use: the
event-loop thread, the :class:`~learner_client._mailbox.Mailbox`, the
:class:`~learner_client._ledger.Ledger` and the
:class:`~learner_client._weights.WeightBook`. Its methods are synchronous and
bounded: describing new actors (within ``connect_timeout``), starting
sessions, concurrent weight pushes that return each actor's reply or error (each by
its route, :class:`~learner_client._push_routes.PushRoutes`; what becomes of them is
:class:`~learner_client._pushes.Pusher`'s verdict, which also admits actors that come
back), chained seeding, state save/load, and stopping the links.

With several learner ranks (:class:`~learner_client._members.Ranks`) the fleet knows two
sets: its *members*, every actor described (each keeps a link, for calls that reach the
whole fleet), and the actors it *owns* (``worker_id % world_size == rank``), the only ones
it opens sessions on, pushes replicated weights to, seeds, checkpoints and counts.
``worker_ids`` are the owned ones; ``member_ids`` all of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import torch

from common.config import CollectSettings
from common.errors import RlfleetError, UnknownWorkerError
from learner_client._collect_stream import OpenStreams
from learner_client._description import ActorDescription
from learner_client._ledger import Ledger, restored_counts
from learner_client._link import ActorLink, Admit, Link, LinkState
from learner_client._loop_thread import WAIT_MARGIN_S, LoopThread, settle
from learner_client._mailbox import Mailbox
from learner_client._members import FleetMember, Ranks, check_devices, check_unique
from learner_client._push_routes import PushRoutes
from learner_client._relay import RelayRoute
from learner_client._restore import (
    check_models,
    check_state,
    check_versions,
    load_states,
    state_blobs,
    state_weights,
)
from learner_client._settings import BatchSettings, ConnectionSettings, check_fleet
from learner_client._shm import ShmRoute
from learner_client._slabs import PacketSlabs
from learner_client._stripes import StripeRoute
from learner_client._torchrl_compat import ActorPlacement
from learner_client._transport import ActorChannel, PushReply, connect_failure
from learner_client._weights import EncodedWeights, WeightBook

__all__ = ["Fleet", "RemoteActor"]

log = logging.getLogger("learner_client")

_UNREACHABLE = (LinkState.DOWN, LinkState.LOST, LinkState.FAILED, LinkState.CLOSED)


@dataclasses.dataclass(frozen=True)
class RemoteActor:
    """One actor of the fleet, as ``GrpcCollector.remote_collectors`` lists it.

    Attributes:
        address: ``host:port``.
        worker_id: The id the actor reports.
    """

    address: str
    worker_id: int


@dataclasses.dataclass(eq=False, repr=False)  # no repr: conn holds the bearer token
class Fleet:
    """Actors, their links and the fleet-wide calls.

    Attributes:
        conn: Connection settings.
        loop: The event-loop thread every call runs on.
        mailbox: Where the links deliver batches.
        streams: Where the links register their open streams (credits and acks).
        ledger: The counters of ``stats()``.
        book: The weights each actor should hold.
        batch_timeout: Stall deadline of a stream owing a batch.
        slabs: The shared slabs each actor's batches are received into.
        ranks: Which actors this learner rank owns (default: every one).
        shm: Which actors share this host; pushes to them travel through shared memory.
        relay: Which pushes to remote actors travel down a chain of actors.
        stripes: Which pushes to a remote actor travel striped over parallel streams.
    """

    conn: ConnectionSettings
    _: dataclasses.KW_ONLY
    loop: LoopThread
    mailbox: Mailbox
    streams: OpenStreams
    ledger: Ledger
    book: WeightBook
    batch_timeout: float
    slabs: PacketSlabs
    ranks: Ranks = dataclasses.field(default_factory=Ranks)
    shm: ShmRoute = dataclasses.field(default_factory=ShmRoute)
    relay: RelayRoute = dataclasses.field(default_factory=RelayRoute)
    stripes: StripeRoute = dataclasses.field(default_factory=StripeRoute)
    #: What a link calls before each session: the pusher re-sends the weights the actor lacks
    #: (set once the pusher is wired; see :func:`learner_client._wiring.assemble`).
    admit: Admit[ActorChannel] = dataclasses.field(init=False)
    _links: dict[int, Link] = dataclasses.field(default_factory=dict, init=False)  # members
    _owned: set[int] = dataclasses.field(default_factory=set, init=False)
    _routes: PushRoutes = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self._routes = PushRoutes(
            self.conn, self.loop, self._links, self.reachable, self.shm, self.relay, self.stripes
        )

    # ----------------------------------------------------------- membership

    def describe(self, addresses: Sequence[str]) -> list[Link]:
        """Reach every address within ``connect_timeout`` and build (unregistered) links.

        Raises:
            ValueError: An address is already in the fleet (nothing is reached).
            ActorUnavailableError: Naming every address that could not be reached.
        """
        if clash := sorted(set(addresses) & self.known_addresses()):
            raise ValueError(f"actor address(es) {clash} are already in the fleet")
        return self.loop.run(
            self._describe_all(list(addresses)), self.conn.connect_timeout + WAIT_MARGIN_S
        )

    async def _describe_all(self, addresses: list[str]) -> list[Link]:
        channels = [
            ActorChannel(a, self.conn.metadata(), self.conn.channel_credentials) for a in addresses
        ]
        probe = self.shm.probe()
        try:
            results = await asyncio.gather(
                *(
                    c.describe(self.conn.connect_timeout, wait_for_ready=True, probe=probe)
                    for c in channels
                ),
                return_exceptions=True,
            )
        finally:
            if probe is not None:
                self.shm.remove_probe(probe)
        failed = [
            (c, r) for c, r in zip(channels, results, strict=True) if isinstance(r, BaseException)
        ]
        descriptions = [r for r in results if isinstance(r, ActorDescription)]
        for d in descriptions:
            self.shm.admit(d.worker_id, d.host_identity, d.shm_probe_ok)
        if failed:
            error = await connect_failure(failed, self.conn.connect_timeout)
            await settle(c.close() for c in channels)
            raise error
        return [
            ActorLink(
                d,
                c,
                self.conn,
                batch_timeout=self.batch_timeout,
                mailbox=self.mailbox,
                streams=self.streams,
                ledger=self.ledger,
                admit=self.admit,
                allocate=self.slabs.for_worker(d.worker_id),
                shm=self.shm,
            )
            for d, c in zip(descriptions, channels, strict=True)
        ]

    def register(self, links: Sequence[Link]) -> None:
        """Make links members of the fleet (after the fleet checks passed); own the rank's."""
        for link in links:
            self._links[link.worker_id] = link
            if self.ranks.owns(link.worker_id):
                self.mailbox.add_worker(link.worker_id, link.description.max_credits or 1)
                self.book.observe(link.worker_id, link.description.models, link.description.epoch)
                # Owned last: a round reading worker_ids on another thread finds its slot.
                self._owned.add(link.worker_id)

    def join(
        self,
        links: Sequence[Link],
        batch: BatchSettings,
        acting_model: str,
        placement: ActorPlacement | None = None,
        *,
        gone: Iterable[str] = (),
    ) -> list[Link]:
        """Register ``links`` if the fleet grown by them passes :func:`check_fleet`.

        With ``placement``, every actor must also offer its devices (:func:`check_devices`).
        Batch shapes are checked over the actors this rank owns; worker_ids over every member.
        A link presenting a member's worker_id *succeeds* that member (see
        :meth:`successors`): the member's link follows the actor to the new address and
        keeps its place; any other shared worker_id is refused.

        Args:
            links: Described actors (from :meth:`describe`).
            batch: The batch settings the grown fleet must fit.
            acting_model: The model_id the actors act with.
            placement: Where the policy runs, if the actors must offer that device.
            gone: Addresses that DNS listed once and lists no more.

        Returns:
            The links that became new members (successors are not: their members moved).

        Raises:
            ValueError, UnknownModelError: As :func:`check_fleet` (and a rank owning no
                actor); the links' channels are closed and nothing is registered.
        """
        try:
            moving = self.successors(links, gone)
            everyone = self.members(links, owned_only=False, replaced=moving)
            self.ranks.check_owns_some([m.worker_id for m in everyone])
            check_unique(everyone)
            mine = [x for x in links if self.ranks.owns(x.worker_id)]
            owned = self.members(mine, replaced=moving)
            check_fleet(batch, owned, acting_model)
            if placement is not None:
                devices = placement.policy_device, placement.cudagraph_policy
                check_devices(owned, *devices)
        except BaseException:
            self.discard(links)
            raise
        fresh = [link for link in links if link.worker_id not in moving]
        self.register(fresh)
        self._move(list(moving.values()))
        return fresh

    def successors(self, links: Sequence[Link], gone: Iterable[str] = ()) -> dict[int, Link]:
        """The links that take over a member's worker_id, by worker_id.

        A newcomer presenting a member's worker_id takes that member's place when the
        member's address has left DNS (is in ``gone``) or its link is declared dead
        (down, lost, failed or closed: it could not be reached). A member that is still
        listed and reachable keeps its worker_id; the newcomer is then refused by
        :func:`check_unique`.
        """
        left = set(gone)
        result: dict[int, Link] = {}
        for link in links:
            member = self._links.get(link.worker_id)
            if member is not None and (member.address in left or member.state in _UNREACHABLE):
                result[link.worker_id] = link
        return result

    def _move(self, successors: Sequence[Link]) -> None:
        """Hand each successor's channel to the member it succeeds (on the loop)."""
        for link in successors:
            member = self._links[link.worker_id]
            self.loop.run(member.move(link.channel, link.description), WAIT_MARGIN_S)

    def discard(self, links: Sequence[Link]) -> None:
        """Close the channels of links that were refused."""
        self.loop.run(settle(link.channel.close() for link in links), WAIT_MARGIN_S)

    @property
    def worker_ids(self) -> list[int]:
        """The worker_ids this rank owns (collects from, pushes to), sorted."""
        return sorted(self._owned)

    @property
    def member_ids(self) -> list[int]:
        """Every member's worker_id, owned or not, sorted."""
        return sorted(self._links)

    def owned_links(self) -> dict[int, Link]:
        """The links of the actors this rank owns, by worker_id (sorted)."""
        return {w: self._links[w] for w in sorted(self._owned)}

    def member_links(self) -> dict[int, Link]:
        """Every member's link, by worker_id (sorted)."""
        return dict(sorted(self._links.items()))

    def members(
        self,
        extra: Sequence[Link] = (),
        *,
        owned_only: bool = True,
        replaced: Mapping[int, Link] | None = None,
    ) -> list[FleetMember]:
        """What the fleet checks need about the owned actors (or every member), plus ``extra``.

        Members whose worker_id is in ``replaced`` are left out (their successors are in
        ``extra``).
        """
        known = self.owned_links() if owned_only else self._links
        kept = [link for w, link in known.items() if w not in (replaced or {})]
        return [
            FleetMember(
                link.address,
                link.worker_id,
                link.description.num_envs,
                tuple(link.description.models),
                link.description.kind,
                link.description.max_new_tokens_cap,
                link.description.device,
                link.description.env,
                link.description.spaces,
                link.description.epoch,
            )
            for link in [*kept, *extra]
        ]

    def addresses(self) -> dict[int, str]:
        """Each owned actor's address, by worker_id (sorted)."""
        return {w: link.address for w, link in self.owned_links().items()}

    def known_addresses(self) -> set[str]:
        """The addresses of every member (also read by a ``dns:`` watcher's thread)."""
        # Over a copy taken at once: a join registering on another thread meanwhile would
        # end the iteration with a RuntimeError (and the watcher's newcomer with it).
        return {link.address for link in tuple(self._links.values())}

    def models_of(self, worker_id: int) -> list[str]:
        """The model_ids an actor reported, sorted."""
        return sorted(self._links[worker_id].description.models)

    def reachable(self, worker_id: int) -> bool:
        """Whether an actor's link is not down, lost, failed or closed."""
        return self._links[worker_id].state not in _UNREACHABLE

    def start(self, settings: CollectSettings, links: Sequence[Link] | None = None) -> None:
        """Open sessions on the owned ones of ``links`` (default: every owned actor)."""
        known = self.owned_links().values() if links is None else links
        targets = [link for link in known if link.worker_id in self._owned]
        self.loop.run(_each(targets, lambda link: link.start(settings)), WAIT_MARGIN_S)

    def restart(self, settings: CollectSettings) -> None:
        """Re-open every running session with new settings (the fleet was resized)."""
        links = self.owned_links().values()
        self.loop.run(_each(links, lambda link: link.restart(settings)), WAIT_MARGIN_S)

    def start_joined(self, links: Sequence[Link], settings: CollectSettings, *, sync: bool) -> None:
        """Open sessions on links that joined while collecting, with the new ``settings``.

        Sync: the per-actor share changed, so every other session restarts with
        ``settings`` and the batches they buffered under the old split are dropped
        (counted as discarded). Members this rank does not own are left alone.
        """
        links = [link for link in links if link.worker_id in self._owned]
        if not links:
            return
        if sync:
            added = {link.worker_id for link in links}
            old = [w for w in self.worker_ids if w not in added]
            self.restart(settings)
            self.ledger.add_discarded(self.mailbox.drop_buffered(old))
        self.start(settings, links)

    # -------------------------------------------------------------- weights

    def push(self, pairs: Sequence[tuple[int, EncodedWeights]]) -> list[PushReply | BaseException]:
        """Push each ``(worker_id, encoded model)`` pair, all concurrently (:class:`PushRoutes`).

        Returns:
            Per pair, in order, the actor's reply or the exception its push failed with
            (what becomes of them is the pusher's verdict).
        """
        return self._routes.push(pairs)

    async def push_to(self, link: Link, enc: EncodedWeights) -> PushReply:
        """Push one encoded model to one actor, on the loop (a returning actor's admission).

        Raises:
            RlfleetError: The actor refused the push or could not be reached.
        """
        return await self._routes.push_to(link, enc)

    def accepts_parts(self, worker_id: int) -> bool:
        """Whether an actor takes multi-part pushes (its Describe gives a part deadline)."""
        return self._routes.accepts_parts(worker_id)

    # -------------------------------------------------------- control calls

    def set_seed(self, seed: int, static_seed: bool) -> int:
        """Seed every actor in worker_id order, chaining each returned seed to the next.

        What an actor collected before its seeding (buffered here or still on the way)
        is dropped, as TorchRL discards it: the next batch is the first of the new seed.

        ProtocolError for an actor's ``first_seq`` beyond what it may have collected (the
        actors before it are seeded, those after it are not).
        """
        for wid in self.worker_ids:
            link = self._links[wid]
            seed, first_seq = self.loop.run(
                link.channel.set_seed(seed, static_seed, self.conn.call_timeout),
                self.conn.call_timeout + WAIT_MARGIN_S,
            )
            link.tracker.check_reseeded(first_seq, link.channel.name)
            epoch = link.tracker.epoch or link.description.epoch
            self.ledger.add_discarded(self.mailbox.discard_before(wid, epoch, first_seq))
        return seed

    def state_dict(self, only: Collection[int] | None = None) -> dict[str, Any]:
        """Learner counters (per worker, and the ledger's extras) plus owned actors' state blobs.

        The counters are of one instant; the blobs are uint8 tensors, by worker_id.
        ``only``: the blobs of those owned actors alone (the others are not asked).
        """
        owned = {w: link for w, link in self.owned_links().items() if only is None or w in only}

        async def fetch() -> list:
            return await asyncio.gather(
                *(link.channel.get_state(self.conn.call_timeout) for link in owned.values())
            )

        blobs = self.loop.run(fetch(), self.conn.call_timeout + WAIT_MARGIN_S)
        counts = self.ledger.counts()  # frames, batches and the extra counts of one instant
        return {
            "frames": counts.frames,
            "batches": counts.batches,
            "worker_frames": counts.worker_frames,
            "worker_batches": counts.worker_batches,
            **counts.extra,
            "policy_version": self.book.versions(),
            "workers": {
                w: torch.frombuffer(bytearray(b), dtype=torch.uint8)
                for w, b in sorted(zip(owned, blobs, strict=True))
            },
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore counters and each listed actor's state (all or none), then its versions.

        Raises:
            TypeError: A state or its ``workers`` that is not a mapping.
            ValueError: Missing keys; versions of models no actor holds.
            UnknownWorkerError: A worker_id not in the fleet.
            WeightsError: A blob that is not an actor state, or one an actor refused
                (the actors are then back where they were: ``learner_client._restore``).
        """
        check_state(state_dict)
        # Everything is checked before anything is applied; the counters after the actors.
        counts = restored_counts(state_dict, self.ledger.extra)
        versions = check_versions(state_dict["policy_version"])
        check_models(
            versions, {m for link in self._links.values() for m in link.description.models}
        )
        workers = state_blobs(state_dict["workers"])
        # The per-worker counts may name actors since removed: counters, restored as saved.
        unknown = sorted(set(workers) - self._owned)
        if unknown:
            others = [w for w in unknown if w in self.member_ids]
            whose = f" ({others} are other learner ranks' actors: load each rank's own)"
            raise UnknownWorkerError(
                f"state_dict holds unknown worker_ids {unknown}; the "
                f"fleet has worker_ids {self.worker_ids}{whose if others else ''}"
            )
        timeout = self.conn.call_timeout
        for desc in self.loop.run(load_states(self._links, workers, timeout), 4 * timeout):
            held = state_weights(workers[desc.worker_id])
            self.book.restored(desc.worker_id, desc.models, held, desc.epoch)
        self.book.restore_versions(versions)
        self.ledger.restore(counts)

    def states(self) -> dict[int, str]:
        """Each owned actor's link state name, by worker_id."""
        return {w: link.state.value for w, link in self.owned_links().items()}

    def retry_now(self, worker_ids: Sequence[int]) -> list[int]:
        """Start the reconnection of these owned, down actors now; returns those that retry."""
        links = self.owned_links()

        async def wake() -> list[int]:
            return [w for w in worker_ids if w in links and links[w].retry_now()]

        return self.loop.run(wake(), WAIT_MARGIN_S)

    def last_failures(self) -> dict[int, str]:
        """The last failure of each owned actor that had one, by worker_id."""
        links = self.owned_links().items()
        hint = self.ranks.unsharded_hint()
        return {
            w: link.last_failure + (hint if link.last_failure.startswith("ActorBusyError") else "")
            for w, link in links
            if link.last_failure
        }

    # ------------------------------------------------------------ shutdown

    def close(self, timeout: float) -> None:
        """End every session cleanly within ``timeout`` (the caller then stops the loop)."""
        try:
            self.loop.run(
                settle(link.stop(timeout) for link in self._links.values()), timeout + WAIT_MARGIN_S
            )
        except (RlfleetError, RuntimeError) as exc:
            log.warning("closing the actor sessions: %s", exc)
        finally:
            self.shm.close()


async def _each(links: Iterable[Link], call: Callable[[Link], None]) -> None:
    """Call ``call`` on every link, on the loop (where links run their sessions)."""
    for link in links:
        call(link)
