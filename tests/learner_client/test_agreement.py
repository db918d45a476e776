"""Versions agreed across learner ranks: one outcome per meeting on every rank.

``learner_client._agreement.VersionAgreement`` over a real ``TCPStore``, two ranks in one
process (each with its own store client, as two processes have); the end-to-end behaviour
with actor processes and ``torchrun``-style ranks is in ``test_collector_ranks.py``.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist

from common.errors import DeadlineError
from learner_client import VersionConflictError, _agreement
from learner_client._agreement import VersionAgreement
from learner_client._members import Ranks

_WAIT_S = 10


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> list[VersionAgreement]:
    """Two ranks' agreements, each on its own client of one store."""
    timeout = datetime.timedelta(seconds=_WAIT_S)
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=timeout)
    prefix = f"{_agreement._ROOT}/1"
    channels = {0: _agreement._Channel(server, prefix), 1: _agreement._Channel(client, prefix)}
    monkeypatch.setattr(_agreement, "_channel", lambda rank: channels[rank])
    monkeypatch.setattr(VersionAgreement, "active", property(lambda self: True))
    return [VersionAgreement(Ranks(r, 2), timeout=_WAIT_S) for r in range(2)]


def _in_thread(call: Callable[[], None]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` on a thread; the list receives None or what it raised."""
    result: list[Any] = []

    def run() -> None:
        try:
            call()
            result.append(None)
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _outcome(call: Callable[[], None]) -> type[Exception] | None:
    try:
        call()
    except Exception as exc:
        return type(exc)
    return None


def _late_rank_one(agreements: list[VersionAgreement]) -> None:
    """Rank 1 pushes version 5 with weights 1 alone and times out; its entry stays."""
    agreements[1].timeout = 0.05
    with pytest.raises(DeadlineError):
        agreements[1].check(5, 1)
    agreements[1].timeout = _WAIT_S


def _held(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[threading.Event, threading.Event]:
    """Hold the first call of ``_agreement.<name>`` after it returns until ``go`` is set."""
    original, reached, go = getattr(_agreement, name), threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        result = original(*args)
        if not reached.is_set():
            reached.set()
            assert go.wait(_WAIT_S)
        return result

    monkeypatch.setattr(_agreement, name, held)
    return reached, go


def test_agreement_a_retry_with_new_weights_while_another_rank_concludes_gives_one_outcome(
    ranks: list[VersionAgreement], monkeypatch: pytest.MonkeyPatch
) -> None:
    _late_rank_one(ranks)
    reached, go = _held(monkeypatch, "_agreed_digest")  # the entries read, not yet recorded
    # Rank 0 comes with weights 2 and reads rank 1's old entry (weights 1): a conflict.
    thread, zero = _in_thread(lambda: ranks[0].check(5, 2))
    assert reached.wait(_WAIT_S)
    # Meanwhile rank 1 retries with weights 2, as rank 0's: it meets rank 0's entry.
    one = _outcome(lambda: ranks[1].check(5, 2))
    go.set()
    thread.join(_WAIT_S)
    assert zero == [None]
    assert one is None  # both push: the outcome recorded first agreed on weights 2


def test_agreement_a_retry_entering_a_meeting_just_concluded_in_conflict_raises_too(
    ranks: list[VersionAgreement], monkeypatch: pytest.MonkeyPatch
) -> None:
    _late_rank_one(ranks)
    reached, go = _held(monkeypatch, "_open_meeting")
    # Rank 1 retries with weights 2 and finds meeting 0 open; it waits there to write.
    thread, one = _in_thread(lambda: ranks[1].check(5, 2))
    assert reached.wait(_WAIT_S)
    # Rank 0 comes with weights 2, reads rank 1's old entry and concludes in a conflict.
    assert _outcome(lambda: ranks[0].check(5, 2)) is VersionConflictError
    go.set()
    thread.join(_WAIT_S)
    assert [type(exc) for exc in one] == [VersionConflictError]
    # Both retry: the version meets afresh and both push.
    thread, one = _in_thread(lambda: ranks[1].check(5, 2))
    ranks[0].check(5, 2)
    thread.join(_WAIT_S)
    assert one == [None]
