"""``rlfleet-train --nproc-per-node 2``: data-parallel PPO, two ranks sharing a local fleet.

The real entry point runs the ranks under ``torch.distributed.run`` (gloo on the CPU);
each rank starts its own share of the fleet (2 ranks x 2 actors), trains with DDP and
pushes agreed versions to its own actors.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.long

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _train(out: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps.ppo", "--nproc-per-node", "2", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_train_runs_two_data_parallel_ranks_on_a_tiny_budget(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    tiny = ["--num-envs", "2", "--frames-per-batch", "16", "--minibatch-size", "8"]
    result = _train(
        out,
        *tiny,
        *("--num-actors", "4", "--total-frames", "48", "--hidden", "8", "--no-progress"),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 1 of 2: CartPole-v1" in result.stdout, result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ranks"], summary["rank"]) == (2, 0)
    assert summary["frames"] == 2 * 48  # each rank trained on its own 48
    assert summary["batches"] == 3
    assert summary["policy_version"] >= 4  # the first push and one per batch, agreed
    assert (out / "policy.safetensors").exists()


def test_a_failing_rank_is_named_on_stderr_with_its_own_message(tmp_path) -> None:
    result = _train(tmp_path / "run", "--env", "NoSuchEnv-v0", "--num-actors", "2", timeout=120)
    assert result.returncode == 1
    # The rank's one line, then the launcher's, naming the rank (not torchrun's placeholder),
    # all on stderr, without torchrun's OMP_NUM_THREADS banner.
    assert "rlfleet-train: error: Environment `NoSuchEnv` doesn't exist" in result.stderr
    assert "rlfleet-train: error: learner rank " in result.stderr
    assert "error" not in result.stdout
    assert "errors.html" not in result.stderr
    assert "OMP_NUM_THREADS" not in result.stderr


def _acted_on_while_training(
    out: pathlib.Path, act: Callable[[subprocess.Popen], None], *args: str
) -> tuple[subprocess.Popen, str, str]:
    """Two tiny ranks; ``act`` on the launcher once rank 0 trains; its stdout and stderr."""
    tiny = ["--num-envs", "2", "--frames-per-batch", "16", "--minibatch-size", "8", *args]
    learner = subprocess.Popen(
        [sys.executable, "-m", "apps.ppo", "--nproc-per-node", "2", "--out", str(out), *tiny],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while "frames=" not in learner.stderr.readline():  # rank 0 trains
            assert learner.poll() is None, learner.stderr.read()
        act(learner)
        out_text, err = learner.communicate(timeout=120)
    finally:
        learner.kill()
    return learner, out_text, err


def _rank_pids(launcher: subprocess.Popen) -> list[int]:
    """The ranks torchrun started, in rank order (the launcher's children)."""
    children = pathlib.Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text()
    return [int(pid) for pid in children.split()]


def test_two_ranks_stopped_by_sigterm_exit_130_with_their_outputs(tmp_path) -> None:
    out = tmp_path / "run"
    learner, _, err = _acted_on_while_training(out, lambda p: p.send_signal(signal.SIGTERM))
    assert learner.returncode == 130, err[-4000:]
    assert "rlfleet-train: interrupted" in err
    assert "SignalException" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True


def test_a_signal_to_one_rank_stops_both_with_their_outputs(tmp_path) -> None:
    out = tmp_path / "run"
    # As `kill` of one rank's process.
    learner, _, err = _acted_on_while_training(
        out, lambda p: os.kill(_rank_pids(p)[1], signal.SIGTERM)
    )
    # Rank 1 stopped alone while rank 0 waited in an all-reduce: "Connection closed by peer".
    assert learner.returncode == 130, err[-4000:]
    assert "Connection closed" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True


def test_a_rank_killed_is_named_with_its_signal(tmp_path) -> None:
    learner, _, err = _acted_on_while_training(
        tmp_path, lambda p: os.kill(_rank_pids(p)[1], signal.SIGKILL)
    )
    assert learner.returncode == 1, err[-4000:]
    assert "rlfleet-train: error: learner rank 1 was killed by SIGKILL" in err


def test_rank_0_failing_to_write_its_outputs_is_the_rank_named(tmp_path) -> None:
    """After the ranks agreed to stop, rank 1 waits for rank 0's outputs, failed or not."""
    parent = tmp_path / "outputs"
    # Rank 0's outputs cannot be written: "Not a directory".
    learner, out, err = _acted_on_while_training(
        parent / "run", lambda p: parent.touch(), "--num-actors", "2", "--total-frames", "1600"
    )
    assert learner.returncode == 1, err[-4000:]
    assert "rlfleet-train: error: [Errno 20] Not a directory" in err
    # Rank 1 left its barrier with rank 0, not on a closed connection, with its summary.
    assert "rlfleet-train: error: learner rank 0 exited with code 1" in err
    assert "Traceback" not in err
    assert "rank 1 of 2: CartPole-v1" in out


def test_train_refuses_a_fleet_that_does_not_split_over_the_ranks(tmp_path) -> None:
    result = _train(tmp_path / "run", "--num-actors", "3", timeout=60)
    assert result.returncode == 2
    assert "multiple of nproc_per_node" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(460)  # the run's own 400 s, and the rest
def test_train_two_ranks_reach_the_cartpole_target(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    result = _train(
        out,
        *("--num-actors", "4", "--num-envs", "4", "--frames-per-batch", "512"),
        *("--minibatch-size", "128", "--seed", "1", "--no-progress"),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reached_target"] is True, summary
    assert summary["final_return"] >= 475.0
    assert summary["frames"] < 2 * summary["settings"]["total_frames"]
