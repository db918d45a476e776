"""``--learner-device``: the checks before anything starts, and each rank's device and backend."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest
import torch
from torch import nn

from apps._job.cli import SignalsHeld
from apps._job.device import check_learner_device, rank_device, ranks_per_node
from apps._job.ranks import DataParallel, launch_ranks
from apps.grpo._settings import GRPOSettings
from apps.grpo._settings import parse_args as parse_grpo_args
from apps.ppo._settings import TrainSettings, parse_args

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, local: int) -> None:
    """This process's environment as torchrun gives it to rank ``rank`` of ``world``."""
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": world,
        "LOCAL_RANK": local,
        "LOCAL_WORLD_SIZE": world,
    }.items():
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize(
    ("value", "ranks", "gpus", "message"),
    [
        ("gpu", 1, 1, "must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        ("mps", 1, 1, "must be 'cpu', 'cuda' or 'cuda:N', got 'mps'"),
        ("cuda", 1, 0, "learner_device 'cuda': no CUDA device here"),
        ("cuda:0", 1, 0, "learner_device 'cuda:0': no CUDA device here"),
        ("cuda", 4, 2, "each of the 4 ranks on this machine its own GPU, but torch sees 2 GPU"),
        ("cuda:1", 2, 2, "names one GPU for 2 ranks on this machine"),
        ("cuda:2", 1, 2, "learner_device 'cuda:2': no such GPU (torch sees 2 GPU(s))"),
    ],
)
def test_check_learner_device_raises_if_the_machine_cannot_give_it(
    value: str, ranks: int, gpus: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_learner_device(value, ranks, gpus)


@pytest.mark.parametrize(
    ("value", "ranks", "gpus"),
    [("cpu", 8, 0), ("cuda", 2, 2), ("cuda", 1, 8), ("cuda:1", 1, 2)],
)
def test_check_learner_device_accepts_a_gpu_per_rank(value: str, ranks: int, gpus: int) -> None:
    check_learner_device(value, ranks, gpus)


def test_rank_device_gives_each_local_rank_its_own_gpu() -> None:
    assert [rank_device("cuda", r) for r in range(3)] == [
        torch.device("cuda", 0),
        torch.device("cuda", 1),
        torch.device("cuda", 2),
    ]
    assert rank_device("cuda:1", 0) == torch.device("cuda", 1)
    assert rank_device("cpu", 3) == torch.device("cpu")


def test_data_parallel_takes_nccl_and_the_local_gpu_on_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _as_rank(monkeypatch, rank=3, world=4, local=1)  # the second rank of the second machine
    ranks = DataParallel("cuda")  # not entered: no process group, no GPU touched
    assert (ranks.rank, ranks.world_size, ranks.local_rank) == (3, 4, 1)
    assert (ranks.device, ranks.backend) == (torch.device("cuda", 1), "nccl")
    cpu = DataParallel("cpu")
    assert (cpu.device, cpu.backend) == (torch.device("cpu"), "gloo")


def test_data_parallel_outside_torchrun_is_one_rank_that_wraps_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    module = nn.Linear(2, 2)
    with DataParallel("cpu") as ranks:
        assert (ranks.rank, ranks.world_size, ranks.active) == (0, 1, False)
        assert ranks.wrap(module) is module


def test_ranks_per_node_is_torchruns_under_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert ranks_per_node(3) == 3
    _as_rank(monkeypatch, rank=0, world=8, local=0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert ranks_per_node(1) == 4


def test_train_settings_check_the_learner_device_only_off_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_args(["--learner-device", "cpu"]).learner_device == "cpu"
    monkeypatch.setattr("apps.ppo._settings.cuda_device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"the 2 ranks on this machine .* torch sees 1 GPU"):
        TrainSettings(learner_device="cuda", nproc_per_node=2)
    assert TrainSettings(learner_device="cuda").learner_device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("extra", [[], ["--nproc-per-node", "2"]])
def test_train_exits_2_naming_the_device_without_cuda(extra: list[str]) -> None:
    # Before anything starts: no actor, no rank (a started fleet would take seconds).
    result = subprocess.run(
        [sys.executable, "-m", "apps.ppo", "--learner-device", "cuda", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "learner_device 'cuda': no CUDA device here" in result.stderr
    assert "Traceback" not in result.stderr


def test_grpo_settings_check_the_learner_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GRPOSettings(learner_device="cpu", loss="torchrl").learner_device == "cpu"
    monkeypatch.setattr("apps.grpo._settings.cuda_device_count", lambda: 2)
    assert GRPOSettings(learner_device="cuda", nproc_per_node=2).learner_device == "cuda"
    with pytest.raises(ValueError, match=r"needs --loss builtin .* got 'torchrl'"):
        GRPOSettings(learner_device="cuda", loss="torchrl")
    with pytest.raises(ValueError, match="names one GPU for 2 ranks"):
        GRPOSettings(learner_device="cuda:0", nproc_per_node=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_grpo_command_line_refuses_cuda_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_grpo_args(["--learner-device", "cuda:1"])
    assert info.value.code == 2
    assert "learner_device 'cuda:1': no CUDA device here" in capsys.readouterr().err


def test_a_ranks_learner_id_is_torchruns_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same across a rank's restarts: the replacement resumes its actors' sessions.
    _as_rank(monkeypatch, rank=1, world=2, local=1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    assert DataParallel("cpu").learner_id == "job-7"
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    assert DataParallel("cpu").learner_id == ""  # one process: a unique id per collector


def test_the_ranks_shares_of_a_local_fleet_cover_every_worker_id_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank r of N starts worker_ids r, r + N, ...: together every actor, none twice."""
    shares = []
    for rank in range(3):
        _as_rank(monkeypatch, rank=rank, world=3, local=rank)
        shares.append(DataParallel("cpu").worker_ids(6))
    assert shares == [[0, 3], [1, 4], [2, 5]]
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    assert DataParallel("cpu").worker_ids(3) == [0, 1, 2]  # one process: the whole fleet


@pytest.mark.parametrize(("exit_code", "returned"), [(0, 0), (3, 1), (130, 130)])
def test_launch_ranks_maps_a_ranks_exit_code_to_the_jobs(
    exit_code: int, returned: int, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's failure is the job's exit 1 (naming the rank), its Ctrl-C the job's 130."""
    (tmp_path / "fake_rank.py").write_text(
        f"import os, sys\nsys.exit({exit_code} if os.environ['RANK'] == '1' else 0)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # launch_ranks sets it for torchrun
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    handlers = {signum: signal.getsignal(signum) for signum in signums}
    try:
        assert launch_ranks("prog", "fake_rank", 2, []) == returned
    finally:  # torchrun leaves its own handlers installed: give pytest back its own
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def test_one_rank_stops_at_the_step_that_says_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside torchrun the loop ends at the step that reached the budget or target: no batch
    after it is trained on."""
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    seen: list[int] = []

    def step(batch: int) -> bool:
        seen.append(batch)
        return batch == 3

    with SignalsHeld("prog") as signals, DataParallel("cpu") as ranks:
        ranks.run_together(range(10), step, signals)
    assert seen == [0, 1, 2, 3]
