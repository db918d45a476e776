"""Taking the next batch out of the mailbox, sync or async, and the bookkeeping of each one.

Async: the batch that arrived first, from whichever actor (a slow actor
never blocks the others). Sync: one batch from every actor, in worker_id
order, stacked or concatenated; a missing actor raises
:class:`~learner_client._errors.MissingWorkersError` naming it as soon as it is
known to be down or when ``batch_timeout`` runs out, unless partial batches
are allowed. After each batch the frame budget handed to the mailbox
shrinks, so actors are not asked for frames the learner will not use.
"""

from __future__ import annotations

import logging
import math

from tensordict import TensorDictBase

from learner_client._aggregate import combine
from learner_client._errors import MissingWorkersError
from learner_client._fleet import Fleet
from learner_client._mailbox import Delivery
from learner_client._settings import BatchSettings
from learner_client._slabs import PacketSlabs

__all__ = ["Rounds"]

log = logging.getLogger("learner_client")


class Rounds:
    """Produces the collector's batches from the fleet's mailbox.

    Args:
        fleet: The actors and their mailbox.
        settings: How batches are assembled.
        acting_model: The model whose version the policy lag is measured against.

    Attributes:
        missing_workers: Workers absent from the last (partial) sync batch.
        last_workers: Workers that produced the last batch.
    """

    def __init__(self, fleet: Fleet, settings: BatchSettings, acting_model: str) -> None:
        self._fleet = fleet
        self._settings = settings
        self._acting_model = acting_model
        self.missing_workers: list[int] = []
        self.last_workers: list[int] = []
        self._slabs = PacketSlabs()
        self._slab_layout: tuple[int, ...] = ()

    def exhausted(self) -> bool:
        """Whether ``total_frames`` were delivered."""
        s = self._settings
        return not s.endless and self._fleet.ledger.frames >= s.total_frames

    def update_budget(self) -> None:
        """Tell the mailbox how many more batches (async) or rounds (sync) are wanted."""
        s = self._settings
        if s.endless:
            self._fleet.mailbox.set_budget(None, per_worker=s.sync)
            return
        remaining = max(0, s.total_frames - self._fleet.ledger.frames)
        self._fleet.mailbox.set_budget(math.ceil(remaining / s.frames_per_batch), per_worker=s.sync)

    def take(self) -> TensorDictBase:
        """The next batch (may raise ``Paused`` from the mailbox).

        Raises:
            MissingWorkersError: Sync: actors missing (see the module docstring).
                Async: no actor delivered anything within ``batch_timeout``.
        """
        deliveries = self._take_sync() if self._settings.sync else self._take_async()
        return self._finish(deliveries)

    def _take_async(self) -> list[Delivery]:
        delivery = self._fleet.mailbox.take_any(self._settings.batch_timeout)
        if delivery is None:
            states = self._fleet.states()
            raise MissingWorkersError(
                f"no actor delivered a batch within batch_timeout={self._settings.batch_timeout} "
                f"s (actor states: {states})",
                worker_ids=list(states),
            )
        return [delivery]

    def _attach_slabs(self) -> None:
        """Have each actor's frames land in its slot of shared slabs (stacked by viewing)."""
        s = self._settings
        if s.cat_results != "stack" or s.split_trajs:
            return
        layout = tuple(self._fleet.worker_ids)
        links = self._fleet.links
        if layout == self._slab_layout and all(
                links[w].channel.packet_allocator is not None for w in layout):  # fmt: skip
            return
        for position, worker_id in enumerate(layout):
            links[worker_id].channel.packet_allocator = self._slabs.allocator(position, len(layout))
        self._slab_layout = layout

    def _take_sync(self) -> list[Delivery]:
        self._attach_slabs()
        mailbox = self._fleet.mailbox
        mailbox.want_round()
        taken, missing = mailbox.take_round(
            self._fleet.worker_ids,
            self._settings.batch_timeout,
            partial=self._settings.allow_partial_batches,
        )
        if not taken:
            states = self._fleet.states()
            raise MissingWorkersError(
                f"sync batch incomplete: worker_ids {missing} sent nothing within "
                f"batch_timeout={self._settings.batch_timeout} s or are down (actor states: "
                f"{ {w: states[w] for w in missing} })",
                worker_ids=missing,
            )
        if missing:
            log.warning("partial sync batch without worker_ids %s", missing)
        self.missing_workers = missing
        return taken

    def _finish(self, deliveries: list[Delivery]) -> TensorDictBase:
        fleet = self._fleet
        acting = fleet.book.versions().get(self._acting_model, 0)
        lag = max(0, acting - min(d.version_min for d in deliveries))
        fleet.ledger.delivered({d.worker_id: d.frames for d in deliveries}, lag)
        for delivery in deliveries:
            fleet.book.count_batch(delivery.worker_id)
        self.last_workers = [d.worker_id for d in deliveries]
        self.update_budget()
        if not self._settings.sync:
            return deliveries[0].batch
        return combine(
            [d.batch for d in deliveries],
            cat_results=self._settings.cat_results,
            split_trajs=self._settings.split_trajs,
        )
