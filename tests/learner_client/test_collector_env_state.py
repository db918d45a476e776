"""The script's env after N batches on a fleet: what TorchRL's helpers and ``state_dict()`` expect.

TorchRL's ``Collector(create_env_fn=train_env, ...)`` steps ``train_env`` itself, so a
script reads its stateful transforms afterwards: ``ppo_mujoco.py`` at pytorch/rl main
saves ``utils_mujoco.get_vecnorm_state(train_env)`` with every checkpoint (copied below).
On a fleet the actors step their own envs and the script's env, never stepped, takes the
first actor's env state after each batch: for each stateful transform TorchRL ships it must
then hold what a stepped env holds (``VecNorm`` v1's ``loc`` included, which a fresh
``VecNorm`` lacks) and round-trip through ``state_dict()``. Real ``--kind torchrl`` actors
on loopback, on Pendulum-v1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch

pytest.importorskip("torchrl")
import rlfleet_test_torchrl  # the actors' own factories (on the path learner_fleet sets)
from hostile_harness import EPOCH, HostileActor, batch, serve
from learner_fleet import ACTOR_ENV, start_actors
from torchrl.envs import VecNorm

from common.actor_state import decode_state
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import GrpcCollector, _script_env

pytestmark = [
    pytest.mark.usefixtures("loopback_only"),
    pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning"),  # another test's subject
]


# Copied from pytorch/rl main (commit ae9719f17b1517af5c2523a36c4616f003ee55cf),
# sota-implementations/ppo/utils_mujoco.py, BSD-licensed, Copyright (c) Meta Platforms, Inc.
def get_vecnorm_state(env: Any) -> dict[str, torch.Tensor] | None:
    """Extracts frozen VecNorm observation statistics for rlrender checkpoints.

    Returns ``None`` when the environment holds no reachable VecNorm transform
    (e.g. observation normalization is disabled).
    """
    transform = getattr(env, "transform", None)
    if transform is None:
        return None
    try:
        transforms = list(transform)
    except TypeError:
        transforms = [transform]
    for item in transforms:
        if isinstance(item, VecNorm):
            loc = item.loc.get("observation", None)
            scale = item.scale.get("observation", None)
            if loc is None or scale is None:
                return None
            return {
                "loc": loc.detach().cpu().clone(),
                "scale": scale.detach().cpu().clone(),
            }
    return None


def _actor(factory: str) -> Iterator[str]:
    base = ["--kind", "torchrl", "--env-factory", f"rlfleet_test_torchrl:{factory}"]
    (actor,) = start_actors(
        [[*base, "--worker-id", "0", "--num-envs", "1", "--seed", "0"]], ACTOR_ENV
    )
    yield actor.address
    actor.close()


@pytest.fixture(scope="module")
def vecnorm_v1_actor() -> Iterator[str]:
    yield from _actor("vecnorm_v1_pendulum")


@pytest.fixture(scope="module")
def stateful_actor() -> Iterator[str]:
    yield from _actor("stateful_pendulum")


def _run(address: str, env: Any, batches: int = 3) -> dict[str, Any]:
    """``batches`` batches with ``env`` as ``create_env_fn``; the actor's env state then."""
    with GrpcCollector(
        [address], create_env_fn=env, frames_per_batch=16, total_frames=16 * batches, sync=True
    ) as collector:
        assert len(list(collector)) == batches
        return dict(collector.actor_state(0)["env"]["worker0"])


