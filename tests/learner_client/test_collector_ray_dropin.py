"""RayCollector's drop-in form on a real local Ray cluster: GrpcCollector places its own actors.

TorchRL's own ``RayCollector`` example runs with ``GrpcCollector`` in its place; the script's
lambdas, closures and ``TensorDictModule`` reach the actors through Ray; sync and async
batches; what has no effect warns once; shutdown leaves no Ray actor and no server; an env
that raises on the actor is reported at construction with the actor's traceback. One Ray
head in this process for the module (2 CPUs, no dashboard, a temporary directory of its
own); `make test-ray` runs these in `.venv-ray`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import poll_until, start_local_ray, stop_local_ray
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from common.errors import ActorUnavailableError
from learner_client import GrpcCollector

pytestmark = pytest.mark.ray

#: Light actors for this 2-CPU cluster (RayCollector's default asks 1 CPU and 2 GiB each).
SMALL = {"num_cpus": 0.5, "memory": 64 * 1024 * 1024}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray head for this module: 2 CPUs, no dashboard."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("torchrl")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live there
    start_local_ray(
        lambda: ray.init(
            num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False
        ),
        temp_dir,
    )
    yield ray
    stop_local_ray()
    shutil.rmtree(temp_dir, ignore_errors=True)


def _example() -> str:
    """TorchRL's RayCollector docstring example, as code, with GrpcCollector in its place.

    The only other change: the example iterates ``collector``, a name it never defines
    (TorchRL's typo: the same NameError with RayCollector), instead of the
    ``distributed_collector`` it builds.
    """
    from torchrl.collectors.distributed import RayCollector

    doc = inspect.getdoc(RayCollector) or ""
    lines = doc.split("Examples:", 1)[1].splitlines()
    code = "\n".join(
        line.strip()[4:] for line in lines if line.strip().startswith((">>> ", "... "))
    )
    swapped = code.replace(
        "from torchrl.collectors.distributed import RayCollector",
        "from learner_client import GrpcCollector",
    ).replace("RayCollector(", "GrpcCollector(")
    assert swapped.count("GrpcCollector") == 2  # the import and the collector line
    assert "enumerate(collector)" in swapped
    assert "collector =" not in swapped.replace("distributed_collector =", "")
    return swapped.replace("enumerate(collector)", "enumerate(distributed_collector)")


def _gone(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, int(port))) != 0


def _handles(collector: GrpcCollector) -> list[Any]:
    """The Ray actors of the fleet the collector placed (white-box: its owned fleet)."""
    fleet: Any = collector._owner.fleet
    return list(fleet.actor_handles.values())


def _assert_stopped(ray: Any, handles: list[Any], addresses: list[str]) -> None:
    """Every Ray actor is dead for good and no server answers at its address."""
    for handle in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(handle.is_alive.remote(), timeout=30)
    poll_until(lambda: all(_gone(a) for a in addresses), timeout=30, message="a server lives on")


def test_ray_dropin_runs_torchrl_raycollector_example(ray_cluster: Any) -> None:
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_example(), "raycollector_example", "exec"), namespace)
    collector = namespace["distributed_collector"]
    try:
        data = namespace["data"]
        assert namespace["i"] == 2
        assert data.batch_size == (200,)  # one collector, one env: frames_per_batch frames
        assert data.numel() == 200
        for key in ("observation", "action", ("next", "observation"), ("next", "reward")):
            assert key in data.keys(include_nested=True)
        assert data["action"].shape == (200, 1)
        assert "TensorDict(" in printed.getvalue()
        node_ip = ray_cluster.util.get_node_ip_address()
        addresses = [actor.address for actor in collector.remote_collectors]
        assert len(addresses) == 1
        assert addresses[0].startswith(f"{node_ip}:")
        handles = _handles(collector)
    finally:
        collector.shutdown()
    _assert_stopped(ray_cluster, handles, addresses)
    assert ray_cluster.is_initialized()  # a Ray it did not start keeps running


def _policy_factory(scale: float) -> Any:
    """A user's TensorDictModule, built by a factory of the script (a closure inside)."""
    from tensordict.nn import TensorDictModule
    from torch import nn

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, observation: Any) -> Any:
            return self.linear(observation).tanh() * scale

    return TensorDictModule(Scaled(), in_keys=["observation"], out_keys=["action"])


