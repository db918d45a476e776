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

import dataclasses
import logging
import math

from tensordict import TensorDictBase

from common.llm import check_padded, merge_padded
from learner_client._aggregate import WORKER_ID_KEY, combine
from learner_client._errors import MissingWorkersError
from learner_client._fleet import Fleet
from learner_client._ledger import Ledger
from learner_client._mailbox import Delivery, Mailbox
from learner_client._metrics import LearnerMetrics
from learner_client._settings import BatchSettings
from learner_client._slabs import PacketSlabs
from learner_client._weights import WeightBook

__all__ = ["Rounds"]

log = logging.getLogger("learner_client")


@dataclasses.dataclass(eq=False)
class Rounds:
    """Produces the collector's batches from the mailbox.

    Attributes:
        settings: How batches are assembled.
        acting_model: The model whose version the policy lag is measured against.
        fleet: The actors (their worker_ids and states).
        mailbox: Where the batches wait.
        ledger: Counts what is delivered.
        book: The policy versions, and each worker's batches since its last update.
        slabs: The shared slabs sync rounds are received into.
        metrics: Observes how long each take waited for its batch (user code's wait).
        missing_workers: Workers absent from the last (partial) sync batch.
        last_workers: Workers that produced the last batch.
    """

    settings: BatchSettings
    acting_model: str
    _: dataclasses.KW_ONLY
    fleet: Fleet
    mailbox: Mailbox
    ledger: Ledger
    book: WeightBook
    slabs: PacketSlabs
    metrics: LearnerMetrics
    missing_workers: list[int] = dataclasses.field(default_factory=list, init=False)
    last_workers: list[int] = dataclasses.field(default_factory=list, init=False)

    def _remaining_frames(self) -> int | None:
        s = self.settings
        return None if s.endless else int(s.total_frames or 0) - self.ledger.frames

    def exhausted(self) -> bool:
        """Whether ``total_frames`` were delivered."""
        remaining = self._remaining_frames()
        return remaining is not None and remaining <= 0

    def update_budget(self) -> None:
        """Tell the mailbox how many more batches (async) or rounds (sync) are wanted."""
        s, remaining = self.settings, self._remaining_frames()
        budget = None if remaining is None else math.ceil(max(0, remaining) / s.frames_per_batch)
        self.mailbox.set_budget(budget, per_worker=bool(s.sync))

    def take(self) -> TensorDictBase:
        """The next batch (may raise ``Paused`` from the mailbox).

        Raises:
            MissingWorkersError: Sync: actors missing (see the module docstring).
                Async: no actor delivered anything within ``batch_timeout``.
        """
        parts = self.take_parts()
        if self.settings.llm is not None:
            return merge_padded(parts)
        if not self.settings.sync:
            return parts[0]
        cat = "stack" if self.settings.cat_results is None else self.settings.cat_results
        return combine(parts, cat_results=cat, split_trajs=bool(self.settings.split_trajs))

    def take_parts(self) -> list[TensorDictBase]:
        """The next batch as each actor sent it (``[envs, time]``), in worker_id order.

        A replay buffer is extended with these, as TorchRL's multi-worker collectors
        extend it with each worker's batch. Raises as :meth:`take`.
        """
        take = self._take_sync if self.settings.sync else self._take_async
        deliveries = self.metrics.waited_for(take)
        if self.settings.llm is not None:
            for delivery in deliveries:  # a hostile LLM batch is refused before anything counts
                check_padded(delivery.batch.exclude(WORKER_ID_KEY))
        self._account(deliveries)
        return [d.batch for d in deliveries]

    def _take_async(self) -> list[Delivery]:
        delivery = self.mailbox.take_any(self.settings.batch_timeout)
        if delivery is None:
            states = self.fleet.states()
            raise MissingWorkersError(
                f"no actor delivered a batch within batch_timeout={self.settings.batch_timeout} "
                f"s (actor states: {states})",
                worker_ids=list(states),
            )
        return [delivery]

    def _take_sync(self) -> list[Delivery]:
        worker_ids = self.fleet.worker_ids
        self.slabs.set_layout(worker_ids)  # each actor's packets land in its slot of the slabs
        if self.settings.on_demand:
            self._drop_older_shares(worker_ids)
        self.mailbox.want_round()
        taken, missing = self.mailbox.take_round(
            worker_ids,
            self.settings.batch_timeout,
            partial=self.settings.allow_partial_batches,
        )
        if not taken:
            states = self.fleet.states()
            raise MissingWorkersError(
                f"sync batch incomplete: worker_ids {missing} sent nothing within "
                f"batch_timeout={self.settings.batch_timeout} s or are down (actor states: "
                f"{ {w: states[w] for w in missing} })",
                worker_ids=missing,
            )
        if missing:
            log.warning("partial sync batch without worker_ids %s", missing)
        self.missing_workers = missing
        return taken

    def _drop_older_shares(self, worker_ids: list[int]) -> None:
        """Drop shares collected with weights older than each actor now holds.

        An abandoned round (a missing actor) leaves the others' shares buffered; the
        round after a weight push must act entirely with the new weights.
        """
        dropped = 0
        for wid in worker_ids:
            applied = self.book.applied(wid).get(self.acting_model, 0)
            dropped += self.mailbox.discard_older(wid, applied)
        if dropped:
            log.info("dropped %d sync shares collected before a weight push", dropped)
            self.ledger.add_discarded(dropped)

    def _account(self, deliveries: list[Delivery]) -> None:
        acting = self.book.versions().get(self.acting_model, 0)
        lag = max(0, acting - min(d.version_min for d in deliveries))
        self.ledger.delivered({d.worker_id: d.frames for d in deliveries}, lag)
        for delivery in deliveries:
            self.book.count_batch(delivery.worker_id)
        self.last_workers = [d.worker_id for d in deliveries]
        self.update_budget()
