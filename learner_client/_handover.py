"""A taken batch on its way to the script: through ``postproc``, or into the replay buffer.

:func:`finished` is the last step TorchRL's collectors give every batch. With a replay
buffer, :class:`Handover` stores each actor's part of a round on its own, as each of
TorchRL's workers extends the buffer with its batch: a part whose ``postproc`` or
``extend()`` raises is lost (logged), the round's other parts are stored, then the first
error is raised. An interrupt (Ctrl-C) while a part is stored cuts that part only; the
round's parts after it wait, and the next take stores them before its own round (or, at
the end of the collection, alone).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase, is_tensor_collection

__all__ = ["Handover", "finished"]

log = logging.getLogger("learner_client")

Postproc = Callable[[TensorDictBase], TensorDictBase] | None


def finished(batch: TensorDictBase, postproc: Postproc) -> TensorDictBase:
    """``postproc(batch)``, then without the keys a step of whose path starts with ``_``.

    TorchRL's collectors drop them from every batch after ``postproc``: a postproc's
    scratch entries (``"_tmp"``, ``("next", "_x")``) never reach the script's batches.

    Raises:
        TypeError: ``postproc`` returned something other than a TensorDict or a
            tensorclass (a function that changes the batch in place and forgets to
            return it).
    """
    if postproc is not None:
        batch = postproc(batch)
        if not is_tensor_collection(batch):  # a TensorDict or a tensorclass
            raise TypeError(
                f"postproc must return the batch (a TensorDict), got {type(batch).__name__} "
                f"from {getattr(postproc, '__qualname__', type(postproc).__name__)}"
            )
    private = [
        key
        for key in batch.keys(True)
        if any(part.startswith("_") for part in ((key,) if isinstance(key, str) else key))
    ]
    return batch.exclude(*private, inplace=True) if private else batch


class Handover:
    """Hands rounds to the script, keeping the parts an interrupt left unstored.

    Threads sharing ``next()`` each store their own round's parts; the parts an interrupt
    left go to the next take, whichever thread makes it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unstored: list[TensorDictBase] = []

    def deliver(
        self, parts: list[TensorDictBase], replay_buffer: Any, postproc: Postproc
    ) -> TensorDictBase | None:
        """The batch after ``postproc``; or None, each part stored in ``replay_buffer``.

        Raises:
            Exception: The first error of a part's ``postproc`` or ``extend()``, once every
                other part is stored.
        """
        if replay_buffer is None:
            return finished(parts[0], postproc)
        with self._lock:
            pending, self._unstored = [*self._unstored, *parts], []
        self._store(pending, replay_buffer, postproc)
        return None

    def flush(self, replay_buffer: Any, postproc: Postproc) -> None:
        """Store the parts an interrupt left unstored (nothing when none waits)."""
        with self._lock:
            pending, self._unstored = self._unstored, []
        self._store(pending, replay_buffer, postproc)

    def _store(self, pending: list[TensorDictBase], replay_buffer: Any, postproc: Postproc) -> None:
        failure: Exception | None = None
        while pending:
            part = pending.pop(0)
            try:
                replay_buffer.extend(finished(part, postproc))
            except Exception as exc:
                log.error("a batch part was not stored: %s: %s", type(exc).__name__, exc)
                failure = failure or exc
            except BaseException:
                with self._lock:
                    self._unstored[:0] = pending  # before any round taken since
                log.warning(
                    "an interrupt cut the storing of a batch part of %d frames (it may be "
                    "partly in the replay buffer); the %d parts after it are stored by the "
                    "next take",
                    part.numel(),
                    len(pending),
                )
                raise
        if failure is not None:
            raise failure
