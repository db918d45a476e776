"""A Hydra script's config handed to its factories on a fleet: a DictConfig on the actor too.

``env_kwargs={"cfg": cfg}`` and ``policy_kwargs={"cfg": cfg}`` with the script's
``DictConfig`` travel as JSON and the actors' factories get a ``DictConfig`` back (the
factories here raise on anything else). A real ``LocalFleet`` of one TorchRL-env actor, and
one LLM actor whose task factory gets ``task_kwargs={"cfg": cfg}`` the same way.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl")
from learner_fleet import ACTOR_ENV

from learner_client import GrpcCollector, GrpcLLMCollector, LocalFleet

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


@pytest.mark.long
def test_an_llm_task_factory_gets_the_scripts_hydra_config_as_a_dictconfig(monkeypatch) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    pytest.importorskip("transformers")
    monkeypatch.setenv("PYTHONPATH", ACTOR_ENV["PYTHONPATH"])
    cfg = omegaconf.OmegaConf.create({"retries": 1})
    fleet = LocalFleet(
        1,
        kind="llm",
        task="rlfleet_test_tasks:cfg_arith",  # raises on anything but a DictConfig
        task_kwargs={"cfg": cfg},
        policy_kwargs={"hidden": 32, "layers": 1, "seed": 0},
        num_envs=2,
        seed=0,
        grace_period=1.0,
    )
    with (
        fleet,
        GrpcLLMCollector(
            fleet.addresses,
            dialog_turns_per_batch=2,
            total_dialog_turns=4,
            generation={"max_new_tokens": 2},
            batch_timeout=60.0,
        ) as collector,
    ):
        batches = list(collector)
    assert sum(batch.numel() for batch in batches) == 4
