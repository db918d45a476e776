"""What the collector yields: the next batch, laid out as TorchRL's, on its storing device.

Each batch is taken from the mailbox and counted in the ledger. Async: the batch that
arrived first, from whichever actor (a slow actor never blocks the others). Sync: one batch
from every actor, in worker_id order; a missing actor raises
:class:`~learner_client._errors.MissingWorkersError` naming it as soon as it is known to be
down or when ``batch_timeout`` runs out, unless partial batches are allowed. After each
batch the frame budget handed to the mailbox shrinks, so actors are not asked for frames the
learner will not use (but for one spare batch an idle actor is asked for when an async take
waits on slower actors for the budget's last batches).

The layout follows TorchRL's ``MultiSyncCollector`` (``docs/collector.md``, sync and async
batches): ``("collector", "worker_id")`` on every batch (the link tags each one as it
arrives), the last dim named ``"time"``, sync batches stacked in worker_id order (a lazy
stack, with a warning, when the actors' shapes or entries differ), concatenated with
``cat_results=0``, or zero-padded trajectories with ``split_trajs``. A stacked entry whose
per-actor tensors were received into one slab (:mod:`learner_client._slabs`) is a strided
view of it rather than a copy, so it is not contiguous (``view`` across dim 0 needs
``.contiguous()`` first).

Where batches are delivered is TorchRL's ``device`` / ``storing_device``: a batch is yielded
(and stored in a replay buffer) on ``storing_device``, or on ``device`` when only that is
given. On a fleet these name the learner's side alone: the actors keep the device they were
started with (``--device``), and ``policy_device`` / ``env_device`` are what a session asks
of them. On CUDA the packets are received into pinned slabs and every batch goes to the
device in one ``non_blocking`` copy per tensor, enqueued on the calling thread's current
stream: kernels the user launches on that stream afterwards see the data, and nothing on the
host waits for the copy. The host batch is kept until the copy is done (a CUDA event is
recorded after it), so its slab is never overwritten while a copy still reads it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import tensordict
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from common.config import local_device
from common.llm import merge_padded
from learner_client._errors import MissingWorkersError
from learner_client._ledger import Ledger
from learner_client._mailbox import Delivery, Mailbox, Resplit
from learner_client._metrics import LearnerMetrics
from learner_client._settings import BatchSettings
from learner_client._slabs import PacketSlabs
from learner_client._torchrl_compat import one_device
from learner_client._weights import WeightBook

__all__ = [
    "LLM_COUNTS",
    "Placement",
    "Rounds",
    "WORKER_ID_KEY",
    "combine",
    "entries_apart",
    "llm_counts",
    "name_time_dim",
    "tag_worker",
]

log = logging.getLogger("learner_client")


class Actors(Protocol):
    """What rounds need of the fleet (:class:`~learner_client._fleet.Fleet` is the real one)."""

    @property
    def worker_ids(self) -> list[int]:
        """The worker_ids this collector collects from, sorted."""
        ...

    def states(self) -> dict[int, str]:
        """Each actor's link state name, by worker_id."""
        ...

    def last_failures(self) -> dict[int, str]:
        """The last failure of each actor that had one, by worker_id."""
        ...

    def retry_now(self, worker_ids: Sequence[int]) -> list[int]:
        """Start the reconnection of these down actors now; returns those that retry."""
        ...


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
    fleet: Actors
    mailbox: Mailbox
    ledger: Ledger
    book: WeightBook
    slabs: PacketSlabs
    metrics: LearnerMetrics
    missing_workers: list[int] = dataclasses.field(default_factory=list, init=False)
    last_workers: list[int] = dataclasses.field(default_factory=list, init=False)
    _warned_apart: set[str] = dataclasses.field(default_factory=set, init=False, repr=False)
    #: The batch taken last while it is being laid out (None once the next take begins),
    #: and whether it is to be taken again (an interrupt kept it from the user).
    _taken: list[Delivery] | None = dataclasses.field(default=None, init=False, repr=False)
    _again: bool = dataclasses.field(default=False, init=False, repr=False)

    def _remaining_frames(self) -> int | None:
        s = self.settings
        return None if s.endless else int(s.total_frames or 0) - self.ledger.frames

    def exhausted(self) -> bool:
        """Whether ``total_frames`` were delivered (and no batch is to be taken again)."""
        remaining = self._remaining_frames()
        again = self._taken is not None and self._again and not self._stale(self._taken)
        return remaining is not None and remaining <= 0 and not again

    def take_again(self) -> None:
        """Give the batch taken last again: an interrupt (Ctrl-C) kept it from the user.

        Counted once; nothing when the interrupt came before a batch was taken. A sync
        batch that acts with weights older than the last push is dropped instead
        (``discarded``): the round after a push acts with it.
        """
        self._again = self._taken is not None

    def handed_out(self) -> None:
        """The batch taken last reached the user: it is never taken again."""
        self._taken, self._again = None, False

    def update_budget(self) -> None:
        """Tell the mailbox how many more batches (async) or rounds (sync) are wanted."""
        s, remaining = self.settings, self._remaining_frames()
        budget = None if remaining is None else s.batches_for(max(0, remaining))
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
        split = bool(self.settings.split_trajs)
        try:
            return combine(parts, cat_results=cat, split_trajs=split)
        except (RuntimeError, KeyError):  # what tensordict raises for batches apart
            apart = entries_apart(parts)  # only then: the rounds that stack pay nothing
            if apart is None:
                raise
        named = f"sync batch of worker_ids {self.last_workers}: {apart}"
        if cat != "stack" or split:
            raise ValueError(
                f"{named}; cat_results=0 and split_trajs need every actor's batch to hold "
                "the same entries (start the actors with the same env and policy)"
            )
        if apart not in self._warned_apart:
            self._warned_apart.add(apart)
            log.warning("%s; yielding a lazy stack, as TorchRL's MultiSyncCollector", named)
        return combine(parts, cat_results=cat, split_trajs=split, dense=False)

    def take_parts(self) -> list[TensorDictBase]:
        """The next batch as each actor sent it (``[envs, time]``), in worker_id order.

        A replay buffer is extended with these, as TorchRL's multi-worker collectors
        extend it with each worker's batch. Raises as :meth:`take`.
        """
        again, self._taken, self._again = self._taken if self._again else None, None, False
        if again is not None and not self._stale(again):
            self._taken = again
            return [d.batch for d in again]
        if again is not None:
            log.info("dropped a sync batch taken before a weight push and never handed out")
            self.ledger.withdrawn({d.worker_id: d.frames for d in again}, self._extra(again))
            self.update_budget()
        take = self._take_sync if self.settings.sync else self._take_async
        deliveries = self.metrics.waited_for(take)
        self._account(deliveries)
        self._taken = deliveries
        return [d.batch for d in deliveries]

    def _stale(self, deliveries: list[Delivery]) -> bool:
        """Whether a sync batch on demand acts with weights older than its actors should hold.

        Each share against its own actor's floor (the mailbox's, ``WeightBook.should_hold``),
        which a push since the take raises; not against the acting version, the highest any
        actor holds, which a fleet of actors at different versions never all reach.
        """
        if not (self.settings.sync and self.settings.on_demand):
            return False
        hold = self.book.should_hold
        return any(d.version_min < hold(d.worker_id, self.acting_model) for d in deliveries)

    def _take_async(self) -> list[Delivery]:
        delivery = self.mailbox.take_any(self.settings.batch_timeout)
        if delivery is None:
            states = self.fleet.states()
            raise MissingWorkersError(
                f"no actor delivered a batch within batch_timeout={self.settings.batch_timeout} "
                f"s (actor states: {states}){self._failures_of(list(states))}",
                worker_ids=list(states),
            )
        return [delivery]

    def _take_sync(self) -> list[Delivery]:
        """One sync batch, over the fleet as it is when the batch is taken.

        A round begun before the fleet was resplit (an actor joined) starts over: its
        actors' shares of the new split are each a share of the grown fleet's batch.
        """
        while True:
            try:
                return self._take_round(self.mailbox.splits)
            except Resplit:
                log.info("a sync round begun before actors joined starts over")

    def _take_round(self, split: int) -> list[Delivery]:
        """One sync batch over the fleet's actors now, taken under the fleet's split ``split``."""
        worker_ids = self.fleet.worker_ids
        self.slabs.set_layout(worker_ids)  # each actor's packets land in its slot of the slabs
        if self.settings.on_demand:
            self._drop_older_shares(worker_ids)
        if not self.settings.allow_partial_batches:  # a partial round goes on without them
            self._retry_down(worker_ids)
        self.mailbox.want_round()
        taken, missing = self.mailbox.take_round(
            worker_ids,
            self.settings.batch_timeout,
            partial=self.settings.allow_partial_batches,
            split=split,
        )
        if not taken:
            raise self._incomplete(missing)
        if missing:
            log.warning("partial sync batch without worker_ids %s", missing)
        self.missing_workers = missing
        return taken

    def _retry_down(self, worker_ids: list[int]) -> None:
        """Wake the reconnection of the actors known to be down, for the round to wait on.

        One may be back already (restarted: ``LocalFleet.restart``, a pod) while its link
        sleeps in its backoff; the round fails on it only once that attempt has failed. Marked
        before the wake, so an attempt that ends at once still clears the mark.
        """
        down = self.mailbox.down(worker_ids)
        if not down:
            return
        self.mailbox.set_retrying(down, True)
        woken = self.fleet.retry_now(down)
        self.mailbox.set_retrying([w for w in down if w not in woken], False)

    def _incomplete(self, missing: list[int]) -> MissingWorkersError:
        """The error of a strict round that lacks ``missing``: the down actors, then the late."""
        states = self.fleet.states()
        down = self.mailbox.down(missing)
        late = [w for w in missing if w not in down]
        timeout = self.settings.batch_timeout
        parts = [f"worker_ids {down} are down"] if down else []
        if late:
            parts.append(
                f"worker_ids {late} had not delivered their share yet"
                if down
                else f"worker_ids {late} sent nothing within batch_timeout={timeout} s"
            )
        return MissingWorkersError(
            f"sync batch incomplete: {'; '.join(parts)} (actor states: "
            f"{ {w: states[w] for w in missing} }){self._failures_of(missing)}",
            worker_ids=down or missing,
        )

    def _failures_of(self, worker_ids: list[int]) -> str:
        """What the missing ``worker_ids`` last failed with, to end an error's message."""
        failures = self.fleet.last_failures()
        named = [f"worker_id {w}: {failures[w]}" for w in worker_ids if w in failures]
        return "; last failures: " + "; ".join(named) if named else ""

    def _drop_older_shares(self, worker_ids: list[int]) -> None:
        """Drop shares collected with weights older than each actor now holds.

        An abandoned round (a missing actor) leaves the others' shares buffered; the
        round after a weight push must act entirely with the new weights. The mailbox
        holds each actor's version floor (wired from the weight book), so shares that
        arrive later, or that a returning actor re-sends after its catch-up, meet it too.
        """
        dropped = self.mailbox.discard_older(worker_ids)
        if dropped:
            log.info("dropped %d sync shares collected before a weight push", dropped)
            self.ledger.add_discarded(dropped)

    def _extra(self, deliveries: list[Delivery]) -> dict[str, int] | None:
        """The ledger's extra counts of a batch: an LLM collection's (:data:`LLM_COUNTS`)."""
        return None if self.settings.llm is None else llm_counts(d.batch for d in deliveries)

    def _account(self, deliveries: list[Delivery]) -> None:
        acting = self.book.versions().get(self.acting_model, 0)
        lag = max(0, acting - min(d.version_min for d in deliveries))
        frames = {d.worker_id: d.frames for d in deliveries}
        self.ledger.delivered(frames, lag, self._extra(deliveries))
        for delivery in deliveries:
            self.book.count_batch(delivery.worker_id)
        self.last_workers = [d.worker_id for d in deliveries]
        self.update_budget()


