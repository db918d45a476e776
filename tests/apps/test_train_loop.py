"""rlfleet-train's loop against a real in-process actor: the schedule, the stops, the summary.

The learning rate decays linearly with the frames trained on before each batch (the first
batch at ``--lr``, none at 0), as CleanRL's and TorchRL's PPO scripts anneal it; with
``--no-anneal-lr`` it stays ``--lr``. The run stops at ``--total-frames`` or at the first
batch whose last 20 episode returns reach the target, and its summary and outputs say so.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator

import pytest
import torch

from actor_service import ActorConfig, ModelSpec, create_server
from apps._job.cli import EXIT_ERROR, FleetMismatchError
from apps.ppo import _loop, main
from apps.ppo._episodes import EpisodeTracker
from apps.ppo._ppo import PPOLearner
from apps.ppo._settings import RETURN_WINDOW, TrainSettings
from common.weights import decode_weights

FRAMES_PER_BATCH = 32
LR = 0.003


@pytest.fixture(scope="module")
def actor_address() -> Iterator[str]:
    """One in-process CartPole actor with the ``mlp`` policy of the runs' hidden sizes."""
    config = ActorConfig(
        port=0,
        num_envs=2,
        seed=0,
        models=(ModelSpec(kwargs={"hidden": [8]}),),
        grace_period=1.0,
    )
    with create_server(config).run_in_thread() as handle:
        yield f"127.0.0.1:{handle.port}"


def _settings(address: str, out: pathlib.Path, **flags: object) -> TrainSettings:
    """A run on the in-process actor: 32-frame batches, one epoch, no target unless given."""
    fields: dict[str, object] = {
        "actors": (address,),
        "take_over": True,
        "num_envs": 2,
        "frames_per_batch": FRAMES_PER_BATCH,
        "minibatch_size": FRAMES_PER_BATCH,
        "epochs": 1,
        "hidden": (8,),
        "target_return": float("inf"),
        "progress": False,
        "out": str(out),
    }
    return TrainSettings(**{**fields, **flags})  # type: ignore[arg-type]


