"""A Hydra script's config handed to its factories on a fleet: a DictConfig on the actor too.

``env_kwargs={"cfg": cfg}`` and ``policy_kwargs={"cfg": cfg}`` with the script's
``DictConfig`` travel as JSON and the actors' factories get a ``DictConfig`` back (the
factories here raise on anything else). A real ``LocalFleet`` of one TorchRL-env actor.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl")
from learner_fleet import ACTOR_ENV

from learner_client import GrpcCollector, LocalFleet

pytestmark = pytest.mark.usefixtures("loopback_only")


def test_factories_get_the_scripts_hydra_config_as_a_dictconfig(monkeypatch) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    monkeypatch.setenv("PYTHONPATH", ACTOR_ENV["PYTHONPATH"])  # LocalFleet's actors inherit it
    cfg = omegaconf.OmegaConf.create({"env": {"name": "Pendulum-v1"}, "seed": 1})
    fleet = LocalFleet(
        1,
        kind="torchrl",
        env_factory="rlfleet_test_torchrl:cfg_pendulum",
        env_kwargs={"cfg": cfg},
        policy="rlfleet_test_torchrl:cfg_policy",
        policy_kwargs={"cfg": cfg},
        num_envs=1,
        seed=0,
        grace_period=1.0,
    )
    with GrpcCollector(fleet, frames_per_batch=8, total_frames=16, sync=True) as collector:
        batches = list(collector)  # the factories raise on anything but a DictConfig
    assert [tuple(b.batch_size) for b in batches] == [(1, 1, 8), (1, 1, 8)]
    assert batches[0]["next", "step_count"].max() == 8  # cfg_pendulum's StepCounter