#: The counts an LLM collection keeps beside frames and batches (``GrpcLLMCollector``'s
#: ``stats()`` and ``state_dict()``): the turns taken for the user (with
#: ``yield_only_last_steps`` the last ones only) and their response tokens.
LLM_COUNTS = ("yielded_turns", "tokens")


def llm_counts(batches: Iterable[TensorDictBase]) -> dict[str, int]:
    """:data:`LLM_COUNTS` of checked padded LLM batches (the parts of one batch)."""
    turns = tokens = 0
    for batch in batches:
        turns += batch.numel()
        tokens += int(batch.get("response_len").sum())
    return {"yielded_turns": turns, "tokens": tokens}


# ------------------------------------------------------------- batch layout

WORKER_ID_KEY = ("collector", "worker_id")
_TRAJ_IDS_KEY = ("collector", "traj_ids")


def name_time_dim(batch: TensorDictBase) -> TensorDictBase:
    """Name the last batch dim ``"time"`` (and the others None), in place."""
    ndim = batch.batch_dims
    if ndim and batch.names != [None] * (ndim - 1) + ["time"]:
        batch.names = [None] * (ndim - 1) + ["time"]
    return batch


def tag_worker(batch: TensorDictBase, worker_id: int) -> TensorDictBase:
    """Add ``("collector", "worker_id")`` filled with ``worker_id``, in place.

    The entry has the shape of ``("collector", "traj_ids")`` when present, else
    the batch shape, so the two index the same frames.
    """
    traj_ids = batch.get(_TRAJ_IDS_KEY, None)
    shape = traj_ids.shape if traj_ids is not None else batch.batch_size
    batch.set(WORKER_ID_KEY, torch.full(shape, worker_id, dtype=torch.int64))
    return batch