def test_ray_dropin_ships_closures_and_a_user_module_sync_and_async(ray_cluster: Any) -> None:
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    def make_env(max_steps: int) -> Any:
        return lambda: TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=max_steps))

    policy = _policy_factory(0.5)
    common = {
        "create_env_fn": [make_env(7), make_env(9)],
        "policy": policy,
        "remote_configs": SMALL,
        "frames_per_batch": 40,
        "total_frames": 80,
    }
    with GrpcCollector(sync=True, **common) as collector:
        batches = list(collector)
    assert [tuple(b.batch_size) for b in batches] == [(2, 20), (2, 20)]  # RayCollector's stack
    steps = batches[-1]["next", "step_count"].max(dim=1).values.flatten().tolist()
    assert steps == [7, 9]  # each actor stepped its own closure's env
    assert batches[0]["action"].abs().max() <= 0.5  # the user's module acted
    with GrpcCollector(sync=False, **common) as collector:
        batches = list(collector)
    assert [tuple(b.batch_size) for b in batches] == [(40,), (40,)]


def test_ray_dropin_builds_each_actors_policy_with_torchrls_policy_factory(
    ray_cluster: Any,
) -> None:
    """``policy_factory`` used to warn "no effect" here while the actors acted randomly."""
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.envs import GymEnv

    def constant() -> Any:  # TorchRL's policy_factory: called with no argument, per worker
        linear = nn.Linear(3, 1)
        nn.init.zeros_(linear.weight)
        nn.init.constant_(linear.bias, 0.25)
        return TensorDictModule(linear, in_keys=["observation"], out_keys=["action"])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing warns: the argument acts
        collector = GrpcCollector(
            create_env_fn=[lambda: GymEnv("Pendulum-v1")],
            policy_factory=constant,
            remote_configs=SMALL,
            frames_per_batch=20,
            total_frames=40,
        )
    with collector:
        actions = [batch["action"] for batch in collector]
    assert {round(float(a), 4) for batch in actions for a in batch.flatten()} == {0.25}
    with pytest.raises(TypeError, match="policy_factory cannot be used with policy"):
        GrpcCollector(
            create_env_fn=[lambda: GymEnv("Pendulum-v1")],
            policy=constant(),
            policy_factory=constant,
            frames_per_batch=20,
        )


def test_ray_dropin_reads_back_the_placing_arguments_that_act_there(ray_cluster: Any) -> None:
    """``policy_factory``, ``collector_class`` and ``collector_kwargs`` (RayCollector's
    attributes) used to raise ``AttributeError`` "(no effect)" in the form where they act."""
    from torchrl.envs import GymEnv

    def factory() -> Any:  # shipped by value: everything it needs defined in it
        from tensordict.nn import TensorDictModule
        from torch import nn

        return TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])

    kwargs = {"device": "cpu"}
    with GrpcCollector(
        create_env_fn=lambda: GymEnv("Pendulum-v1"),
        policy_factory=factory,
        collector_class="single",
        collector_kwargs=kwargs,
        remote_configs=SMALL,
        frames_per_batch=20,
    ) as collector:
        assert collector.policy_factory is factory
        assert collector.collector_class == "single"
        assert collector.collector_kwargs is kwargs


