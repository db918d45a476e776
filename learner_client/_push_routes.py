"""How a push reaches each actor: a segment on this host, a relay chain, stripes, or its bytes.

:class:`PushRoutes` sends a fleet's pushes, all concurrently, each by the route that
suits its actor: actors on the learner's host read the blob from a shared-memory segment
written once for all of them (``learner_client._shm``); remote actors of one push may
receive it down a chain of actors (``learner_client._relay``) or striped over parallel
streams (``learner_client._stripes``); any other gets the bytes. A route that fails falls
back to the bytes for that push alone. It also remembers which actors applied a whole
push's bytes, so that such a peer can catch up an actor that returns. The
:class:`~learner_client._fleet.Fleet` owns the links and lends them to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from common.config import CHUNK_BYTES
from common.errors import RelayFailedError, RlfleetError
from learner_client._link import Link
from learner_client._loop_thread import WAIT_MARGIN_S, LoopThread, settle
from learner_client._relay import RelayRoute
from learner_client._settings import ConnectionSettings
from learner_client._shm import ShmRefusedError, ShmRoute
from learner_client._stripes import Striped, StripeRoute
from learner_client._transport import PushMessages, PushReply, push_messages, shm_messages
from learner_client._weights import EncodedWeights

__all__ = ["PushRoutes"]

log = logging.getLogger("learner_client")


@dataclasses.dataclass(eq=False, repr=False)  # no repr: conn holds the bearer token
class PushRoutes:
    """The routes of a fleet's pushes, over the fleet's links.

    Attributes:
        conn: Connection settings (the per-call deadline; whether channels use TLS).
        loop: The event-loop thread every call runs on.
        links: The fleet's links by worker_id (the fleet's own mapping, kept current).
        reachable: Whether an actor's link is up (the fleet's rule).
        shm: Which actors share this host; pushes to them travel through shared memory.
        relay: Which pushes to remote actors travel down a chain of actors.
        stripes: Which pushes to a remote actor travel striped over parallel streams.
    """

    conn: ConnectionSettings
    loop: LoopThread
    links: Mapping[int, Link]
    reachable: Callable[[int], bool]
    shm: ShmRoute
    relay: RelayRoute
    stripes: StripeRoute
    #: Per model, the last whole push's bytes (its key) and the workers that applied them.
    _holders: dict[str, tuple[tuple, frozenset[int]]] = dataclasses.field(
        default_factory=dict, init=False
    )

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
        peers = [w for w in sorted(held[1]) if w != link.worker_id and w in self.links]
        peer = next((self.links[w] for w in peers if self.reachable(w)), None)
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
        first = self.stripes.first_offer(worker_id, self.links[worker_id].description.epoch, enc)
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
            links = [self.links[pairs[i][0]] for i in indices]
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
        pending = (  # created on the loop, as settle unpacks them
            self._push_one(w, enc, sent, direct.get(i)) for i, (w, enc, sent) in enumerate(calls)
        )
        rounds = 2 if direct else 1
        return self.loop.run(settle(pending), rounds * self.conn.call_timeout + WAIT_MARGIN_S)

    async def _push_one(
        self,
        worker_id: int,
        enc: EncodedWeights,
        sent: Sequence[bytes] | Striped,
        direct: Sequence[bytes] | None,
    ) -> PushReply:
        """One actor's push; a relayed one whose bytes failed is sent ``direct`` at once."""
        channel = self.links[worker_id].channel

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
        return self.links[worker_id].description.part_deadline > 0


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