def entries_apart(batches: Sequence[TensorDictBase]) -> str | None:
    """What keeps per-actor ``batches`` from one dense stack, in words; None when nothing.

    Batches stack densely when they hold the same entries with the same shapes past their
    batch dims (dtypes are promoted). Actors started with other envs or policies, or a
    peer sending what no actor of this fleet sends, differ; the words name the entries.
    """
    leaves = [
        {key: tuple(value.shape[b.batch_dims :]) for key, value in b.items(True, True)}
        for b in batches
    ]
    first = leaves[0]
    for index, other in enumerate(leaves[1:], start=1):
        if other == first:
            continue
        only_first = sorted(map(str, first.keys() - other.keys()))[:5]
        only_other = sorted(map(str, other.keys() - first.keys()))[:5]
        shaped = sorted(str(k) for k in first.keys() & other.keys() if first[k] != other[k])[:5]
        return (
            f"batch {index} in worker_id order differs from the first: entries only in the "
            f"first {only_first}, only in it {only_other}, of other shapes {shaped}"
        )
    return None


def combine(
    batches: Sequence[TensorDictBase],
    *,
    cat_results: str | int,
    split_trajs: bool,
    dense: bool = True,
) -> TensorDictBase:
    """Assemble one sync batch from per-actor batches (already in worker_id order).

    Args:
        batches: One tagged batch per actor.
        cat_results: ``"stack"`` or ``0``.
        split_trajs: The batches are split trajectories ``[trajs, time]``.
        dense: False when :func:`entries_apart` found the batches apart: stacked lazily.

    Returns:
        The stacked or concatenated batch, last dim named ``"time"``.

    Raises:
        ValueError: No batches.
    """
    if not batches:
        raise ValueError("cannot combine zero batches")
    if split_trajs:
        return name_time_dim(torch.cat(_pad_time(batches), 0))
    if cat_results == 0:
        return name_time_dim(torch.cat(list(batches), 0))
    if not dense or len({tuple(b.batch_size) for b in batches}) > 1:
        # Actors with different env pool sizes give different [envs, time]
        # shapes, others other entries; TorchRL's MultiSyncCollector returns a
        # lazy stack then too (maybe_dense_stack).
        return LazyStackedTensorDict.lazy_stack(list(batches), 0)
    out = _stack_views(batches)
    return name_time_dim(torch.stack(list(batches), 0) if out is None else out)