def _lrs_of_a_run(
    address: str, out: pathlib.Path, monkeypatch: pytest.MonkeyPatch, **flags: object
) -> list[float]:
    """The learning rate of every batch's update in a run of ``flags`` on the actor."""
    lrs: list[float] = []
    update = PPOLearner.update

    def recording_update(learner: PPOLearner, batch: object) -> dict[str, float]:
        lrs.append(learner.optimizer.param_groups[0]["lr"])
        return update(learner, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(PPOLearner, "update", recording_update)
    summary = _loop.train(_settings(address, out, lr=LR, **flags))
    assert summary.batches == len(lrs)
    return lrs


def test_the_learning_rate_anneals_linearly_by_the_frames_before_each_batch(
    actor_address: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lrs = _lrs_of_a_run(
        actor_address, tmp_path, monkeypatch, total_frames=4 * FRAMES_PER_BATCH, anneal_lr=True
    )
    assert lrs == pytest.approx([LR, 0.75 * LR, 0.5 * LR, 0.25 * LR])


def test_without_annealing_every_batch_trains_at_the_given_learning_rate(
    actor_address: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lrs = _lrs_of_a_run(
        actor_address, tmp_path, monkeypatch, total_frames=3 * FRAMES_PER_BATCH, anneal_lr=False
    )
    assert lrs == pytest.approx([LR] * 3)


def test_the_summary_and_summary_json_count_the_frames_batches_and_fps_of_the_run(
    actor_address: str, tmp_path: pathlib.Path
) -> None:
    summary = _loop.train(_settings(actor_address, tmp_path, total_frames=3 * FRAMES_PER_BATCH))
    assert (summary.frames, summary.batches, summary.ranks) == (3 * FRAMES_PER_BATCH, 3, 1)
    assert summary.fps == pytest.approx(summary.frames / summary.wall_time_s)
    assert summary.target_return is None
    assert summary.reached_target is False
    assert summary.interrupted is False
    assert summary.policy_version >= 4  # the first push and one per batch, on the actor's
    assert summary.final_return is not None
    assert summary.final_return > 0
    record = json.loads((tmp_path / "summary.json").read_text())
    assert {k: record[k] for k in ("frames", "batches", "episodes", "final_return")} == {
        "frames": summary.frames,
        "batches": 3,
        "episodes": summary.episodes,
        "final_return": summary.final_return,
    }
    _, metadata = decode_weights((tmp_path / "policy.safetensors").read_bytes())
    assert metadata["frames"] == str(summary.frames)
    assert metadata["policy_version"] == str(summary.policy_version)


def test_the_run_stops_at_the_first_batch_whose_last_20_returns_reach_the_target(
    actor_address: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episodes: list[int] = []  # the episodes finished after each batch
    add = EpisodeTracker.add

    def counting_add(tracker: EpisodeTracker, batch: object, frames: int) -> list[float]:
        finished = add(tracker, batch, frames)
        episodes.append(len(tracker.returns))
        return finished

    monkeypatch.setattr(EpisodeTracker, "add", counting_add)
    # Every CartPole episode returns at least 1: the target is reached once 20 are in.
    settings = _settings(actor_address, tmp_path, total_frames=100 * FRAMES_PER_BATCH)
    summary = _loop.train(dataclasses.replace(settings, target_return=1.0))
    assert summary.reached_target is True
    assert summary.final_return is not None
    assert summary.final_return >= 1.0
    assert summary.batches == len(episodes) < 100
    assert summary.episodes == episodes[-1]
    assert episodes[-1] >= RETURN_WINDOW > ([0, *episodes][-2])
    assert summary.frames == summary.batches * FRAMES_PER_BATCH


def test_progress_shows_every_log_every_batches_and_the_last(
    actor_address: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _settings(actor_address, tmp_path, total_frames=5 * FRAMES_PER_BATCH, log_every=2)
    _loop.train(settings)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("frames=")]
    assert [line.split()[0] for line in lines] == ["frames=64", "frames=128", "frames=160"]


def test_two_runs_with_one_seed_on_an_existing_actor_train_the_same_weights(
    actor_address: str, tmp_path: pathlib.Path
) -> None:
    weights = []
    for run in ("a", "b"):
        settings = _settings(actor_address, tmp_path / run, total_frames=2 * FRAMES_PER_BATCH)
        _loop.train(dataclasses.replace(settings, seed=11))
        weights.append(decode_weights((tmp_path / run / "policy.safetensors").read_bytes())[0])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_an_actor_behind_a_token_is_checked_for_the_env_and_the_hidden_sizes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ActorConfig(
        port=0, num_envs=2, models=(ModelSpec(kwargs={"hidden": [8]}),), token="s3cret"
    )
    monkeypatch.setenv("RLFLEET_TOKEN", "s3cret")
    with create_server(config).run_in_thread() as handle:
        address = f"127.0.0.1:{handle.port}"
        settings = _settings(address, tmp_path, total_frames=FRAMES_PER_BATCH)
        with pytest.raises(FleetMismatchError, match=r"--env Acrobot-v1, but the actors at"):
            _loop.train(dataclasses.replace(settings, env="Acrobot-v1"))
        shapes = r"--hidden 16 builds a policy whose \S+ is \[16\], but .* holds \[8\];"
        with pytest.raises(FleetMismatchError, match=shapes):
            _loop.train(dataclasses.replace(settings, hidden=(16,)))
        assert _loop.train(settings).frames == FRAMES_PER_BATCH  # theirs: it trains


@pytest.mark.parametrize("actors", [False, True])
def test_a_token_no_header_carries_ends_the_run_with_one_line_naming_rlfleet_token(
    actors: bool,
    actor_address: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``RLFLEET_TOKEN=$(...)`` with a newline kept: a ValueError traceback from the local
    fleet once, or an error blaming ``--actors``; now exit 1 naming the variable."""
    monkeypatch.setenv("RLFLEET_TOKEN", "s3cret\n")
    flags = ["--frames-per-batch", "32", "--minibatch-size", "32", "--no-progress"]
    flags += ["--actors", actor_address] if actors else ["--num-actors", "1", "--num-envs", "1"]
    assert main([*flags, "--out", str(tmp_path / "run")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("rlfleet-train: error: RLFLEET_TOKEN: token must hold printable ASCII")
    assert "Traceback" not in err


def test_an_env_whose_spaces_the_policy_cannot_take_ends_the_run_with_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blackjack's Tuple observations: a ValueError traceback once, now exit 1 naming the env,
    before any actor is started."""
    flags = ["--env", "Blackjack-v1", "--num-actors", "1", "--num-envs", "1"]
    flags += ["--frames-per-batch", "32", "--minibatch-size", "32", "--no-progress"]
    assert main([*flags, "--out", str(tmp_path / "run")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("rlfleet-train: error: --env Blackjack-v1: observation space Tuple(")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
