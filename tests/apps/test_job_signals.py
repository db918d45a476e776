"""A reference learner's signals: held over an update, a second one stops at once.

Real signals sent to this process; the handlers are the ones the loops install.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable

import pytest

from apps._job import entry
from apps._job.cli import (
    EXIT_INTERRUPTED,
    FleetMismatchError,
    SignalsHeld,
    StoppedAtOnce,
    run_job,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with SignalsHeld("prog") as signals:
        with pytest.raises(KeyboardInterrupt):
            _update(signals, [signal.SIGTERM], reached)
        assert reached == ["SIGTERM"]  # the update ran to its end
        with pytest.raises(KeyboardInterrupt):  # outside an update: at once
            _signal_self(signal.SIGINT)
    said = capsys.readouterr().err
    assert "prog: stopping after this update (signal again to stop at once" in said
    # handlers given back (a bound method is a new object at each access: compare handlers)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


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


class _Done:
    def to_text(self) -> str:
        return "trained 64 frames"


def _raises(exc: BaseException) -> Callable[[object], _Done]:
    def train(settings: object) -> _Done:
        raise exc

    return train


@pytest.mark.parametrize(
    ("train", "code", "said"),
    [
        (lambda settings: _Done(), 0, "trained 64 frames"),
        (_raises(KeyboardInterrupt()), 130, "prog: interrupted"),
        (_raises(OSError("disk full")), 1, "prog: error: disk full"),
        (_raises(FleetMismatchError("two actors with worker_id 0")), 1, "worker_id 0"),
    ],
)
def test_a_job_exits_0_130_or_1_as_scripts_and_torchrun_read_them(
    train: Callable[[object], _Done], code: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The literal codes the docs promise: 0 done, 130 Ctrl-C, 1 a named error or a fleet
    that does not fit (FleetMismatchError is always one, whatever the job names)."""
    assert run_job("prog", None, train, (OSError,)) == code
    out, err = capsys.readouterr()
    assert said in (out if code == 0 else err)


def test_a_job_takes_sigterm_as_ctrl_c_then_gives_the_handler_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A container stop (SIGTERM) ends the job like Ctrl-C, 130, and only while it runs."""

    def outside(signum: int, frame: object) -> None:
        raise RuntimeError("SIGTERM reached the handler from before the job")

    def train(settings: object) -> _Done:
        _signal_self(signal.SIGTERM)
        return _Done()

    previous = signal.signal(signal.SIGTERM, outside)
    try:
        assert run_job("prog", None, train, ()) == 130
        assert signal.getsignal(signal.SIGTERM) is outside
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "prog: interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_script_imports_its_job_ends_in_one_line_with_130(
    stop: signal.Signals,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The scripts import torch before parsing a flag: a Ctrl-C then printed a traceback and
    a SIGTERM killed the process by its default action; both now end as a stop in training."""
    (tmp_path / "job_importing_slowly.py").write_text(
        "import os, signal, time\n"
        f"os.kill(os.getpid(), signal.{stop.name})\n"
        "time.sleep(5)\n"
        "def main():\n"
        "    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    before = signal.getsignal(signal.SIGTERM)
    began = time.monotonic()
    assert entry._run("job_importing_slowly", "prog") == EXIT_INTERRUPTED
    assert time.monotonic() - began < 4  # stopped in the import, not after it
    assert capsys.readouterr().err == "prog: interrupted while starting\n"
    assert signal.getsignal(signal.SIGTERM) == before  # the job's own handling takes over


def test_the_installed_scripts_start_through_an_entry_module_importing_nothing_slow() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rlfleet-train"] == "apps._job.entry:train"
    assert scripts["rlfleet-grpo"] == "apps._job.entry:grpo"
    probe = "import sys, apps._job.entry; print(sorted({'torch', 'grpc'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"
