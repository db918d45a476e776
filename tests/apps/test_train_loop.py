"""rlfleet-train's loop against a real in-process actor: the learning rate's schedule.

The learning rate decays linearly with the frames trained on before each batch (the first
batch at ``--lr``, none at 0), as CleanRL's and TorchRL's PPO scripts anneal it; with
``--no-anneal-lr`` it stays ``--lr``.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from actor_service import ActorConfig, ModelSpec, create_server
from apps.ppo import _loop
from apps.ppo._ppo import PPOLearner
from apps.ppo._settings import TrainSettings

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
    settings = TrainSettings(
        actors=(address,),
        take_over=True,
        num_envs=2,
        frames_per_batch=FRAMES_PER_BATCH,
        minibatch_size=FRAMES_PER_BATCH,
        epochs=1,
        hidden=(8,),
        lr=LR,
        target_return=float("inf"),
        progress=False,
        out=str(out),
        **flags,  # type: ignore[arg-type]
    )
    summary = _loop.train(settings)
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
