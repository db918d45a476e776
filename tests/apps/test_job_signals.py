"""A reference learner's signals: held over an update, a second one stops at once.

Real signals sent to this process; the handlers are the ones the loops install.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from apps._job.cli import EXIT_INTERRUPTED, SignalsHeld, StoppedAtOnce, run_job


def _signal_self(signum: signal.Signals) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs between two bytecodes of the main thread


def _update(signals: SignalsHeld, signums: list[signal.Signals], reached: list[str]) -> None:
    """An update that receives ``signums``; ``reached`` names each one it got past."""
    with signals.held():
        for signum in signums:
            _signal_self(signum)
            reached.append(signum.name)


def test_a_signal_during_an_update_waits_for_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    reached: list[str] = []
    with SignalsHeld("prog") as signals:
        with pytest.raises(KeyboardInterrupt):
            _update(signals, [signal.SIGTERM], reached)
        assert reached == ["SIGTERM"]  # the update ran to its end
        with pytest.raises(KeyboardInterrupt):  # outside an update: at once
            _signal_self(signal.SIGINT)
    said = capsys.readouterr().err
    assert "prog: stopping after this update (signal again to stop at once" in said
    assert signal.getsignal(signal.SIGTERM) is not signals._on_signal  # handlers given back


def test_a_block_that_reads_the_signal_itself_is_not_interrupted_after_it() -> None:
    """The ranks' loop reads ``pending`` at each agreement; a signal after the last is let go."""
    with SignalsHeld("prog") as signals:
        with signals.held(raise_after=False):
            assert signals.pending is None
            _signal_self(signal.SIGTERM)
            assert signals.pending == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt), signals.held():  # the next one raises again
            _signal_self(signal.SIGTERM)


def test_a_second_signal_during_an_update_stops_at_once() -> None:
    reached: list[str] = []
    with SignalsHeld("prog") as signals:
        with pytest.raises(StoppedAtOnce):
            _update(signals, [signal.SIGINT, signal.SIGINT, signal.SIGINT], reached)
        assert reached == ["SIGINT"]  # stopped at the second
        reached.clear()
        with pytest.raises(KeyboardInterrupt):  # the next update holds a first signal again
            _update(signals, [signal.SIGINT], reached)
        assert reached == ["SIGINT"]


def test_a_job_stopped_at_once_exits_130_saying_no_outputs_were_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def train(settings: object) -> object:
        raise StoppedAtOnce("signal 2 after signal 2")

    assert run_job("prog", None, train, ()) == EXIT_INTERRUPTED  # type: ignore[arg-type]
    said = capsys.readouterr().err
    assert "prog: stopped at once by a second signal (no outputs written)" in said