@pytest.mark.long
def test_ray_dropin_frees_its_ray_actors_when_iteration_reaches_total_frames(
    ray_cluster: Any,
) -> None:
    """RayCollector shuts down at ``total_frames`` (its Ray actors killed): a script that
    builds its next collector without ``shutdown()`` used to wait on the first one's CPUs
    until the placement deadline (``Ray actors not placed and ready after 120.0s``)."""
    from torchrl.envs import GymEnv

    common = {
        "create_env_fn": [lambda: GymEnv("Pendulum-v1")] * 2,
        "remote_configs": {"num_cpus": 1, "memory": SMALL["memory"]},  # the cluster's 2 CPUs
        "frames_per_batch": 20,
        "total_frames": 40,
        "connect_timeout": 30.0,
    }
    first = GrpcCollector(**common)
    handles, addresses = _handles(first), list(first._owner.fleet.addresses)  # type: ignore[union-attr]
    assert len(list(first)) == 2
    assert first.closed  # as RayCollector's shutdown(shutdown_ray=False)
    _assert_stopped(ray_cluster, handles, addresses)
    second = GrpcCollector(**common)  # the same CPUs, free again
    assert [b.numel() for b in second] == [20, 20]
    assert second.closed
    first.shutdown()  # idempotent


def test_ray_dropin_envs_per_collector(ray_cluster: Any) -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    with GrpcCollector(
        create_env_fn=lambda: GymEnv("Pendulum-v1"),
        num_collectors=1,
        num_workers_per_collector=2,
        collector_class=Collector,
        remote_configs=SMALL,
        frames_per_batch=40,
        total_frames=40,
    ) as collector:
        (batch,) = list(collector)
    assert tuple(batch.batch_size) == (2, 20)  # one actor stepping two copies of the env


def test_ray_dropin_warns_once_per_argument_without_effect(ray_cluster: Any) -> None:
    from torchrl.envs import GymEnv

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        collector = GrpcCollector(
            create_env_fn=lambda: GymEnv("Pendulum-v1"),
            num_collectors=2,
            collector_kwargs={"device": "cpu", "num_threads": 2},
            use_env_creator=True,
            remote_configs=SMALL,
            frames_per_batch=20,
            total_frames=20,
        )
    collector.shutdown()
    messages = [str(w.message) for w in caught]
    assert sum("collector_kwargs['num_threads']" in m for m in messages) == 1  # not per actor
    assert sum("use_env_creator" in m for m in messages) == 1
    for placing in ("num_collectors", "remote_configs", "collector_kwargs['device']"):
        assert not any(placing in m for m in messages), messages


def test_ray_dropin_reports_an_env_that_raises_on_the_actor(ray_cluster: Any) -> None:
    from torchrl.envs import GymEnv

    learner = os.getpid()

    def env_on_the_learner_only() -> Any:  # the learner builds it once, for its checks
        if os.getpid() != learner:
            raise RuntimeError("no such simulator on this node")
        return GymEnv("Pendulum-v1")

    with pytest.raises(ActorUnavailableError) as raised:
        GrpcCollector(
            create_env_fn=[env_on_the_learner_only],
            remote_configs=SMALL,
            frames_per_batch=20,
        )
    text = str(raised.value)
    assert "failed to start" in text
    assert "RuntimeError: no such simulator on this node" in text
    assert "the actor's traceback" in text
    assert "env_on_the_learner_only" in text  # the frame that raised, on the actor


# ------------------------------------------- TorchRL's own RayCollector tests, ported
# (pytorch/rl test/test_distributed.py, TestRayCollector). Its envs come from TorchRL's test
# suite (mocking_classes), which is not installed: Pendulum stands in for them.


@pytest.mark.long
@pytest.mark.parametrize("sync", [False, True])
def test_ray_dropin_collects_total_frames_acting_with_torchrls_random_policy(
    ray_cluster: Any, sync: bool
) -> None:
    """``test_distributed_collector_sync``: ``[env] * 2`` and ``RandomPolicy(spec)``, which
    used to be refused ("wrap it: TensorDictModule"); a weightless policy is taken as any
    fleet takes it, with a warning: the actors act randomly, as it would."""
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    spec = GymEnv("Pendulum-v1").action_spec
    with pytest.warns(UserWarning, match=r"RandomPolicy\(\.\.\.\) holds no weights"):
        collector = GrpcCollector(
            create_env_fn=[lambda: GymEnv("Pendulum-v1")] * 2,
            policy=RandomPolicy(spec),
            total_frames=200,
            frames_per_batch=50 if not sync else 40,  # sync: a share per actor, as TorchRL's
            sync=sync,
            remote_configs=SMALL,
        )
    with collector:
        batches = list(collector)
    assert sum(batch.numel() for batch in batches) == 200
    assert {batch.numel() for batch in batches} == {50 if not sync else 40}
    assert batches[-1].names[-1] == "time"
    actions = torch.cat([batch["action"].flatten() for batch in batches])
    assert actions.unique().numel() > 100  # random, within the spec's bounds
    assert actions.abs().max() <= 2.0


