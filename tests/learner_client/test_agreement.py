"""Versions agreed across learner ranks: one outcome per meeting on every rank.

``learner_client._agreement.VersionAgreement`` over a real ``TCPStore``, two ranks in one
process (each with its own store client, as two processes have); the end-to-end behaviour
with actor processes and ``torchrun``-style ranks is in ``test_collector_ranks.py``.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist
from helpers import poll_until

from common.config import DEFAULT_MODEL_ID
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


_STORE_HOST = """
import time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


@pytest.fixture
def store_host() -> Iterator[subprocess.Popen[str]]:
    """A process serving the store, as rank 0's does; killed at the end (also if stopped)."""
    host = subprocess.Popen([sys.executable, "-c", _STORE_HOST], stdout=subprocess.PIPE, text=True)
    yield host
    host.kill()
    host.communicate(timeout=_WAIT_S)


@pytest.mark.long
@pytest.mark.parametrize("stop", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_agreement_raises_within_its_timeout_if_the_store_host_stops_or_dies(
    store_host: subprocess.Popen[str], stop: signal.Signals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0's process serves the store: stopped (torch's client then waits for its answer
    forever) or killed, the other rank's push raises ``DeadlineError`` naming it in time."""
    assert store_host.stdout is not None
    port = int(store_host.stdout.readline())
    client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
    channel = _agreement._Channel(client, f"{_agreement._ROOT}/1")
    monkeypatch.setattr(_agreement, "_channel", lambda rank: channel)
    monkeypatch.setattr(VersionAgreement, "active", property(lambda self: True))
    monkeypatch.setattr(_agreement, "_STORE_GRACE_S", 0.5, raising=False)
    rank_one = VersionAgreement(Ranks(1, 2), timeout=0.5)
    rank_one.check(5, 1, refused=True)  # the store answers: rank 0's entry never comes
    os.kill(store_host.pid, stop)
    if stop == signal.SIGKILL:
        store_host.wait(_WAIT_S)
    for version in (6, 7):  # a push after one the store left waiting raises in time too
        started = time.monotonic()
        thread, result = _in_thread(lambda v=version: rank_one.check(v, 1))
        thread.join(_WAIT_S)
        assert not thread.is_alive(), "the push waited past its timeout"
        assert [type(exc) for exc in result] == [DeadlineError]
        assert "rank 1: the process group's store, which rank 0's process serves" in str(result[0])
        assert time.monotonic() - started < 3


def test_agreement_a_retry_meets_afresh_while_another_rank_still_holds_old_entries(
    ranks: list[VersionAgreement], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meetings 0 and 1 of version 5 conclude in conflicts. Rank 0 is done with meeting 1
    (its keys of meeting 0 deleted) while rank 1 is not yet: rank 0's next try must not meet
    rank 1's entry of meeting 0, which has rank 0's new weights, and push alone."""
    zero, one = ranks
    thread, first = _in_thread(lambda: zero.check(5, 2))
    assert _outcome(lambda: one.check(5, 1)) is VersionConflictError  # meeting 0
    thread.join(_WAIT_S)
    assert [type(exc) for exc in first] == [VersionConflictError]
    original, reached, go = _agreement._conclude, threading.Event(), threading.Event()
    store_one = _agreement._channel(1).store

    def held(channel: _agreement._Channel, *args: Any) -> bytes:
        outcome = original(channel, *args)
        if channel.store is store_one:  # rank 1 concluded meeting 1, its old keys not deleted
            reached.set()
            assert go.wait(_WAIT_S)
        return outcome

    monkeypatch.setattr(_agreement, "_conclude", held)
    thread, second = _in_thread(lambda: zero.check(5, 1))  # meeting 1: rank 0 comes first
    mine = _agreement._channel(0).for_models((DEFAULT_MODEL_ID,))
    poll_until(lambda: mine.store.check([mine.key(5, 1, 0)]))
    thread_one, second_one = _in_thread(lambda: one.check(5, 3))
    assert reached.wait(_WAIT_S)
    thread.join(_WAIT_S)
    assert [type(exc) for exc in second] == [VersionConflictError]
    zero.timeout = 0.5  # rank 1 has not pushed again: rank 0 waits for it, and times out
    assert _outcome(lambda: zero.check(5, 1)) is DeadlineError
    go.set()
    thread_one.join(_WAIT_S)
    assert [type(exc) for exc in second_one] == [VersionConflictError]
    zero.timeout = _WAIT_S  # both retry with the same weights: they meet, and both push
    thread, third = _in_thread(lambda: zero.check(5, 1))
    one.check(5, 1)
    thread.join(_WAIT_S)
    assert third == [None]