def _flat(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
        elif hasattr(value, "items"):
            out |= _flat(value, f"{prefix}{key}/")
    return out


def _assert_same_state(got: Any, want: Any) -> None:
    got, want = _flat(got), _flat(want)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        assert torch.equal(got[key].to(value.dtype), value), key


def test_get_vecnorm_state_reads_a_never_stepped_scripts_env(vecnorm_v1_actor: str) -> None:
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()  # ppo_mujoco's VecNorm, never stepped
    actor = _run(vecnorm_v1_actor, env)
    stats = get_vecnorm_state(env)
    assert stats is not None
    (extra,) = [v for k, v in actor.items() if k.endswith("_extra_state")]
    loc = extra["observation_sum"] / extra["observation_count"]
    assert torch.allclose(stats["loc"], loc)
    assert stats["scale"].shape == loc.shape
    assert float(extra["observation_count"]) > 16  # three batches of statistics


def test_a_restore_gives_the_scripts_env_the_checkpoints_env_state(vecnorm_v1_actor: str) -> None:
    """As TorchRL's ``Collector.load_state_dict`` loads its env: before any batch."""
    with GrpcCollector(
        [vecnorm_v1_actor], create_env_fn=rlfleet_test_torchrl.vecnorm_v1_pendulum(),
        frames_per_batch=16, sync=True,
    ) as collector:  # fmt: skip
        collector.next()
        collector.next()
        saved = collector.state_dict()
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    with GrpcCollector(
        [vecnorm_v1_actor], create_env_fn=env, frames_per_batch=16, sync=True
    ) as collector:
        collector.next()  # the actor moves on from the checkpoint...
        collector.load_state_dict(saved)  # ...and goes back to it, the script's env with it
        stats = get_vecnorm_state(env)
    state = decode_state(saved["workers"][0].numpy().tobytes())["env"]["worker0"]
    (extra,) = [v for k, v in state.items() if k.endswith("_extra_state")]
    assert stats is not None
    assert torch.allclose(stats["loc"], extra["observation_sum"] / extra["observation_count"])


# TorchRL's own warning at a plain load into a VecNorm that saw no frame (shared statistics)
@pytest.mark.filterwarnings("ignore:VecNorm wasn't initialized:UserWarning")
def test_a_vecnorm_v1_state_round_trips_into_a_fresh_env(vecnorm_v1_actor: str) -> None:
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    _run(vecnorm_v1_actor, env, batches=2)
    fresh = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    fresh.load_state_dict(env.state_dict())
    _assert_same_state(fresh.state_dict(), env.state_dict())
    assert torch.equal(get_vecnorm_state(fresh)["loc"], get_vecnorm_state(env)["loc"])


@pytest.mark.parametrize("stepped", [False, True], ids=["never-stepped", "stepped"])
def test_every_stateful_transform_holds_the_actors_state(
    stateful_actor: str, stepped: bool
) -> None:
    env = rlfleet_test_torchrl.stateful_pendulum()
    if stepped:
        env.rollout(2)  # the script's own frames: replaced by the actor's
    actor = _run(stateful_actor, env)
    state = env.state_dict()
    _assert_same_state(state, actor)
    names = {type(t).__name__ for t in env.transform}
    assert {"VecNormV2", "ObservationNorm", "RewardScaling", "StepCounter", "InitTracker"} <= names
    assert "CatFrames" in names
    reference = rlfleet_test_torchrl.stateful_pendulum()  # TorchRL's own path: a plain load
    reference.rollout(1)
    reference.load_state_dict(actor)
    for got, want in zip(env.transform, reference.transform, strict=True):
        for name in ("loc", "scale"):
            if hasattr(want, name):
                torch.testing.assert_close(getattr(got, name), getattr(want, name))
    fresh = rlfleet_test_torchrl.stateful_pendulum()
    fresh.rollout(1)  # CatFrames builds its buffer at the first step
    fresh.load_state_dict(state)
    _assert_same_state(fresh.state_dict(), state)


def test_a_restore_during_a_batchs_env_state_load_leaves_the_checkpoints_state(
    vecnorm_v1_actor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer's ``next()`` read the actor's env state, then ``load_state_dict`` restored a
    checkpoint on another thread: the script's env ends with the checkpoint's state, never
    with the older read loaded over it."""
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    joined, gate, held = _script_env.joined_state, threading.Event(), threading.Event()
    with GrpcCollector(
        [vecnorm_v1_actor], create_env_fn=env, frames_per_batch=16, sync=True
    ) as collector:
        collector.next()
        saved = collector.state_dict()
        collector.next()  # the actor moves on from the checkpoint

        def held_join(states: list[Any], script_env: Any) -> Any:
            if threading.current_thread() is consumer:
                held.set()
                gate.wait(10)
            return joined(states, script_env)

        monkeypatch.setattr(_script_env, "joined_state", held_join)
        consumer = threading.Thread(target=collector.next)
        consumer.start()
        assert held.wait(10)
        restorer = threading.Thread(target=collector.load_state_dict, args=(saved,))
        restorer.start()
        restorer.join(1.0)  # done at once unless it waits for the consumer's load
        gate.set()
        consumer.join(30)
        restorer.join(30)
        assert not consumer.is_alive()
        assert not restorer.is_alive()
        stats = get_vecnorm_state(env)
    state = decode_state(saved["workers"][0].numpy().tobytes())["env"]["worker0"]
    (extra,) = [v for k, v in state.items() if k.endswith("_extra_state")]
    assert stats is not None
    assert torch.allclose(stats["loc"], extra["observation_sum"] / extra["observation_count"])


class _SilentActor(HostileActor):
    """Describes itself as another actor of the fleet, opens sessions and sends no batch; it
    answers no GetState: UNIMPLEMENTED, or (``slow``) no reply until the caller gives up."""

    def __init__(self, description: pb.DescribeResponse, *, slow: bool) -> None:
        super().__init__(description, batch)
        self.slow = slow

    def GetState(self, request: pb.GetStateRequest, context: Any) -> Any:
        while self.slow and context.is_active():
            time.sleep(0.05)
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        next(requests)
        yield pb.CollectResponse(opened=pb.SessionOpened(worker_id=1, epoch=EPOCH, next_seq=1))
        for _ in requests:  # credits, never used; the learner's close ends the call
            pass


@pytest.mark.parametrize("slow", [False, True], ids=["unimplemented", "slow"])
def test_the_scripts_env_follows_the_first_actor_whatever_another_actor_answers(
    vecnorm_v1_actor: str, slow: bool
) -> None:
    """The first actor's env state is one GetState of that actor: another actor that does
    not answer GetState neither stops the script's env from following nor holds it up."""
    channel = grpc.insecure_channel(vecnorm_v1_actor)
    described = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    channel.close()
    described.worker_id, described.epoch = 1, EPOCH
    server, silent = serve(_SilentActor(described, slow=slow))
    env = rlfleet_test_torchrl.vecnorm_v1_pendulum()
    try:
        with GrpcCollector(
            [vecnorm_v1_actor, silent], create_env_fn=env, frames_per_batch=16, call_timeout=10
        ) as collector:
            started = time.monotonic()
            collector.next()
            assert time.monotonic() - started < 5.0  # not the call_timeout of 10 s
            stats = get_vecnorm_state(env)
            assert stats is not None, "the script's env did not take the first actor's state"
            assert collector.actor_state(0)["frames"] >= 16  # that actor's alone, too
    finally:
        server.stop(None)
