"""A TorchRL script's collector line, pointed at a fleet: every argument, the shared policy.

TorchRL 0.14.1's collectors are read from the installed package (signatures, the
``EGreedyModule`` that anneals a buffer); the actors are real subprocesses on loopback.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import warnings
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import rlfleet_test_torchrl  # the actors' own factories (on the path learner_fleet sets)
import torch
from learner_fleet import ACTOR_ENV, cartpole_policy, start_actors
from tensordict import TensorDict
from torchrl.collectors import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.collectors.distributed import RayCollector
from torchrl.envs import GymEnv

from actor_service._core._placement import CompiledForward
from common.config import CompileSettings
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import GrpcCollector
from learner_client._torchrl_compat import NO_EFFECT, TorchRLOnly

TORCHRL_CLASSES = (Collector, MultiSyncCollector, MultiAsyncCollector, AsyncCollector, RayCollector)
# Arguments TorchRL requires (no default) or that a fleet takes as its first argument.
REQUIRED = {"self", "create_env_fn", "frames_per_batch"}

pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def cartpole() -> Iterator[list[str]]:
    args = [["--worker-id", str(w), "--num-envs", "2", "--seed", str(50 + w)] for w in range(2)]
    actors = start_actors(args)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


def _declared(cls: type) -> dict[str, inspect.Parameter]:
    """The named ``__init__`` parameters of ``cls`` (the first class up the MRO that has them)."""
    for klass in cls.__mro__:
        params = inspect.signature(klass.__init__).parameters
        named = {
            n: p
            for n, p in params.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"
        }
        if named:
            return named
    raise AssertionError(f"no named __init__ parameters on {cls}")


def test_every_argument_of_torchrl_collectors_is_accepted_with_its_default(
    cartpole: list[str],
) -> None:
    """Each argument TorchRL's Collector, MultiSyncCollector, MultiAsyncCollector,
    AsyncCollector and RayCollector declare is a GrpcCollector argument; each of their
    defaults constructs a collector without a TypeError and without a warning."""
    ours = inspect.signature(GrpcCollector.__init__).parameters
    declared: dict[str, list[Any]] = {}
    for cls in TORCHRL_CLASSES:
        for name, param in _declared(cls).items():
            assert name in ours, f"{cls.__name__}({name}=...) is not a GrpcCollector argument"
            values = declared.setdefault(name, [])
            if param.default is not param.empty and param.default not in values:
                values.append(param.default)
    assert {"device", "storing_device", "policy_device", "compile_policy"} <= set(declared)
    assert {"weight_sync_schemes", "update_at_each_batch", "trust_policy"} <= set(declared)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, values in sorted(declared.items()):
            for value in values if name not in REQUIRED else []:
                with GrpcCollector(cartpole, frames_per_batch=16, **{name: value}) as collector:
                    assert collector.worker_ids == [0, 1], (name, value)
    assert set(NO_EFFECT) <= set(declared)  # nothing documented as inert that TorchRL lacks


def test_torchrl_only_holds_every_inert_and_every_refused_argument() -> None:
    """What the collector passes by name is exactly what is checked, no name left over."""
    refused = {"trajs_per_batch", "trajs_per_write", "traj_format"}
    assert {f.name for f in dataclasses.fields(TorchRLOnly)} == set(NO_EFFECT) | refused


def test_torchrl_attributes_aliases_and_refusals(cartpole: list[str]) -> None:
    """The attributes scripts read; ``update_at_each_batch``; what is refused or warned."""
    with GrpcCollector(
        cartpole, frames_per_batch=16, total_frames=64, init_random_frames=32, sync=True
    ) as collector:
        assert (collector.total_frames, collector.frames_per_batch) == (64, 16)
        assert collector.requested_frames_per_batch == 16
        assert collector.init_random_frames == 32
        assert collector.policy is None
        with pytest.raises(AttributeError):
            collector.total_frames = 1  # type: ignore[misc]
    with GrpcCollector(cartpole, frames_per_batch=16, update_at_each_batch=True) as collector:
        assert collector._batch.update_after_each_batch
        # TorchRL's values for none: an endless budget is inf (scripts compare frame counts
        # with it), no random frames 0.
        assert (collector.total_frames, collector.init_random_frames) == (math.inf, 0)
    with pytest.raises(ValueError, match="trajs_per_batch"):
        GrpcCollector(cartpole, frames_per_batch=16, trajs_per_batch=4)
    with pytest.warns(UserWarning, match="weight_sync_schemes"):
        GrpcCollector(cartpole, frames_per_batch=16, weight_sync_schemes={"policy": 1}).shutdown()
    with pytest.raises(ValueError, match="compile_policy options"):
        GrpcCollector(cartpole, frames_per_batch=16, compile_policy={"options": {"x": 1}})


@pytest.mark.parametrize("sync", [True, False])
def test_num_workers_and_frames_per_batch_worker_as_torchrls_multi_collectors(
    cartpole: list[str], sync: bool
) -> None:
    """MultiSyncCollector(frames_per_batch=16) over 2 workers: 2 and 8 each; async: 16."""
    with GrpcCollector(cartpole, frames_per_batch=16, sync=sync) as collector:
        assert collector.num_workers == 2
        expected = 8 if sync else 16
        assert collector.frames_per_batch_worker() == expected
        assert collector.frames_per_batch_worker(worker_idx=1) == expected
        batch = collector.next()
        part = batch[0] if sync else batch  # sync: [workers, envs, time]
        assert part.numel() == expected


@pytest.mark.parametrize("sync", [True, False])
def test_a_budget_whole_batches_overshoot_warns_as_torchrl_and_collects_them(
    cartpole: list[str], sync: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = (
        r"total_frames \(100\) is not exactly divisible by frames_per_batch \(32\)\. This "
        r"means 28 additional frames will be collected\. To silence this message, set the "
        "environment variable RL_WARNINGS to False"
    )
    with pytest.warns(UserWarning, match=message) as warned:
        collector = GrpcCollector(cartpole, frames_per_batch=32, total_frames=100, sync=sync)
    assert warned[0].filename == __file__  # the script's line, as TorchRL's stacklevel
    with collector:
        assert [b.numel() for b in collector] == [32, 32, 32, 32]  # TorchRL's MultiSync too
    monkeypatch.setenv("RL_WARNINGS", "False")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GrpcCollector(cartpole, frames_per_batch=32, total_frames=100, sync=sync).shutdown()
        GrpcCollector(cartpole, frames_per_batch=32, total_frames=96, sync=sync).shutdown()


def test_a_policy_device_the_actors_do_not_run_on_is_refused(cartpole: list[str]) -> None:
    """policy_device / cudagraph_policy on CPU actors: refused at construction, naming each
    actor and both devices; never a silent fall back to the CPU."""
    with pytest.raises(ValueError, match=r"policy_device='cuda:1'.*worker_id 0 runs it on cpu"):
        GrpcCollector(cartpole, frames_per_batch=16, policy_device=torch.device("cuda", 1))
    with pytest.raises(ValueError, match=r"cudagraph_policy is not supported.*reduce-overhead"):
        GrpcCollector(cartpole, frames_per_batch=16, cudagraph_policy=True)
    with GrpcCollector(
        cartpole, frames_per_batch=16, policy_device="cpu", env_device="cpu", sync=True
    ) as collector:
        assert collector.next().batch_size == (2, 2, 4)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("env_device", "cuda:0", ["actor 1", "env", "cpu", "'cuda:0'"]),
        ("policy_device", "meta", ["actor 1", "policy", "cpu", "'meta'"]),
        ("cudagraph_policy", True, ["actor 1", "CUDA graphs"]),
    ],
)
def test_actor_refuses_a_session_placed_elsewhere_with_failed_precondition(
    cartpole: list[str], field: str, value: object, words: list[str]
) -> None:
    """The actor itself refuses, whatever the learner checked: FAILED_PRECONDITION naming it."""
    settings = pb.CollectSettings(frames_per_batch=8, reset_when_done=True, **{field: value})
    request = pb.CollectRequest(open=pb.OpenSession(settings=settings, credits=1, learner_id="t"))
    with grpc.insecure_channel(cartpole[1]) as channel:
        call = pb_grpc.ActorServiceStub(channel).Collect(iter([request]), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    for word in words:
        assert word in info.value.details()


def test_compile_policy_compiles_the_actors_policy_for_the_session(cartpole: list[str]) -> None:
    """``compile_policy`` travels as plain options; the actors act through torch.compile."""
    policy = cartpole_policy()
    with GrpcCollector(
        cartpole,
        frames_per_batch=16,
        sync=True,
        policy=policy,
        compile_policy={"backend": "eager", "fullgraph": False},
    ) as collector:
        batch = collector.next()
        with torch.no_grad():
            expected = policy(batch["observation"])[0]  # (logits, action, log_prob)
        torch.testing.assert_close(batch["logits"], expected)
    forward = CompiledForward(torch.nn.Linear(3, 2))
    forward.use(CompileSettings(backend="eager"))
    assert forward.compiled
    x = torch.ones(4, 3)
    torch.testing.assert_close(forward(x), forward.eager(x))
    forward.use(None)
    assert not forward.compiled


def test_a_script_that_never_pushes_trains_the_actors(cartpole: list[str]) -> None:
    """TorchRL's shared policy: with ``policy=``, every optimiser step reaches the actors
    before the next batch, though the script never calls update_policy_weights_."""
    policy = cartpole_policy()
    optim = torch.optim.SGD(policy.parameters(), lr=0.05)
    with GrpcCollector(
        cartpole, frames_per_batch=16, total_frames=16 * 4, sync=True, policy=policy
    ) as collector:
        assert collector.policy is policy
        versions = []
        for batch in collector:
            with torch.no_grad():  # the batch was acted by exactly the learner's module
                torch.testing.assert_close(
                    batch["logits"], policy(batch["observation"])[0], rtol=1e-4, atol=1e-4
                )  # the actor batches 2 observations, the learner 16: float sums differ
            versions.append(int(batch["next", "policy_version"].max()))
            optim.zero_grad()
            policy(batch["observation"])[0].sum().backward()
            optim.step()
        assert versions == list(range(versions[0], versions[0] + 4))  # one push per step
        assert collector.stats()["push_bytes"] > 0
    with GrpcCollector(
        cartpole, frames_per_batch=16, sync=True, policy=policy, push_policy_changes=False
    ) as collector:
        first = int(collector.next()["next", "policy_version"].max())
        with torch.no_grad():
            for param in policy.parameters():
                param.add_(1.0)
        assert int(collector.next()["next", "policy_version"].max()) == first  # not followed
        assert collector.update_policy_weights_() == {0: first + 1, 1: first + 1}


def test_a_script_counting_in_numpy_collects_pushes_and_seeds(cartpole: list[str]) -> None:
    """Counts a script computed with numpy (or read as ``1e2``) work as in TorchRL: batches,
    pushes addressed by numpy worker ids and versions, seeds."""
    policy = cartpole_policy()
    with GrpcCollector(
        cartpole, frames_per_batch=np.int64(16), total_frames=64.0, sync=True, policy=policy
    ) as collector:
        assert collector.set_seed(np.uint32(7)) == collector.set_seed(7)
        frames = [batch.numel() for batch in collector]
        assert frames == [16] * 4
        ids = np.arange(2)
        pushed = collector.update_policy_weights_(policy, worker_ids=ids, version=np.int64(900))
        assert pushed == {0: 900, 1: 900}
        assert all(type(k) is int for k in pushed)


@pytest.fixture(scope="module")
def egreedy() -> Iterator[list[str]]:
    base = ["--kind", "torchrl", "--env-factory", "rlfleet_test_torchrl:cartpole"]
    policy = ["--policy", "rlfleet_test_torchrl:egreedy_policy", "--policy-kwargs", '{"eps": 1.0}']
    args = [[*base, *policy, "--worker-id", str(w), "--num-envs", "2"] for w in range(2)]
    actors = start_actors(args, env=ACTOR_ENV)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


@pytest.mark.filterwarnings("ignore:the fleet steps:UserWarning")  # 4 envs for 1
def test_an_annealed_epsilon_reaches_torchrl_actors(egreedy: list[str]) -> None:
    """DQN's ``EGreedyModule.step()`` anneals a buffer (through ``.data``); the next batch of
    every actor acts with the annealed epsilon, and create_env_fn's env matches the fleet."""
    policy = rlfleet_test_torchrl.egreedy_policy(rlfleet_test_torchrl.cartpole(), eps=1.0)
    with GrpcCollector(
        egreedy,
        create_env_fn=rlfleet_test_torchrl.cartpole,
        policy=policy,
        frames_per_batch=64,
        sync=True,
    ) as collector:
        batch = collector.next()
        greedy = batch["action"].argmax(-1) == batch["action_value"].argmax(-1)
        assert greedy.float().mean() < 0.9  # eps = 1: random actions
        policy[1].step(10)  # eps: 1.0 -> 0.0
        assert float(policy[1].eps) == 0.0
        batch = collector.next()
        assert (batch["action"].argmax(-1) == batch["action_value"].argmax(-1)).all()
    with (
        pytest.raises(  # the message names the keys the batches hold and the fix
            ValueError, match=r"env has 'pixels', .* hold 'action', .*'observation'.*kind=.torchrl"
        ),
        GrpcCollector(
            egreedy,
            create_env_fn=lambda: GymEnv("CartPole-v1", from_pixels=False).append_transform(
                _pixels_transform()
            ),
            frames_per_batch=64,
            sync=True,
        ) as collector,
    ):
        collector.next()