def _stack_views(batches: Sequence[TensorDictBase]) -> TensorDictBase | None:
    """``torch.stack(batches, 0)`` that views, rather than copies, the entries that allow it.

    An entry whose per-batch tensors lie in one storage at a constant distance
    (frames received into one slab, see :mod:`learner_client._slabs`), or that one
    actor's batch holds alone, becomes one view; other entries are stacked (copied).
    Returns None when the structure is not plain tensors in plain tensordicts with
    identical keys, for ``torch.stack`` to handle (and report) instead.
    """
    first = batches[0]
    keys = set(first.keys())
    if any(type(b) is not TensorDict or set(b.keys()) != keys for b in batches):
        return None
    out = {}
    for key in first.keys():  # noqa: SIM118 (iterating a tensordict walks dim 0, not keys)
        values = [b.get(key) for b in batches]
        if all(type(v) is torch.Tensor for v in values):
            out[key] = _view_stack(values)
        elif all(type(v) is TensorDict for v in values):
            sub = _stack_views(values)
            if sub is None:
                return None
            out[key] = sub
        else:
            return None
    return TensorDict(out, batch_size=[len(batches), *first.batch_size])


def _view_stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    if len(tensors) == 1:  # one actor: its batch is the round's, viewed with a dim in front
        return first.unsqueeze(0)
    if first.numel():
        step = tensors[1].data_ptr() - first.data_ptr()
        storage = first.untyped_storage().data_ptr()
        # The views must not overlap: each batch's tensor ends before the next starts.
        span = first.element_size() * (
            1 + sum((n - 1) * st for n, st in zip(first.shape, first.stride(), strict=True))
        )
        if (
            step >= span
            and step % first.element_size() == 0
            and all(
                t.dtype == first.dtype
                and t.shape == first.shape
                and t.stride() == first.stride()
                and t.untyped_storage().data_ptr() == storage
                and t.data_ptr() - first.data_ptr() == i * step
                for i, t in enumerate(tensors)
            )
        ):
            stride = (step // first.element_size(), *first.stride())
            return first.as_strided((len(tensors), *first.shape), stride)
    return torch.stack(tensors, 0)


def _pad_time(batches: Sequence[TensorDictBase]) -> list[TensorDictBase]:
    longest = max(b.batch_size[-1] for b in batches)
    padded = []
    for batch in batches:
        missing = longest - batch.batch_size[-1]
        padded.append(tensordict.pad(batch, [0, 0, 0, missing]) if missing else batch)
    return padded


# ---------------------------------------------------------- storing device


def _local_or_none(name: str, value: object) -> torch.device | None:
    return None if value is None else local_device(value, name)


class Placement:
    """Moves each delivered batch to the learner's storing device (then ``layout``, if set).

    Args:
        device: TorchRL's ``device``: the storing device when ``storing_device`` is None.
        storing_device: Where batches are delivered; None and ``device`` None: as received
            (on the host).

    Raises:
        ValueError: Not a device, or a CUDA device this process does not have.
    """

    def __init__(self, device: Any = None, storing_device: Any = None) -> None:
        storing = one_device("storing_device", storing_device, _local_or_none)
        self.device = one_device("device", device, _local_or_none) if storing is None else storing
        self._in_flight: collections.deque[tuple[torch.cuda.Event, TensorDictBase]] = (
            collections.deque()
        )
        #: A step after the move (``GrpcLLMCollector``'s layout): part of the take, so an
        #: interrupt (Ctrl-C) during it keeps the batch for the next take, as one during the move.
        self.layout: Callable[[TensorDictBase], TensorDictBase] | None = None

    @property
    def pin_memory(self) -> bool:
        """Whether received packets should land in pinned host memory (a CUDA target)."""
        return self.device is not None and self.device.type == "cuda"

    def place(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the storing device, then through :attr:`layout` when one is set."""
        placed = self._move(batch)
        return placed if self.layout is None else self.layout(placed)

    def _move(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the storing device (as received when None).

        On the host its tensors stay where they are; the batch names the device, as
        TorchRL's batches do when ``device`` or ``storing_device`` is given.
        """
        device = self.device
        if device is None or batch.device == device:
            return batch
        if device.type == "cpu":
            return batch.to(device)  # no copy: the tensors are on the host already
        if device.type != "cuda":
            return batch.to(device)
        stream = torch.cuda.current_stream(device)
        placed = batch.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        self._forget_finished()
        self._in_flight.append((done, batch))
        return placed

    def _forget_finished(self) -> None:
        """Let go of host batches whose copies are done (their slabs become reusable)."""
        while self._in_flight and self._in_flight[0][0].query():
            self._in_flight.popleft()

    def __repr__(self) -> str:
        return f"Placement(device={self.device})"