def _counting_policy() -> Any:
    """TorchRL's test policy: acts with its one weight, 1 at first (defined in here, so that
    Ray ships the class by value: the test module is not importable on the actors)."""

    class CountingPolicy(TensorDictModuleBase):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.tensor(1.0))
            self.in_keys: list[str] = []
            self.out_keys = ["action"]

        def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
            return tensordict.set("action", self.weight.expand(*tensordict.shape, 1).clone())

    return CountingPolicy()


@pytest.mark.long
@pytest.mark.parametrize("sync", [False, True])
def test_ray_dropin_update_policy_weights_reaches_every_remote_collector(
    ray_cluster: Any, sync: bool
) -> None:
    """``test_distributed_collector_updatepolicy``: a weight changed after the first batch is
    what the actors act with by the one before last. TorchRL's test changes it through
    ``.data``, which bumps no version counter: an argument-less push would find the module
    unchanged and send nothing (docs/weights.md, "A push that is not made"); the change is
    made in place under ``no_grad`` here, as an optimiser makes it."""
    from torchrl.envs import GymEnv

    policy = _counting_policy()
    with GrpcCollector(
        create_env_fn=[lambda: GymEnv("Pendulum-v1")] * 2,
        policy=policy,
        total_frames=300,
        frames_per_batch=50,
        sync=sync,
        remote_configs=SMALL,
        push_policy_changes=False,  # only the script's own call pushes, as in TorchRL
    ) as collector:
        batches = []
        for i, batch in enumerate(collector):
            batches.append(batch)
            if i == 0:
                with torch.no_grad():
                    policy.weight += 1
                collector.update_policy_weights_()
    assert [batch.numel() for batch in batches] == [50] * 6
    assert batches[0]["action"].eq(1).all()
    assert batches[-2]["action"].eq(2).all()


@pytest.mark.long
def test_ray_dropin_offers_or_refuses_every_public_instance_name_of_a_built_raycollector(
    ray_cluster: Any,
) -> None:
    """What a built ``RayCollector`` holds (``vars()``: ``num_collectors``, ``policy``,
    ``collected_frames``, ``collector_kwargs``, ``policy_weights``...) reads on the drop-in
    form built with the same arguments with RayCollector's value, or raises AttributeError
    naming how a fleet does it, as tests/learner_client/test_collector_torchrl_parity.py
    checks for TorchRL's other collectors."""
    from tensordict.nn import TensorDictModule
    from torchrl.collectors.distributed import RayCollector
    from torchrl.envs import GymEnv

    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    arguments = {
        "create_env_fn": [lambda: GymEnv("Pendulum-v1")] * 2,
        "policy": policy,
        "frames_per_batch": 40,
        "total_frames": 80,
        "sync": True,
        "remote_configs": SMALL,
    }
    theirs = RayCollector(**arguments)
    try:
        expected = {n: v for n, v in vars(theirs).items() if not n.startswith("_")}
    finally:
        theirs.shutdown()
    assert {"num_collectors", "collected_frames", "policy_weights"} <= set(expected)
    with GrpcCollector(**arguments) as collector:
        offered = [name for name in expected if hasattr(collector, name)]
        for name in set(expected) - set(offered):
            with pytest.raises(AttributeError, match=f"no '{name}', TorchRL's: "):
                getattr(collector, name)
        assert collector.policy is policy
        given = {"policy_factory", "collector_class", "collector_kwargs"}  # as given: they act
        assert {name: getattr(collector, name) for name in given} == dict.fromkeys(given)
        for name in set(offered) - {"policy"} - given:
            assert getattr(collector, name) == expected[name], name
    assert {"num_collectors", "total_frames", "split_trajs"} <= set(offered)
