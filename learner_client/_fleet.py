"""The actors a collector talks to, and every fleet-wide operation, driven from the user thread.

:class:`Fleet` holds one :class:`~learner_client._link.ActorLink` per actor
(keyed by worker_id) and is given what its links and calls use: the
event-loop thread, the :class:`~learner_client._mailbox.Mailbox`, the
:class:`~learner_client._ledger.Ledger` and the
:class:`~learner_client._weights.WeightBook`. Its methods are synchronous and
bounded: describing new actors (within ``connect_timeout``), starting
sessions, concurrent weight pushes that return each actor's reply or error (what
becomes of them is :class:`~learner_client._pushes.Pusher`'s verdict, which also
admits actors that come back), chained seeding, state save/load, and stopping the links.

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
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from common.config import CHUNK_BYTES, CollectSettings
from common.errors import RelayFailedError, RlfleetError, UnknownWorkerError
from learner_client._collect_stream import OpenStreams
from learner_client._description import ActorDescription
from learner_client._ledger import Ledger, check_counts
from learner_client._link import ActorLink, Admit, LinkState
from learner_client._loop_thread import LoopThread
from learner_client._mailbox import Mailbox
from learner_client._members import FleetMember, Ranks, check_devices, check_unique
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
from learner_client._shm import ShmRefusedError, ShmRoute
from learner_client._slabs import PacketSlabs
from learner_client._stripes import Striped, StripeRoute
from learner_client._torchrl_compat import ActorPlacement
from learner_client._transport import (
    ActorChannel,
    PushMessages,
    PushReply,
    connect_failure,
    push_messages,
    shm_messages,
)
from learner_client._weights import EncodedWeights, WeightBook

__all__ = ["Fleet", "Link", "RemoteActor"]

log = logging.getLogger("learner_client")
T = TypeVar("T")

# Extra seconds a blocking wait allows beyond the per-call deadline it wraps.
_MARGIN = 5.0

_UNREACHABLE = (LinkState.DOWN, LinkState.LOST, LinkState.FAILED, LinkState.CLOSED)

#: The fleet's links, over real gRPC channels.
Link = ActorLink[ActorChannel]


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
    #: Per model, the last whole push's bytes (its key) and the workers that applied them.
    _holders: dict[str, tuple[tuple, frozenset[int]]] = dataclasses.field(
        default_factory=dict, init=False
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
            self._describe_all(list(addresses)), self.conn.connect_timeout + _MARGIN
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
            await _settle(c.close() for c in channels)
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
            self.loop.run(member.move(link.channel, link.description), _MARGIN)

    def discard(self, links: Sequence[Link]) -> None:
        """Close the channels of links that were refused."""
        self.loop.run(_settle(link.channel.close() for link in links), _MARGIN)

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
        self.loop.run(_each(targets, lambda link: link.start(settings)), _MARGIN)

    def restart(self, settings: CollectSettings) -> None:
        """Re-open every running session with new settings (the fleet was resized)."""
        links = self.owned_links().values()
        self.loop.run(_each(links, lambda link: link.restart(settings)), _MARGIN)

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

    async def push_to(self, link: Link, enc: EncodedWeights) -> PushReply:
        """Push one encoded model to one actor, on the loop (a returning actor's admission).

        An actor on this host reads it from a segment (``learner_client._shm``); another
        gets it from a peer that applied these very bytes when one can
        (``learner_client._relay``); else (or if either fails) from the learner.

        Raises:
            RlfleetError: The actor refused the push or could not be reached.
        """
        messages = _messages(enc)
        if self.shm.is_local(link.worker_id):
            shared = await self._push_shared(link, enc, messages)
            if shared is not None:
                return shared
        peer = self._holder_for(link, enc)
        if peer is not None:
            try:
                return await self._catch_up(link, peer, enc, messages)
            except RelayFailedError as exc:
                log.info("worker_id %d: %s; the bytes were sent instead", link.worker_id, exc)
                self.relay.fell_back(_nbytes(enc.blob))
        striped = self._striped(link.worker_id, enc)
        if striped is not None:
            self.stripes.count(1)
            return await link.channel.push_parts(
                enc.model_id, enc.version, striped.parts, self.conn.call_timeout
            )
        return await link.channel.push_weights(
            enc.model_id, enc.version, messages, self.conn.call_timeout
        )

    async def _push_shared(
        self, link: Link, enc: EncodedWeights, messages: PushMessages
    ) -> PushReply | None:
        """One local actor's push through a segment; None when it must get the bytes instead."""
        segments = await asyncio.to_thread(self.shm.write, {0: (enc.blob, enc.crc32c)})
        if not segments:  # no room in /dev/shm
            self.shm.count(0, 1)
            return None
        spoiled: set[str] = set()
        try:
            reply = await link.channel.push_weights(
                enc.model_id,
                enc.version,
                shm_messages(messages, segments[0]),
                self.conn.call_timeout,
            )
        except ShmRefusedError as exc:
            log.info("worker_id %d: %s; the bytes were sent instead", link.worker_id, exc)
            spoiled.add(segments[0].name)
            self.shm.count(0, 1)
            return None
        finally:
            self.shm.release(segments.values(), spoiled)
        self.shm.count(1, 0)
        return reply

    def _holder_for(self, link: Link, enc: EncodedWeights) -> Link | None:
        """A reachable peer that applied exactly ``enc``'s bytes, if catching up may use one."""
        held = self._holders.get(enc.model_id)
        tls = self.conn.channel_credentials is not None
        if held is None or held[0] != _key(enc) or enc.crc32c is None:
            return None
        peers = [w for w in sorted(held[1]) if w != link.worker_id and w in self._links]
        peer = next((self._links[w] for w in peers if self.reachable(w)), None)
        if peer is None:
            return None
        chain = [peer.channel.address, link.channel.address]
        over_tls = [peer.description.relays_over_tls, False]
        return (
            peer
            if self.relay.relays(_nbytes(enc.blob), chain, tls=tls, over_tls=over_tls)
            else None
        )

    async def _catch_up(
        self, link: Link, peer: Link, enc: EncodedWeights, messages: PushMessages
    ) -> PushReply:
        """The returning actor's push, its bytes forwarded by ``peer``."""
        request, sent = self.relay.catch_up(
            messages, peer.channel.address, link.channel.address, _nbytes(enc.blob)
        )
        timeout = self.conn.call_timeout
        target = asyncio.ensure_future(
            link.channel.push_weights(enc.model_id, enc.version, sent, timeout)
        )
        try:
            await peer.channel.forward_weights(request, timeout)
        except RlfleetError as exc:
            target.cancel()
            await asyncio.gather(target, return_exceptions=True)
            raise RelayFailedError(f"worker_id {peer.worker_id} did not forward: {exc}") from exc
        return await target

    def _hold(
        self,
        pairs: Sequence[tuple[int, EncodedWeights]],
        replies: Sequence[object],
        unheld: Collection[int],
    ) -> None:
        """Remember who applied each whole push's bytes (peers a returning actor may use).

        An actor sent a push striped holds its parts, not the blob, and one sent it through
        a segment applied it from there (``unheld``): neither is such a peer.
        """
        for i, ((w, enc), reply) in enumerate(zip(pairs, replies, strict=True)):
            if i in unheld:
                continue
            if isinstance(reply, PushReply) and enc.part is None and enc.base_version is None:
                held = self._holders.get(enc.model_id)
                workers = held[1] if held is not None and held[0] == _key(enc) else frozenset()
                # A new pair, never changed in place: the loop thread reads it unlocked.
                self._holders[enc.model_id] = (_key(enc), workers | {w})

    def push(self, pairs: Sequence[tuple[int, EncodedWeights]]) -> list[PushReply | BaseException]:
        """Push each ``(worker_id, encoded model)`` pair, all concurrently.

        Returns:
            Per pair, in order, the actor's reply or the exception its push failed with
            (what becomes of them is the pusher's verdict).
        """
        # Serialised once per distinct push, however many workers receive it; the blob of
        # a push to actors on this host is encoded into (or else copied once into) a segment
        # they all read.
        messages = {_key(enc): _messages(enc) for _, enc in pairs}
        near = [self.shm.is_local(w) for w, _ in pairs]
        blobs = {
            _key(enc): (enc.blob, enc.crc32c) for (_, enc), n in zip(pairs, near, strict=True) if n
        }
        segments = self.shm.write(blobs)
        # A local actor whose blob got no segment (/dev/shm full) is sent the bytes.
        local = [n and _key(enc) in segments for (_, enc), n in zip(pairs, near, strict=True)]
        refused: list[int] = []
        try:
            sent: list[Sequence[bytes] | Striped] = [
                shm_messages(messages[_key(enc)], segments[_key(enc)])
                if shared
                else messages[_key(enc)]
                for (_, enc), shared in zip(pairs, local, strict=True)
            ]
            relayed = self._relayed(pairs, local, messages)
            for i, chained in relayed.items():
                sent[i] = chained
            striped = self._striped_all(pairs, [n or i in relayed for i, n in enumerate(local)])
            for i, parts in striped.items():
                sent[i] = parts
            replies = self._push_calls(
                [(w, enc, s) for (w, enc), s in zip(pairs, sent, strict=True)],
                {i: messages[_key(pairs[i][1])] for i in relayed},
            )
            refused = [i for i, r in enumerate(replies) if isinstance(r, ShmRefusedError)]
            for i, reply in zip(refused, self._resend(pairs, refused, messages), strict=True):
                log.info("worker_id %d: %s; the bytes were sent instead", pairs[i][0], replies[i])
                replies[i] = reply
        finally:
            # A segment an actor refused is not trusted again (removed, not kept).
            spoiled = {segments[_key(pairs[i][1])].name for i in refused}
            self.shm.release(segments.values(), spoiled)
        self.shm.count(sum(local) - len(refused), len(refused) + sum(near) - sum(local))
        self._hold(pairs, replies, {*striped, *(i for i, shared in enumerate(local) if shared)})
        return replies

    def _striped(self, worker_id: int, enc: EncodedWeights) -> Striped | None:
        """The parts of a push to a remote actor, when it travels striped (``_stripes``)."""
        if not self._may_stripe(worker_id, enc):
            return None
        return self.stripes.striped(enc, CHUNK_BYTES)

    def _may_stripe(self, worker_id: int, enc: EncodedWeights) -> bool:
        """Whether a push to this actor may travel striped: remote, it takes parts, first offer."""
        first = self.stripes.first_offer(worker_id, self._links[worker_id].description.epoch, enc)
        return first and self.accepts_parts(worker_id) and not self.shm.is_local(worker_id)

    def _striped_all(
        self, pairs: Sequence[tuple[int, EncodedWeights]], routed: Sequence[bool]
    ) -> dict[int, Striped]:
        """Per pair striped, its parts (each distinct push split once); ``routed``: not direct."""
        split: dict[tuple, Striped | None] = {}
        striped: dict[int, Striped] = {}
        for i, ((w, enc), other_route) in enumerate(zip(pairs, routed, strict=True)):
            if other_route or not self._may_stripe(w, enc):
                continue
            key = _key(enc)
            if key not in split:
                split[key] = self.stripes.striped(enc, CHUNK_BYTES)
            parts = split[key]
            if parts is not None:
                striped[i] = parts
        self.stripes.count(len(striped))
        return striped

    def _relayed(
        self,
        pairs: Sequence[tuple[int, EncodedWeights]],
        local: Sequence[bool],
        messages: Mapping[tuple, PushMessages],
    ) -> dict[int, Sequence[bytes]]:
        """Per pair relayed (``learner_client._relay``), the messages its actor gets."""
        groups: dict[tuple, list[int]] = {}
        for i, ((_, enc), near) in enumerate(zip(pairs, local, strict=True)):
            if not near:
                groups.setdefault(_key(enc), []).append(i)
        tls = self.conn.channel_credentials is not None
        relayed: dict[int, Sequence[bytes]] = {}
        for key, indices in groups.items():
            size = _nbytes(pairs[indices[0]][1].blob)
            links = [self._links[pairs[i][0]] for i in indices]
            addresses = [link.channel.address for link in links]
            over_tls = [link.description.relays_over_tls for link in links]
            if not self.relay.relays(size, addresses, tls=tls, over_tls=over_tls):
                continue
            chained = self.relay.chain(messages[key], addresses, size)
            relayed.update(zip(indices, chained, strict=True))
        return relayed

    def _resend(
        self,
        pairs: Sequence[tuple[int, EncodedWeights]],
        indices: list[int],
        messages: Mapping[tuple, PushMessages],
    ) -> list[PushReply | BaseException]:
        """The bytes of the pushes whose actors refused their segment (nothing was applied)."""
        if not indices:
            return []
        return self._push_calls(
            [(pairs[i][0], pairs[i][1], messages[_key(pairs[i][1])]) for i in indices]
        )

    def _push_calls(
        self,
        calls: Sequence[tuple[int, EncodedWeights, Sequence[bytes] | Striped]],
        direct: Mapping[int, Sequence[bytes]] | None = None,
    ) -> list[PushReply | BaseException]:
        """Stream each push with its messages, all concurrently; each reply or error.

        A call in ``direct`` (by index) was relayed: if its relayed bytes fail, its actor
        is sent those messages at once.
        """
        direct = direct or {}
        pending = (  # created on the loop, as _settle unpacks them
            self._push_one(w, enc, sent, direct.get(i)) for i, (w, enc, sent) in enumerate(calls)
        )
        rounds = 2 if direct else 1
        return self.loop.run(_settle(pending), rounds * self.conn.call_timeout + _MARGIN)

    async def _push_one(
        self,
        worker_id: int,
        enc: EncodedWeights,
        sent: Sequence[bytes] | Striped,
        direct: Sequence[bytes] | None,
    ) -> PushReply:
        """One actor's push; a relayed one whose bytes failed is sent ``direct`` at once."""
        channel = self._links[worker_id].channel

        async def call(messages: Sequence[bytes] | Striped) -> PushReply:
            if isinstance(messages, Striped):
                return await channel.push_parts(
                    enc.model_id, enc.version, messages.parts, self.conn.call_timeout
                )
            return await channel.push_weights(
                enc.model_id,
                enc.version,
                messages,
                self.conn.call_timeout,
                part=enc.part is not None,
            )

        try:
            return await call(sent)
        except RelayFailedError as exc:
            if direct is None:
                raise
            log.info("worker_id %d: %s; the bytes were sent instead", worker_id, exc)
            self.relay.fell_back(_nbytes(enc.blob))
            return await call(direct)

    def accepts_parts(self, worker_id: int) -> bool:
        """Whether an actor takes multi-part pushes (its Describe gives a part deadline)."""
        return self._links[worker_id].description.part_deadline > 0

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
                self.conn.call_timeout + _MARGIN,
            )
            link.tracker.check_reseeded(first_seq, link.address)
            epoch = link.tracker.epoch or link.description.epoch
            self.ledger.add_discarded(self.mailbox.discard_before(wid, epoch, first_seq))
        return seed

    def state_dict(self, only: Collection[int] | None = None) -> dict[str, Any]:
        """Learner counters plus every owned actor's state blob (a uint8 tensor), by worker_id.

        ``only``: the blobs of those owned actors alone (the others are not asked).
        """
        owned = {w: link for w, link in self.owned_links().items() if only is None or w in only}

        async def fetch() -> list:
            return await asyncio.gather(
                *(link.channel.get_state(self.conn.call_timeout) for link in owned.values())
            )

        blobs = self.loop.run(fetch(), self.conn.call_timeout + _MARGIN)
        return {
            "frames": self.ledger.frames,
            "batches": self.ledger.batches,
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
        counts = check_counts(state_dict["frames"], state_dict["batches"])
        versions = check_versions(state_dict["policy_version"])
        check_models(
            versions, {m for link in self._links.values() for m in link.description.models}
        )
        workers = state_blobs(state_dict["workers"])
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
        self.ledger.restore(*counts)

    def states(self) -> dict[int, str]:
        """Each owned actor's link state name, by worker_id."""
        return {w: link.state.value for w, link in self.owned_links().items()}

    def retry_now(self, worker_ids: Sequence[int]) -> list[int]:
        """Start the reconnection of these owned, down actors now; returns those that retry."""
        links = self.owned_links()

        async def wake() -> list[int]:
            return [w for w in worker_ids if w in links and links[w].retry_now()]

        return self.loop.run(wake(), _MARGIN)

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
                _settle(link.stop(timeout) for link in self._links.values()), timeout + _MARGIN
            )
        except (RlfleetError, RuntimeError) as exc:
            log.warning("closing the actor sessions: %s", exc)
        finally:
            self.shm.close()


async def _settle(calls: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Await every call concurrently (on the loop); failures are returned, not raised."""
    return await asyncio.gather(*calls, return_exceptions=True)


async def _each(links: Iterable[Link], call: Callable[[Link], None]) -> None:
    """Call ``call`` on every link, on the loop (where links run their sessions)."""
    for link in links:
        call(link)


def _messages(enc: EncodedWeights) -> PushMessages:
    return push_messages(
        enc.model_id,
        enc.version,
        enc.blob,
        enc.sha256,
        crc32c=enc.crc32c,
        base_version=enc.base_version,
        part=enc.part,
    )


def _nbytes(blob: Any) -> int:
    return memoryview(blob).nbytes


def _key(enc: EncodedWeights) -> tuple[str, int, int, int | None, object]:
    """What makes two encoded pushes the same bytes on the wire (the blob itself, not its CRC)."""
    return enc.model_id, enc.version, id(enc.blob), enc.base_version, enc.part
