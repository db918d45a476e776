"""How the learner's parts are wired, drawn once: user thread → mailbox ← loop thread.

::

    user thread                               loop thread (LoopThread)
    GrpcCollector ── Rounds ──take──▶ Mailbox ◀──put── ActorLink ──▶ CollectStream ──▶ actor
                 └── Pusher ──push──▶ Fleet ──────────────────────▶ ActorChannel  ──▶ actor
                      Mailbox ── credits, acks ──▶ OpenStreams ──▶ CollectStream

:func:`assemble` builds every part once and hands each one exactly what it
uses; nothing reaches another part through a third.
"""

from __future__ import annotations

from typing import NamedTuple

from learner_client._collect_stream import OpenStreams
from learner_client._fleet import Fleet
from learner_client._ledger import Ledger
from learner_client._loop import LoopThread
from learner_client._mailbox import Mailbox
from learner_client._pushes import Pusher
from learner_client._rounds import Rounds
from learner_client._settings import BatchSettings, ConnectionSettings
from learner_client._slabs import PacketSlabs
from learner_client._weights import WeightBook

__all__ = ["Parts", "assemble"]


class Parts(NamedTuple):
    """The learner's parts, as :func:`assemble` wired them."""

    loop: LoopThread
    mailbox: Mailbox
    ledger: Ledger
    book: WeightBook
    fleet: Fleet
    pusher: Pusher
    rounds: Rounds

    def close(self, timeout: float) -> None:
        """Wake the consumer, end every session, then stop the loop thread (bounded)."""
        self.mailbox.close()
        self.fleet.close(timeout)
        self.loop.close(timeout)


def assemble(batch: BatchSettings, acting_model: str, conn: ConnectionSettings) -> Parts:
    """Build the loop thread, the mailbox and every collaborator (the loop thread starts).

    Args:
        batch: How batches are assembled.
        acting_model: The model whose version the policy lag is measured against.
        conn: Channels, deadlines and credits.
    """
    loop = LoopThread()
    ledger, book = Ledger(), WeightBook()
    streams = OpenStreams(loop)
    mailbox = Mailbox(batch.window, streams.grant, streams.ack, lazy=batch.on_demand)
    stacked = batch.sync and batch.cat_results == "stack" and not batch.split_trajs
    slabs = PacketSlabs() if stacked else None
    fleet = Fleet(
        conn,
        loop=loop,
        mailbox=mailbox,
        streams=streams,
        ledger=ledger,
        book=book,
        batch_timeout=batch.batch_timeout,
        slabs=slabs,
    )
    pusher = Pusher(fleet, book, ledger)
    rounds = Rounds(
        batch, acting_model, fleet=fleet, mailbox=mailbox, ledger=ledger, book=book, slabs=slabs
    )
    return Parts(loop, mailbox, ledger, book, fleet, pusher, rounds)
