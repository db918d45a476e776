"""Versions agreed across learner ranks: every rank pushes the same weights under one version.

After an optimiser step every data-parallel rank holds the same weights and pushes them to
the actors it owns under one explicit version (the step count). When the collector's ranks
are torch.distributed's, :class:`VersionAgreement` compares each rank's ``(version, digest of
the weights)`` before anything is sent. Each versioned push is one *round*, numbered alike on
every rank (every rank pushes every agreed version, as it steps DDP): each rank writes its
entry for the round into torch.distributed's own key-value store (the one
``init_process_group`` rendezvoused on) and waits for the others' entries of that round.

The store, not a gloo collective: a gloo group whose collective timed out is unusable for
good (every later push failed at once), and creating one is itself a collective that a late
rank breaks. With the store, a rank that does not come within ``timeout`` makes the waiting
ones raise :class:`~common.errors.DeadlineError` for that round only; when it comes, it finds
their entries and pushes, and the next round meets as before. A rank that refuses the push
itself (a stale version, a target it lacks) still writes its entry, marked refused, so that
the others raise at once instead of waiting out the timeout.

Rounds are numbered per process, not per collector: a collector rebuilt on one rank (after an
error) goes on with its process's count and still meets the others. A push retried at the
version whose round timed out takes that round again, so a late rank's entry is met there
(a new round would be matched against the late rank's next version for good).

Once every rank's entry of a round is there, each rank deletes its entries of the rounds
before (every rank is past them): the store holds at most two entries per rank.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch

from common.errors import DeadlineError
from learner_client._errors import VersionConflictError
from learner_client._members import Ranks

__all__ = ["VersionAgreement"]

# The store's keys: a count of processes' channels per rank (the n-th process group of every
# rank meets the n-th of the others), then each channel's rounds under its own prefix.
_ROOT = "rlfleet/agreement"
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.05


@dataclasses.dataclass
class _Channel:
    """This process's rounds on one store, shared by every collector of the process."""

    store: Any
    prefix: str
    round: int = 0
    timed_out: int | None = None  # the version of the last round, when it timed out
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_CHANNELS: dict[int, _Channel] = {}  # by id(store); the channel keeps its store alive
_CHANNELS_LOCK = threading.Lock()


def _channel(rank: int) -> _Channel:
    """The process's channel on the process group's store, made at its first use."""
    store = torch.distributed.distributed_c10d._get_default_store()
    with _CHANNELS_LOCK:
        if id(store) not in _CHANNELS:
            count = store.add(f"{_ROOT}/count/{rank}", 1)
            _CHANNELS[id(store)] = _Channel(store, f"{_ROOT}/{count}")
        return _CHANNELS[id(store)]


class VersionAgreement:
    """Checks, before each versioned push, that every rank pushes the same weights.

    Active only when the collector's ranks are torch.distributed's (same rank and world
    size, more than one rank); otherwise :meth:`check` does nothing.

    Args:
        ranks: The collector's ranks.
        timeout: Seconds a rank waits for the others' entries.
    """

    def __init__(self, ranks: Ranks, timeout: float) -> None:
        self.ranks = ranks
        self.timeout = timeout

    @property
    def active(self) -> bool:
        """Whether versioned pushes are compared across ranks."""
        dist = torch.distributed
        return (
            self.ranks.world_size > 1
            and dist.is_available()
            and dist.is_initialized()
            and (dist.get_rank(), dist.get_world_size()) == (self.ranks.rank, self.ranks.world_size)
        )

    def check(self, version: int, digest: int, *, refused: bool = False) -> None:
        """Exchange every rank's ``(version, digest)`` in the next round and compare them.

        A rank that refuses the push itself (``refused``) still takes part, so the others
        learn it at once; it returns without raising (its caller raises its own error).

        Raises:
            VersionConflictError: Some rank gave another version or other weights, or
                refused the push (raised on the other ranks; nothing is sent).
            DeadlineError: Some rank did not come within ``timeout``.
        """
        if not self.active:
            return
        channel = _channel(self.ranks.rank)
        with channel.lock:  # one round at a time
            if channel.timed_out != version:  # else a retry: the late rank meets it there
                channel.round += 1
            channel.timed_out = None
            keys = [f"{channel.prefix}/{channel.round}/{r}" for r in range(self.ranks.world_size)]
            channel.store.set(keys[self.ranks.rank], f"{version} {digest} {int(refused)}")
            try:
                self._wait(channel.store, keys, version)
            except DeadlineError:
                channel.timed_out = version
                if refused:
                    return  # the caller's own refusal says more
                raise
            entries = [_parse(channel.store.get(key)) for key in keys]
            if channel.round > 1:  # every rank wrote this round: none reads the last one again
                last = f"{channel.prefix}/{channel.round - 1}/{self.ranks.rank}"
                channel.store.delete_key(last)
        if not refused:
            _compare(version, dict(enumerate(entries)))

    def _wait(self, store: Any, keys: list[str], version: int) -> None:
        """Return once every rank's entry of the round is in the store (polled).

        Raises:
            DeadlineError: Naming the ranks missing after ``timeout``.
        """
        deadline = time.monotonic() + self.timeout
        pause = _POLL_FIRST_S
        while not store.check(keys):
            if time.monotonic() >= deadline:
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
                raise DeadlineError(
                    f"rank {self.ranks.rank}: rank(s) {missing} did not push version {version} "
                    f"within {self.timeout} s (every rank pushes every agreed version; a rank "
                    "that comes later finds this one's entry and pushes; retrying this version "
                    "or pushing the next one meets it again)"
                )
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)


def _parse(value: bytes) -> tuple[int, int, bool]:
    version, digest, refused = (int(part) for part in value.decode().split())
    return version, digest, bool(refused)


def _compare(version: int, entries: dict[int, tuple[int, int, bool]]) -> None:
    """Raise unless every rank agreed to push ``version`` with the same digest."""
    pushed = {r: (v, d) for r, (v, d, _) in entries.items()}
    refused = [r for r, (_, _, no) in entries.items() if no]
    if refused:
        raise VersionConflictError(
            f"rank(s) {refused} refused version {version} (their log says why); nothing was pushed",
            pushed=pushed,
        )
    if len(set(pushed.values())) > 1:
        detail = ", ".join(f"rank {r}: version {v} digest {d:08x}" for r, (v, d) in pushed.items())
        raise VersionConflictError(
            f"the learner ranks disagree on version {version}: {detail}; nothing was pushed "
            "(every rank must push the same weights under one agreed version)",
            pushed=pushed,
        )