@pytest.mark.parametrize(
    ("flags", "env_id", "observation"),
    [
        (["--env-factory", "rlfleet_test_envs:scalar_env"], "RlfleetScalar-v0", ((1,), "float32")),
        (["--env", "FrozenLake-v1"], "FrozenLake-v1", ((16,), "int64")),  # one-hot
    ],
    ids=["scalar-box", "discrete"],
)
def test_a_gymnasium_create_env_fn_matches_the_fleets_batches_as_torchrl_lays_them_out(
    flags: list[str], env_id: str, observation: tuple[tuple[int, ...], str]
) -> None:
    """A Box of shape () (observation and action) is [..., 1] in the fleet's batches, a
    Discrete observation one-hot, as in TorchRL's; the same gymnasium env as create_env_fn
    matches the fleet (the scalar was refused as 'another env', then the Discrete)."""
    import gymnasium
    import rlfleet_test_envs  # noqa: F401 - registers RlfleetScalar-v0

    (actor,) = start_actors([[*flags, "--policy", "mlp", "--num-envs", "2"]], env=ACTOR_ENV)
    try:
        with GrpcCollector(
            [actor.address],
            create_env_fn=lambda: gymnasium.make(env_id),
            frames_per_batch=16,
            total_frames=32,
            sync=True,
        ) as collector:
            batch = collector.next()
    finally:
        actor.close()
    shape, dtype = observation
    for key in ("observation", ("next", "observation")):
        assert (batch[key].shape, batch[key].dtype) == ((1, 2, 8, *shape), getattr(torch, dtype))
    theirs = Collector(GymEnv(env_id), None, frames_per_batch=8, total_frames=8)
    try:
        assert next(iter(theirs))["observation"].shape == (8, *shape)
    finally:
        theirs.shutdown()
    if env_id == "RlfleetScalar-v0":
        assert batch["action"].shape == (1, 2, 8, 1)  # the mlp's Box action, as TorchRL's spec


