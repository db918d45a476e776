"""What a collector tells and restores about its fleet: membership, seeds, state, stats.

:class:`FleetState` is the part of :class:`~learner_client.GrpcCollector` that reads,
grows or resets the fleet between batches, as TorchRL's collectors do for their workers
(``set_seed``, ``state_dict``, ``stats``, ``add_collectors``, the workers' ids and link
states), and names this collector's learner rank. It works on the parts
:mod:`learner_client._wiring` built, which the collector sets in ``_connect``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from torch import nn

from common.config import CollectSettings, check_seed
from learner_client._background import Background
from learner_client._fleet import Fleet, RemoteActor
from learner_client._members import Ranks, actor_state_of
from learner_client._rounds import Rounds
from learner_client._settings import BatchSettings, RolloutSettings, check_addresses
from learner_client._shared_policy import SharedPolicy
from learner_client._stats import snapshot
from learner_client._weights import WeightBook

__all__ = ["FleetState"]


class FleetState:
    """Membership views, seeding, checkpointing and stats of a collector's fleet."""

    _lock: threading.RLock
    _fleet: Fleet
    _rounds: Rounds
    _book: WeightBook
    _batch: BatchSettings
    _rollout: RolloutSettings
    _background: Background
    _ranks: Ranks

    _shared: SharedPolicy | None

    def _check_open(self) -> None:
        raise NotImplementedError

    def _is_running(self) -> bool:
        raise NotImplementedError

    @property
    def rank(self) -> int:
        """This collector's learner rank (0 for a single learner)."""
        return self._ranks.rank

    @property
    def world_size(self) -> int:
        """Learner ranks sharing the fleet (1 for a single learner)."""
        return self._ranks.world_size

    @property
    def member_ids(self) -> list[int]:
        """Every actor of the fleet this collector knows, owned or not, sorted."""
        return self._fleet.member_ids

    @property
    def total_frames(self) -> int:
        """Frames after which iteration stops (``-1``: endless), as TorchRL's attribute."""
        return int(self._batch.total_frames or -1)

    @property
    def frames_per_batch(self) -> int:
        """Frames per yielded batch (sync: over the whole fleet)."""
        return self._batch.frames_per_batch

    @property
    def requested_frames_per_batch(self) -> int:
        """TorchRL's name of :attr:`frames_per_batch` (rlfleet never rounds it up)."""
        return self._batch.frames_per_batch

    @property
    def init_random_frames(self) -> int:
        """Random-action frames this collector asks of the fleet (``-1``: none)."""
        return int(self._rollout.init_random_frames or -1)

    @property
    def policy(self) -> nn.Module | None:
        """The learner's policy given as ``policy=`` (what the actors follow), or None."""
        return None if self._shared is None else self._shared.module

    @property
    def missing_workers(self) -> list[int]:
        """Worker_ids absent from the last sync batch (``allow_partial_batches=True``)."""
        return list(self._rounds.missing_workers)

    @property
    def worker_ids(self) -> list[int]:
        """The worker_ids this collector collects from (its rank's own), sorted."""
        return self._fleet.worker_ids

    @property
    def remote_collectors(self) -> list[RemoteActor]:
        """The actors, as ``(address, worker_id)`` records ordered by worker_id."""
        return [RemoteActor(address, w) for w, address in self._fleet.addresses().items()]

    @property
    def policy_version(self) -> dict[str, int]:
        """The learner's policy version per model_id (never behind any actor's)."""
        return self._book.versions()

    def _session_settings(self) -> CollectSettings:
        """What every session is opened with, for the current number of owned actors."""
        count = len(self._fleet.worker_ids)
        return self._rollout.for_actor(self._batch.frames_per_actor(count), count)

    def add_collectors(self, addresses: Sequence[str]) -> list[RemoteActor]:
        """Grow the fleet, also while collecting.

        Async: new actors start contributing at once. Sync: the per-actor share
        changes, so every session restarts with the new split; batches already
        collected with the old split are dropped (``stats()["discarded"]``). With
        several ranks, actors another rank owns become members only.

        Returns the added actors this collector owns. Raises ValueError as at construction
        (duplicate worker_id, divisibility) and ActorUnavailableError for an actor
        unreachable within ``connect_timeout``.
        """
        with self._lock:
            self._check_open()
            links = self._fleet.describe(check_addresses(addresses))
            self._fleet.join(links, self._batch, self._rollout.model_id, self._rollout.placement)
            if self._is_running():
                settings = self._session_settings()
                self._fleet.start_joined(links, settings, sync=bool(self._batch.sync))
                self._rounds.update_budget()
            owned = [link for link in links if self._ranks.owns(link.worker_id)]
            return [RemoteActor(link.address, link.worker_id) for link in owned]

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every owned actor in worker_id order, each with the seed the previous returned.

        Ranks seeding their actors with one seed give them equal seeds: seed each rank
        apart (e.g. ``seed + 10_000 * rank``).

        Returns:
            The seed returned by the last actor (to chain further).
        """
        check_seed(seed)
        with self._lock:
            self._check_open()
            return self._fleet.set_seed(seed, bool(static_seed))

    def state_dict(self) -> dict[str, Any]:
        """Learner counters plus each actor's state (GetState), keyed by worker_id.

        Returns:
            ``{"frames", "batches", "policy_version": {model_id: v},
            "workers": {worker_id: uint8 tensor of the actor's safetensors state}}``
            — plain tensors and ints, so ``torch.save`` and weights-only loading work.
        """
        with self._lock:
            self._check_open()
            return self._fleet.state_dict()

    def actor_state(self, worker_id: int) -> dict[str, Any]:
        """One actor's state, decoded (:func:`learner_client._members.actor_state_of`).

        On a TorchRL-env actor, ``"env"`` holds its transforms' state (``VecNorm``'s
        statistics, as an eval env needs them).

        Raises:
            UnknownWorkerError: No actor in the fleet has ``worker_id``.
        """
        return actor_state_of(self.state_dict()["workers"], worker_id)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (all workers listed must be in the fleet).

        Raises:
            ValueError: Missing keys.
            UnknownWorkerError: A worker_id not in the fleet.
        """
        with self._lock:
            self._check_open()
            self._fleet.load_state_dict(state_dict)
            self._rounds.update_budget()

    def stats(
        self, workers: str = "aggregate", *, timeout: float | None = 10.0
    ) -> dict[str, int | float | bool]:
        """TorchRL's flat, cheap snapshot of scalars (keys: ``docs/collector.md``, stats).

        ``workers`` is TorchRL's view (``"aggregate"``, ``"per_worker"``, ``"both"``);
        ``timeout`` (None or seconds) never matters: nothing waits on an actor.
        ValueError for an unknown view or a bad timeout.
        """
        return snapshot(
            workers,
            timeout,
            fleet=self._fleet,
            batch=self._batch,
            acting_model=self._rollout.model_id,
            missing=self.missing_workers,
            background_failed=self._background.error is not None,
            completed=self._rounds.exhausted(),
        )

    @property
    def worker_states(self) -> dict[int, str]:
        """Each actor's link state by worker_id (``"streaming"``, ``"down"``, ``"failed"``…)."""
        return self._fleet.states()
