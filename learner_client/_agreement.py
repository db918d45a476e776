"""Versions agreed across learner ranks: every rank pushes the same weights under one version.

After an optimiser step every data-parallel rank holds the same weights and pushes them to
the actors it owns under one explicit version (the step count). When the collector's ranks
are torch.distributed's, :class:`VersionAgreement` compares each rank's ``(version, digest of
the weights)`` before anything is sent. Pushes of one version *meet*: each rank writes its
entry for the version into torch.distributed's own key-value store (the one
``init_process_group`` rendezvoused on) and waits for the others' entries of that version.

The store, not a gloo collective: a gloo group whose collective timed out is unusable for
good (every later push failed at once), and creating one is itself a collective that a late
rank breaks. With the store, a rank that does not come within ``timeout`` makes the waiting
ones raise :class:`~common.errors.DeadlineError` for that push only; when it comes, it finds
their entries and pushes. A rank that skipped the version costs the others that one push:
the next version every rank pushes meets as before.

A meeting is *concluded* by the first rank that finds every entry: it records the outcome
(agreed on a digest, or a conflict) under the meeting's key, and every rank acts on that
record, not on the entries it read (a rank that timed out may write its entry again, with
other weights, while another concludes): every rank sees one outcome. A push of a version
whose meetings so far concluded in a conflict opens the next meeting (a retry after the
weights were fixed meets afresh: old entries are never compared with new ones); a push that
finds a meeting agreed on its own digest pushes (it is a rank that timed out there and
retries: the others took its entry and pushed). A retry after a timeout
writes its entry again in the open meeting, which meets the late rank there.

The models a push sends are part of every key: each model has versions of its own, so
pushes of other models meet apart (a push of the policy at version 20 and one of the critic
at version 3 are not compared).

Each rank also keeps its last entry (per set of models) under a key of its own. A rank
waiting for another that has already pushed a later version of those models raises
:class:`VersionConflictError` at once: versions only go up, so that rank never pushes this
one. A rank that refuses the push itself (a stale version, a target it lacks) writes its
entry marked refused, so the ranks pushing that version raise at once instead of waiting
out the timeout.

Once a meeting concluded, each rank deletes its own entries and records of those models
written before (every rank is past them), but for the records of the same version's meetings,
which stay until a later version's meeting: a meeting whose record is gone would open again,
while a rank not yet done with it still has its old entry there. The store holds a rank's
last few keys per set of models only.

Rank 0's process serves the store. Stopped or cut off, it never answers, and torch's client
waits for the answer past any timeout; killed, the client fails with torch's own error. A
push works on the store from a thread of its own and raises :class:`DeadlineError` naming
rank 0 when it has not met within ``timeout`` and :data:`_STORE_GRACE_S`, or when the store
failed; nothing is sent.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from common.config import DEFAULT_MODEL_ID
from common.errors import DeadlineError
from learner_client._errors import VersionConflictError
from learner_client._members import Ranks

__all__ = ["VersionAgreement"]

# The store's keys: a count of processes' channels per rank (the n-th process group of every
# rank meets the n-th of the others), then each channel's entries under its own prefix.
_ROOT = "rlfleet/agreement"
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.05
# Seconds a push gives the store beyond its ``timeout``: a store whose host (rank 0's
# process) is stopped or cut off never answers, and torch's client waits past any timeout.
_STORE_GRACE_S = 2.0
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One rank's push of a version: what it would send, or that it refused."""

    version: int
    digest: int
    refused: bool

    def encode(self) -> str:
        return f"{self.version} {self.digest} {int(self.refused)}"

    @classmethod
    def decode(cls, value: bytes) -> _Entry:
        version, digest, refused = (int(part) for part in value.split())
        return cls(version, digest, bool(refused))