def _pixels_transform() -> Any:
    from torchrl.envs import UnsqueezeTransform

    return UnsqueezeTransform(dim=-1, in_keys=["observation"], out_keys=["pixels"])


@pytest.fixture(scope="module")
def batch_norm() -> Iterator[list[str]]:
    factories = ["--env-factory", "rlfleet_test_torchrl:pendulum"]
    policy = ["--policy", "rlfleet_test_torchrl:batch_norm_policy"]
    args = [["--kind", "torchrl", *factories, *policy, "--num-envs", "2"]]
    actors = start_actors(args, env=ACTOR_ENV)
    yield [a.address for a in actors]
    for actor in actors:
        actor.close()


def test_running_statistics_a_loss_updates_in_place_reach_the_actors(
    batch_norm: list[str],
) -> None:
    """CrossQ's pattern: the collector's policy is a batch-norm actor in eval mode, and the
    loss runs a train-mode copy sharing its tensors (``TensorDict.to_module``), whose forward
    updates the running statistics in place. No parameter changes, no explicit push: the next
    batch is acted with the updated statistics, exactly as the learner's module acts."""
    policy = rlfleet_test_torchrl.batch_norm_policy(rlfleet_test_torchrl.pendulum())
    in_loss = copy.deepcopy(policy).train()
    TensorDict.from_module(policy).to_module(in_loss)  # shares parameters and buffers
    norm = policy.module[1]
    with GrpcCollector(batch_norm, frames_per_batch=16, sync=True, policy=policy) as collector:
        collector.next()
        before = norm.running_mean.clone()
        for _ in range(3):
            in_loss(TensorDict(observation=torch.randn(64, 3) * 4 + 2, batch_size=[64]))
        assert not torch.equal(norm.running_mean, before)  # moved through the loss's copy
        batch = collector.next().reshape(-1)
        with torch.no_grad():
            expected = policy(batch.select("observation").clone())["action"]
        torch.testing.assert_close(batch["action"], expected)
        assert collector.stats()["auto_pushes"] >= 1
