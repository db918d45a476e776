"""TorchRL-env actors on pixel envs and multi-agent envs, held to TorchRL's ``Collector``.

Pixels: a small deterministic ``uint8`` env under ``ToTensorImage``, ``GrayScale``,
``Resize`` (with torchvision only) and ``CatFrames`` (``rlfleet_test_pixels``).
Multi-agent: TorchRL's ``MultiAgentCountingEnv`` and VMAS (when installed), whose
``("agents", ...)`` keys carry their own reward and done. Each batch crosses the wire
folded (the learner's default), so the fold is checked on every one of them too.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("torchrl")
import rlfleet_test_pixels as pixels
from torchrl_harness import (
    TRAJ_IDS,
    any_done,
    assert_equal_batches,
    fleet_batches,
    torchrl_batches,
    torchrl_config,
)

from actor_service._kinds.torchrl.core import TorchRLCore
from common.config import CollectSettings
from common.packets.folding import FoldedBatch

HAS_VMAS = importlib.util.find_spec("vmas") is not None


def _parity(env: str, policy: str, batches: int = 2, **settings: Any) -> list[TensorDict]:
    frames = settings.pop("frames_per_batch", 60)
    reset = settings.pop("reset_after_seed", False)
    ours = fleet_batches(torchrl_config(env, policy), batches, frames, **settings)
    theirs = torchrl_batches(env, policy, batches, frames, reset_after_seed=reset, **settings)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference, split=settings.get("split_trajs", False))
    assert any_done(ours), "an episode must end for the check to mean something"
    return ours


@pytest.mark.parametrize(
    ("policy", "settings"),
    [
        ("pixel_policy", {}),
        ("pixel_sampling_policy", {"init_random_frames": 30}),
        ("pixel_sampling_policy", {"split_trajs": True}),
        ("pixel_policy", {"max_frames_per_traj": 3, "reset_at_each_iter": True}),
    ],
    ids=["greedy", "probabilistic", "split-trajs", "max-frames-reset"],
)
def test_torchrl_actor_pixel_batches_equal_torchrl_collector_batches(
    policy: str, settings: dict[str, Any]
) -> None:
    if "max_frames_per_traj" in settings:  # the env counts its steps already
        env = "rlfleet_test_pixels:pixels"
        policy = "raw_pixel_policy"
    else:
        env = "rlfleet_test_pixels:atari_like"
    ours = _parity(env, f"rlfleet_test_pixels:{policy}", **settings)
    if env.endswith("atari_like") and not settings:
        stacked = ours[0]["pixels"]
        assert stacked.dtype == torch.float32
        assert stacked.shape[-3:] == (pixels.STACK, *(2 * [8 if pixels.HAS_RESIZE else 12]))


@pytest.mark.torchvision
@pytest.mark.skipif(not pixels.HAS_RESIZE, reason="TorchRL's Resize needs torchvision")
def test_torchrl_actor_resized_pixels_equal_torchrl_collector_batches() -> None:
    _parity("rlfleet_test_pixels:atari_like", "rlfleet_test_pixels:pixel_policy")


@pytest.mark.parametrize("env", ["atari_like", "pixels"])
def test_torchrl_core_folds_pixels_and_stacked_frames_exactly(env: str) -> None:
    batches = []
    for fold in (False, True):
        config = torchrl_config(f"rlfleet_test_pixels:{env}", "random")
        with TorchRLCore(config) as core:
            core.configure(CollectSettings(frames_per_batch=40, fold_observations=fold))
            batches.append(core.collect_batch())
    plain, folded = batches
    assert isinstance(plain, TensorDict)
    assert isinstance(folded, FoldedBatch)
    assert "pixels" in folded.finals
    assert ("next", "pixels") not in folded.batch.keys(True, True)
    assert plain["next", "done"].any()  # finals were needed
    rebuilt = folded.unfold()
    assert rebuilt["pixels"].dtype == plain["pixels"].dtype
    # Two cores draw two epochs, so their trajectory ids differ; all else is equal.
    assert (rebuilt.exclude(TRAJ_IDS) == plain.exclude(TRAJ_IDS)).all()


def test_torchrl_actor_multi_agent_batches_equal_torchrl_collector_batches() -> None:
    batch = _parity("multi_agent_counting", "random", frames_per_batch=40, reset_after_seed=True)[0]
    agents = batch["next", "agents"]
    for agent in ("agent_0", "agent_1", "agent_2"):
        for key in ("observation", "reward", "done", "terminated"):
            assert (agent, key) in agents.keys(True, True), (agent, key)
    assert batch["next", "env_done"].any()


@pytest.mark.skipif(not HAS_VMAS, reason="vmas is not installed")
def test_torchrl_actor_vmas_batches_equal_torchrl_collector_batches() -> None:
    env, policy = "rlfleet_test_agents:vmas_balance", "rlfleet_test_agents:vmas_policy"
    ours = fleet_batches(torchrl_config(env, policy, num_envs=4), 2, 48)
    theirs = torchrl_batches(env, policy, 2, 48, num_envs=None)
    # VMAS's reset reports the info its last reward computed: the actor's probe step
    # computed one (TorchRL's collector takes no such step), so the first frame's root
    # info differs, and only it.
    info = ("agents", "info")
    first = ours[0].get(info)[:, 0].clone()
    ours[0].get(info)[:, 0] = theirs[0].get(info)[:, 0]
    assert not (first == ours[0].get(info)[:, 0]).all()
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference)
    assert ours[0]["next", "agents", "reward"].shape == (4, 12, 3, 1)
    assert any_done(ours)


@pytest.mark.skipif(not HAS_VMAS, reason="vmas is not installed")
def test_torchrl_actor_heterogeneous_agent_groups_equal_torchrl_collector_batches() -> None:
    """Agents of two shapes, a group each (VMAS's default grouping): dense per group."""
    env, policy = "rlfleet_test_agents:vmas_tag", "rlfleet_test_agents:vmas_groups_policy"
    ours = fleet_batches(torchrl_config(env, policy, num_envs=4), 2, 48)
    theirs = torchrl_batches(env, policy, 2, 48, num_envs=None)
    for mine, reference in zip(ours, theirs, strict=True):
        assert_equal_batches(mine, reference)
    assert ours[0]["next", "adversary", "observation"].shape == (4, 12, 3, 16)
    assert ours[0]["next", "agent", "observation"].shape == (4, 12, 1, 14)
    assert any_done(ours)


@pytest.mark.skipif(not HAS_VMAS, reason="vmas is not installed")
def test_torchrl_actor_refuses_one_group_of_two_shapes_naming_the_groups_fix() -> None:
    config = torchrl_config("rlfleet_test_agents:vmas_tag_one_group", "random", num_envs=4)
    with pytest.raises(ValueError, match="agents of different shapes") as raised:
        TorchRLCore(config)
    assert "a group of its own" in str(raised.value)