@dataclasses.dataclass
class _Channel:
    """This process's entries on one store, shared by every collector of the process."""

    store: Any
    prefix: str  # the channel's, then the models' (:meth:`for_models`)
    keys: list[str] = dataclasses.field(default_factory=list)  # this rank's, not yet deleted
    models: str = ""  # the models pushed, as messages name them (:meth:`for_models`)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # Each set of models' keys not yet deleted: one set's meeting deletes its own only.
    keys_by_models: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def key(self, version: int, meeting: int, rank: int | str) -> str:
        """A rank's entry in a meeting, or (``rank="outcome"``) the meeting's outcome."""
        return f"{self.prefix}/{version}.{meeting}/{rank}"

    def last_key(self, rank: int) -> str:
        return f"{self.prefix}/last/{rank}"

    def for_models(self, model_ids: tuple[str, ...]) -> _Channel:
        """This channel's view for pushes of ``model_ids``: their own keys, the same lock.

        A meeting of these models deletes only their earlier keys: a rank that timed out in
        another set's meeting still finds its outcome when it retries there.
        """
        models = json.dumps(sorted(model_ids), separators=(",", ":"))
        keys = self.keys_by_models.setdefault(models, [])
        return dataclasses.replace(
            self, prefix=f"{self.prefix}/{models}", keys=keys, models=f" of {models}"
        )

    def keep(self, key: str) -> None:
        """Remember a key this rank wrote, to delete it once every rank is past it."""
        if key not in self.keys:
            self.keys.append(key)

    def read(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None


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

    def check(
        self,
        version: int,
        digest: int,
        *,
        refused: bool = False,
        model_ids: tuple[str, ...] = (DEFAULT_MODEL_ID,),
    ) -> None:
        """Write this rank's entry for ``version`` of ``model_ids``; compare it with the others'.

        A rank that refuses the push itself (``refused``) still takes part, so the others
        learn it at once; it returns without raising (its caller raises its own error).

        Raises:
            VersionConflictError: Some rank gave other weights for the version, refused its
                push, or pushed a later version instead (nothing is sent).
            DeadlineError: Some rank did not come within ``timeout``, or the store (rank 0's
                process) did not answer within ``timeout`` and a grace, or failed.
        """
        if not self.active:
            return
        rank, budget = self.ranks.rank, self.timeout + _STORE_GRACE_S
        mine = _Entry(version, digest, refused)
        try:
            channel = _on_store(lambda: _channel(rank).for_models(model_ids), budget, rank)
            if not channel.lock.acquire(timeout=budget):  # one push at a time
                raise DeadlineError(_unanswered(rank, budget, "an earlier push still waits on it"))
            met = _on_store(lambda: self._meet(channel, mine), budget, rank, held=channel.lock)
        except DeadlineError:
            if refused:
                return  # the caller's own refusal says more
            raise
        if met is not None and not refused:
            _compare(version, mine, *met)

    def _meet(self, channel: _Channel, mine: _Entry) -> tuple[bytes, dict[int, _Entry]] | None:
        """Write this rank's entry, wait for the others', conclude; the outcome and entries.

        None: this rank pushes (a meeting agreed on its weights before), or it refused and
        its caller raises its own error.
        """
        rank, version = self.ranks.rank, mine.version
        meeting = _open_meeting(channel, mine)
        if meeting is None:
            return None  # a meeting agreed on these weights, with this rank's entry: push
        keys = [channel.key(version, meeting, r) for r in range(self.ranks.world_size)]
        for key in (keys[rank], channel.last_key(rank)):
            channel.store.set(key, mine.encode())
        channel.keep(keys[rank])
        try:
            entries = self._wait(channel, keys, mine)
        except (DeadlineError, VersionConflictError):
            if mine.refused:
                return None  # the caller's own refusal says more
            raise
        outcome = _conclude(channel, channel.key(version, meeting, "outcome"), entries)
        self._delete_earlier(channel, version, keep=keys[rank])
        return outcome, entries

    def _wait(self, channel: _Channel, keys: list[str], mine: _Entry) -> dict[int, _Entry]:
        """Every rank's entry of this meeting, once all are in the store (polled).

        Raises:
            VersionConflictError: A missing rank never pushes this version (:func:`_never_comes`).
            DeadlineError: Naming the ranks missing after ``timeout``.
        """
        store, deadline, pause = channel.store, time.monotonic() + self.timeout, _POLL_FIRST_S
        while not store.check(keys):
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            lasts = self._lasts(channel, missing)
            for r, last in lasts.items():
                if last is None or not _never_comes(mine, last):
                    continue
                if not store.check([keys[r]]):  # else it came meanwhile
                    _raise_moved(self.ranks.rank, mine, r, last)
            if time.monotonic() >= deadline:
                rank = self.ranks.rank
                version = f"{mine.version}{channel.models}"
                raise DeadlineError(_late_message(rank, version, lasts, self.timeout))
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
        return {r: _Entry.decode(store.get(key)) for r, key in enumerate(keys)}

    @staticmethod
    def _lasts(channel: _Channel, ranks: Any) -> dict[int, _Entry | None]:
        """Each rank's last entry (None: it never wrote one)."""
        lasts: dict[int, _Entry | None] = {}
        for r in ranks:
            value = channel.read(channel.last_key(r))
            lasts[r] = None if value is None else _Entry.decode(value)
        return lasts

    @staticmethod
    def _delete_earlier(channel: _Channel, version: int, keep: str) -> None:
        """Every rank met in the meeting of ``keep``: none reads this rank's earlier keys.

        The outcomes of ``version``'s meetings stay until a later version's meeting: one
        deleted would open its meeting again, where another rank's old entry may still be
        (it deletes its keys once it concluded too), and be compared with new ones.
        """
        outcomes = f"{channel.prefix}/{version}."
        kept = [k for k in channel.keys if k.startswith(outcomes) and k.endswith("/outcome")]
        for earlier in channel.keys:
            if earlier != keep and earlier not in kept:
                channel.store.delete_key(earlier)
        channel.keys[:] = [keep, *kept]  # in place: the channel's list for these models


def _on_store(
    call: Callable[[], _T], budget: float, rank: int, held: threading.Lock | None = None
) -> _T:
    """``call()``, which works on the store, on a thread of its own; given up after ``budget`` s.

    ``held`` (a lock this thread took for ``call``) is released when ``call`` ends, also
    after this rank gave up on it: until then no other push of this process uses the store.

    Raises:
        DeadlineError: The store did not answer within ``budget`` (its host is stopped or cut
            off), or it failed (its host exited), naming rank 0, whose process serves it.
    """
    done, result = threading.Event(), list[_T | BaseException]()

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # raised again on the caller's thread
            result.append(exc)
        finally:
            if held is not None:
                held.release()
            done.set()

    threading.Thread(target=run, name="rlfleet-agreement", daemon=True).start()
    if not done.wait(budget):
        raise DeadlineError(_unanswered(rank, budget, "it did not answer"))
    value = result[0]
    if isinstance(value, torch.distributed.DistError):
        raise DeadlineError(_unanswered(rank, budget, f"it failed: {value}")) from value
    if isinstance(value, BaseException):
        raise value
    return value


def _unanswered(rank: int, budget: float, why: str) -> str:
    return (
        f"rank {rank}: the process group's store, which rank 0's process serves, is not "
        f"usable ({why}, {budget:g} s given): rank 0 exited, stopped or cannot be reached; "
        "nothing was pushed"
    )


def _never_comes(mine: _Entry, last: _Entry) -> bool:
    """Whether a rank whose last entry is ``last`` never pushes ``mine``'s version.

    It pushed a later one, and versions only go up.
    """
    return last.version > mine.version


def _open_meeting(channel: _Channel, mine: _Entry) -> int | None:
    """The first meeting of ``mine``'s version not concluded in a conflict.

    None when one agreed on ``mine``'s digest: this rank timed out in it, the others pushed.
    """
    meeting = 0
    while (outcome := channel.read(channel.key(mine.version, meeting, "outcome"))) is not None:
        if outcome == f"agreed {mine.digest}".encode() and not mine.refused:
            return None
        meeting += 1
    return meeting


def _conclude(channel: _Channel, key: str, entries: dict[int, _Entry]) -> bytes:
    """Record a meeting's outcome unless a rank did first; the outcome recorded.

    The first record stands: a rank that timed out may write its entry again, with other
    weights, while another rank concludes on the entry before, so two ranks can read
    different entries of one meeting; every rank acts on the one outcome recorded.
    """
    digest = _agreed_digest(entries)
    outcome = "conflict" if digest is None else f"agreed {digest}"
    recorded: bytes = channel.store.compare_set(key, "", outcome)
    channel.keep(key)
    return recorded


def _agreed_digest(entries: dict[int, _Entry]) -> int | None:
    """The digest every rank pushes under one version; None when any differs or refused.

    The one agreement rule: :func:`_conclude` records it, :func:`_compare` raises by it.
    """
    pushed = {(e.version, e.digest) for e in entries.values()}
    if len(pushed) != 1 or any(e.refused for e in entries.values()):
        return None
    return next(iter(pushed))[1]


def _raise_moved(my_rank: int, mine: _Entry, rank: int, last: _Entry) -> None:
    pushed = {my_rank: (mine.version, mine.digest), rank: (last.version, last.digest)}
    if last.refused:
        raise VersionConflictError(
            f"rank {rank} refused version {last.version} (its log says why) while this rank "
            f"waited to push version {mine.version}; nothing was pushed",
            pushed=pushed,
        )
    raise VersionConflictError(
        f"the learner ranks disagree: rank {rank} pushed version {last.version} and not "
        f"version {mine.version}, which this rank pushes; nothing was pushed (every rank must "
        "push every agreed version; the next version every rank pushes meets as before)",
        pushed=pushed,
    )


def _late_message(rank: int, version: str, lasts: dict[int, _Entry | None], timeout: float) -> str:
    last = ", ".join(
        f"rank {r}: {'no push yet' if e is None else f'last version {e.version}'}"
        for r, e in lasts.items()
    )
    return (
        f"rank {rank}: rank(s) {sorted(lasts)} did not push version {version} within {timeout} s "
        f"({last}; every rank pushes every agreed version: a rank that comes later finds this "
        "one's entry and pushes, and a retry of this version meets it there; a rank that "
        "skipped it costs this push only)"
    )


def _compare(version: int, mine: _Entry, outcome: bytes, entries: dict[int, _Entry]) -> None:
    """Raise unless the meeting's recorded ``outcome`` agreed on ``mine``'s digest."""
    if outcome == f"agreed {mine.digest}".encode():
        return
    pushed = {r: (e.version, e.digest) for r, e in entries.items()}
    if _agreed_digest(entries) is not None:
        raise VersionConflictError(
            f"another rank concluded the meeting of version {version} on entries that have "
            "changed since (a rank that timed out pushed again with other weights); nothing "
            "was pushed (push the version again: it meets afresh)",
            pushed=pushed,
        )
    refused = [r for r, e in entries.items() if e.refused]
    if refused:
        raise VersionConflictError(
            f"rank(s) {refused} refused version {version} (their log says why); nothing was pushed",
            pushed=pushed,
        )
    detail = ", ".join(f"rank {r}: version {v} digest {d:08x}" for r, (v, d) in pushed.items())
    raise VersionConflictError(  # not refused, so the ranks pushed other weights
        f"the learner ranks disagree on version {version}: {detail}; nothing was pushed "
        "(every rank must push the same weights under one agreed version)",
        pushed=pushed,
    )
