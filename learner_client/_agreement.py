"""Replicated (DDP) weights: every rank pushes the same weights under one agreed version.

After an optimiser step every rank holds the same weights and pushes them to the actors
it owns under one explicit version (the step count): :func:`push_versioned`. The version
must be above what this rank's actors hold (versions only go up), and it is claimed as is.
:class:`VersionAgreement` makes a rank that pushes a version with other weights than the
other ranks impossible to miss: when the collector's ranks are torch.distributed's, every
versioned push gathers each rank's ``(version, digest of the weights)`` over a gloo group of
its own and raises :class:`~learner_client._errors.VersionConflictError` on every rank when
they differ, before anything is sent. A rank that does not push within ``call_timeout``
makes the others raise :class:`~common.errors.DeadlineError`.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from common.checksum import crc32c
from common.errors import DeadlineError
from common.weights import wire_state
from learner_client._errors import VersionConflictError
from learner_client._members import Ranks
from learner_client._pushes import Pusher
from learner_client._weight_args import PushOptions, WeightRequest
from learner_client._weights import WeightBook

__all__ = ["VersionAgreement", "push_versioned", "weights_digest"]


def weights_digest(source: Any, options: PushOptions) -> int:
    """CRC-32C of the tensors a push of ``source`` carries: keys, dtypes, shapes and bytes.

    Equal weights in equal form give equal digests on every rank and every machine.
    """
    state = wire_state(source, dtype=options.dtype, only_trainable=options.only_trainable)
    digest = 0
    for key in sorted(state):
        tensor = state[key]
        head = f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode()
        digest = crc32c(head, digest)
        if tensor.numel():
            digest = crc32c(tensor.reshape(-1).view(torch.uint8).numpy().data, digest)
    return digest


class VersionAgreement:
    """Checks, before each versioned push, that every rank pushes the same weights.

    Active only when the collector's ranks are torch.distributed's (same rank and world
    size, more than one rank); otherwise :meth:`check` does nothing. The gloo group it
    gathers over is created at the first versioned push, which every rank makes at the
    same step (a collective, as DDP's own).

    Args:
        ranks: The collector's ranks.
        timeout: Seconds a rank waits for the others' digests.
    """

    def __init__(self, ranks: Ranks, timeout: float) -> None:
        self.ranks = ranks
        self.timeout = timeout
        self._group: Any = None

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
        """Gather every rank's ``(version, digest)`` and compare them.

        A rank that refuses the push itself (``refused``) still takes part, so the others
        learn it at once instead of waiting out the timeout; it then raises its own error.

        Raises:
            VersionConflictError: Some rank gave another version or other weights, or
                refused the push (raised on the other ranks).
            DeadlineError: Some rank did not push within ``timeout``.
        """
        if not self.active:
            return
        dist = torch.distributed
        if self._group is None:
            self._group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=self.timeout)
            )
        mine = torch.tensor([version, digest, refused], dtype=torch.int64)
        gathered = [torch.empty_like(mine) for _ in range(self.ranks.world_size)]
        try:
            dist.all_gather(gathered, mine, group=self._group)
        except RuntimeError as exc:  # gloo's timeout, or a rank that left
            raise DeadlineError(
                f"rank {self.ranks.rank}: the other ranks did not push version {version} "
                f"within {self.timeout} s (every rank pushes every agreed version): {exc}"
            ) from None
        pushed = {r: (int(t[0]), int(t[1])) for r, t in enumerate(gathered)}
        others = [r for r, t in enumerate(gathered) if t[2] and r != self.ranks.rank]
        if refused:
            return
        if others:
            raise VersionConflictError(
                f"rank(s) {others} refused version {version} (their log says why); nothing "
                "was pushed",
                pushed=pushed,
            )
        if len(set(pushed.values())) > 1:
            detail = ", ".join(
                f"rank {r}: version {v} digest {d:08x}" for r, (v, d) in pushed.items()
            )
            raise VersionConflictError(
                f"the learner ranks disagree on version {version}: {detail}; nothing was "
                "pushed (every rank must push the same weights under one agreed version)",
                pushed=pushed,
            )


def _request_digest(book: WeightBook, request: WeightRequest) -> int:
    """One digest of every model a request pushes, in the form each is pushed in."""
    digest = 0
    for mid, src in sorted(request.sources.items()):
        if src is None:  # the last weights given, in the form they were last sent
            source, form = book.source(mid), book.options(mid, request.options)
        else:
            source, form = src, request.options or PushOptions()
        digest = crc32c(f"{mid}:{weights_digest(source, form)};".encode(), digest)
    return digest


def push_versioned(
    pusher: Pusher, book: WeightBook, agreement: VersionAgreement, request: WeightRequest
) -> dict:
    """Push ``request`` under its explicit ``version`` (after every rank agreed on it).

    A part of a multi-part push (``request.part``) is pushed as is: each rank's part holds
    other weights on purpose, so there is nothing to agree on.

    Returns:
        What ``update_policy_weights_`` returns.

    Raises:
        ValueError: ``version`` not above the version this rank's actors hold, or per-worker
            weights (an agreed version names one set of weights).
        VersionConflictError, DeadlineError: As :meth:`VersionAgreement.check`.
    """
    version = request.version
    if version is None or request.part is not None:
        return pusher.update(request)
    refusal = _refusal(book, request, version)
    if agreement.active:
        digest = 0 if refusal else _request_digest(book, request)
        agreement.check(version, digest, refused=refusal is not None)
    if refusal is not None:
        raise ValueError(refusal)
    return pusher.update(request)


def _refusal(book: WeightBook, request: WeightRequest, version: int) -> str | None:
    """Why this rank cannot push ``request`` under ``version``, or None."""
    if request.per_worker is not None:
        return "version= takes one set of weights for every actor, not per-worker ones"
    held = book.versions()
    behind = {m: held[m] for m in sorted(request.sources) if held.get(m, 0) >= version}
    if behind:
        return (
            f"version={version} is not above the version this collector's actors hold "
            f"({behind}): versions only go up"
        )
    return None
