"""RayFleet's arguments are checked when it is built, before Ray is imported or started.

A ``remote_configs`` or ``ray_init_config`` of the wrong type used to surface as Python's own
``dict()`` errors (``dictionary update sequence element #0 has length 1``), naming neither.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict.nn import TensorDictModule

from learner_client import GrpcCollector, RayFleet
from learner_client._ray_dropin import RayPlacement, ray_fleet_of


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"remote_configs": "abc"}, r"remote_configs must be a dict .* got str"),
        ({"remote_configs": 5}, r"remote_configs must be a dict .* got int"),
        ({"remote_configs": [1, 2]}, r"remote_configs .* holds a int: 1"),
        ({"remote_configs": ["ab", "cd"]}, r"remote_configs .* holds a str: 'ab'"),
        ({"ray_init_config": "auto"}, r"ray_init_config must be a dict .*'address': 'auto'"),
        ({"host": 5}, r"host must be a non-empty str or None, got 5"),
        ({"python": ""}, r"python must be a non-empty str or None"),
    ],
)
def test_ray_arguments_of_the_wrong_type_are_refused_naming_them(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        RayFleet(2, **kwargs)


def test_ray_arguments_of_the_right_type_build_a_fleet_without_ray() -> None:
    configs = [{"num_cpus": 1}, {"num_cpus": 0.5, "max_restarts": 2}]
    fleet = RayFleet(2, remote_configs=configs, ray_init_config={"address": "auto"}, host="::")
    assert fleet.remote_configs == configs
    assert not fleet.started


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"remote_configs": "abc"}, r"remote_configs must be a dict .* holds a str: 'abc'"),
        ({"remote_configs": [1, 2]}, r"remote_configs .* holds a int: 1"),
        ({"collector_kwargs": 5}, r"collector_kwargs must be a dict .* holds a int: 5"),
        ({"ray_init_config": "auto"}, r"ray_init_config must be a dict"),
    ],
)
def test_raycollectors_form_checks_its_ray_arguments_before_it_needs_ray(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        GrpcCollector(create_env_fn=[lambda: None] * 2, frames_per_batch=16, **kwargs)


def _env_fn() -> None:
    """A stand-in for a script's env factory (never called: no fleet here starts)."""


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_actors": 0}, ValueError, r"num_actors must be an int >= 1, got 0"),
        (
            {"create_env_fn": [_env_fn] * 3},
            ValueError,
            r"create_env_fn must be one callable or 2 \(one per actor\), got 3",
        ),
        ({"create_env_fn": [_env_fn, 5]}, TypeError, r"create_env_fn must hold callables"),
        (
            {"create_env_fn": _env_fn, "policy_factory": _env_fn, "policy": "mod:fn"},
            TypeError,
            r"policy_factory cannot be used with policy argument",
        ),
        ({"policy_factory": _env_fn}, TypeError, r"policy_factory builds the policy .* goes with"),
        ({"create_env_fn": _env_fn, "kind": "llm"}, ValueError, r"cannot serve kind 'llm'"),
        ({"policy": object()}, TypeError, r"policy is a object: a module object is shipped"),
        ({"remote_configs": [{}] * 3}, ValueError, r"remote_configs must be one dict or 2 .*got 3"),
        ({"host": ""}, TypeError, r"host must be a non-empty str or None, got ''"),
    ],
)
def test_ray_fleet_arguments_that_cannot_place_the_actors_are_refused_without_ray(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments = {"num_actors": 2, **kwargs}
    with pytest.raises(error, match=message):
        RayFleet(**arguments)


def test_ray_fleet_refuses_kwargs_its_actors_command_line_cannot_hold() -> None:
    big = {"stats": "x" * 200_000}  # over Linux's 128 KiB per argument
    with pytest.raises(ValueError, match=r"env_kwargs is 200,013 bytes on the actor.s command"):
        RayFleet(1, env_kwargs=big)
    # Actors of the script's callables parse their flags in the Ray actor: no command line.
    RayFleet(1, create_env_fn=_env_fn, env_kwargs=big)


def test_ray_fleet_defaults_each_actor_to_one_cpu_and_the_kinds_policy() -> None:
    fleet = RayFleet(2)
    assert fleet.remote_configs == [{"num_cpus": 1}, {"num_cpus": 1}]
    fleet.remote_configs[0]["num_cpus"] = 4
    assert fleet.remote_configs[1] == {"num_cpus": 1}
    assert RayFleet(1).remote_configs == [{"num_cpus": 1}]
    assert RayFleet(1, policy="")._common_args == fleet._common_args  # "": the kind's default


def test_ray_fleet_takes_the_learners_token_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLFLEET_TOKEN", "inherited-token")
    assert RayFleet(1).token == "inherited-token"
    assert RayFleet(1, token="given-token").token == "given-token"
    monkeypatch.setenv("RLFLEET_TOKEN", "")  # unset by an empty export: no token
    assert RayFleet(1).token is None


def _placement(**kwargs: Any) -> RayPlacement:
    """RayCollector's placing arguments at their defaults, but for ``kwargs``."""
    arguments: dict[str, Any] = {
        "create_env_fn": _env_fn,
        "create_env_kwargs": None,
        "policy": None,
        "policy_factory": None,
        "num_collectors": None,
        "collector_class": None,
        "collector_kwargs": None,
        "num_workers_per_collector": 1,
        "ray_init_config": None,
        "remote_configs": None,
    }
    return RayPlacement(**(arguments | kwargs))


@pytest.mark.ray
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"create_env_fn": [_env_fn] * 2, "num_collectors": 3}, ValueError, r"num_collectors is 3"),
        (
            {"create_env_fn": [_env_fn] * 2, "remote_configs": [{}] * 3},
            ValueError,
            r"lists of different lengths",
        ),
        ({"num_collectors": -1}, ValueError, r"num_collectors must be an int >= 0, got -1"),
        ({"create_env_fn": []}, ValueError, r"create_env_fn, .* are empty lists"),
        ({"num_collectors": "2"}, TypeError, r"num_collectors must be an int, got '2'"),
        ({"num_collectors": 2.5}, TypeError, r"num_collectors must be an int, got 2.5"),
        (
            {"num_workers_per_collector": 0},
            ValueError,
            r"num_workers_per_collector must be an int >= 1, got 0",
        ),
        ({"policy": torch.nn.Linear(3, 1)}, TypeError, r"policy is a Linear: .*TensorDictModule"),
        ({"collector_class": "parallel"}, TypeError, r"collector_class 'parallel' is none of"),
        ({"collector_class": dict}, TypeError, r"collector_class must be a TorchRL collector"),
    ],
)
def test_raycollectors_form_refuses_arguments_that_place_no_actors_before_ray_starts(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        GrpcCollector(frames_per_batch=16, **(_placement(**kwargs).__dict__))


@pytest.mark.ray
def test_raycollectors_form_places_one_actor_per_collector_with_torchrls_defaults() -> None:
    fleet = ray_fleet_of(_placement())
    assert fleet.num_actors == 1
    config = {"num_cpus": 1, "memory": 2 * 1024**3}
    if torch.cuda.is_available():
        config["num_gpus"] = 0.2
    assert fleet.remote_configs == [config]
    assert fleet._extra_args == ["--env-backend", "sync"]  # TorchRL's Collector: in-process
    assert ray_fleet_of(_placement(create_env_fn=[_env_fn] * 3)).num_actors == 3


@pytest.mark.ray
def test_raycollectors_form_passes_its_placing_arguments_to_the_fleet() -> None:
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    fleet = ray_fleet_of(
        _placement(
            num_collectors=2,
            num_workers_per_collector=3,
            create_env_kwargs={"g": 9.0},
            policy=policy,
            ray_init_config={"address": "auto"},
            remote_configs=[{"num_cpus": 0.5}, {"num_cpus": 0.25}],
        )
    )
    assert fleet.num_actors == 2
    assert fleet.remote_configs == [{"num_cpus": 0.5}, {"num_cpus": 0.25}]
    args = fleet._common_args
    assert args[args.index("--num-envs") + 1] == "3"
    assert '"g": 9.0' in args[args.index("--env-kwargs") + 1]
    assert fleet._policy_module is policy
    assert fleet._ray_init_config == {"address": "auto"}
    factories = [_env_fn, _env_fn]
    placement = _placement(create_env_fn=[_env_fn] * 2, policy_factory=factories)
    assert ray_fleet_of(placement)._factories == factories


@pytest.mark.ray
@pytest.mark.parametrize(
    ("collector_class", "backend"),
    [
        (None, "sync"),
        ("single", "sync"),
        ("sync", "async"),
        ("async", "async"),
        ("Collector", "sync"),
        ("MultiSyncCollector", "async"),
        ("MultiAsyncCollector", "async"),
    ],
)
def test_raycollectors_form_steps_envs_in_subprocesses_for_multi_collectors_only(
    collector_class: str | None, backend: str
) -> None:
    if collector_class is not None and collector_class[0].isupper():
        collectors = pytest.importorskip("torchrl.collectors")
        collector_class = type("Mine", (getattr(collectors, collector_class),), {})
    fleet = ray_fleet_of(_placement(collector_class=collector_class))
    assert fleet._extra_args == ["--env-backend", backend]


@pytest.mark.ray
def test_raycollectors_form_warns_only_for_collector_kwargs_it_does_not_overwrite() -> None:
    kwargs = {"device": "cpu", "frames_per_batch": 8, "split_trajs": True, "num_threads": 2}
    with pytest.warns(UserWarning, match=r"collector_kwargs\['num_threads'\]") as caught:
        ray_fleet_of(_placement(collector_kwargs=kwargs))
    assert len(caught) == 1


@pytest.mark.ray
@pytest.mark.parametrize("key", ["trust_policy", "no_cuda_sync"])
def test_raycollectors_form_warns_for_collector_kwargs_raycollector_keeps(key: str) -> None:
    """RayCollector sets these only when ``collector_kwargs`` lacks them: a value given there
    acts on its collectors. It used to be taken here as overwritten, silently."""
    with pytest.warns(UserWarning, match=rf"collector_kwargs\['{key}'\] has no effect"):
        ray_fleet_of(_placement(collector_kwargs={key: True}))


def test_no_actors_and_no_create_env_fn_says_what_is_needed_with_or_without_ray() -> None:
    with pytest.raises(TypeError, match=r"needs the actors .*or RayCollector's create_env_fn"):
        GrpcCollector(frames_per_batch=16, num_collectors=2)


@pytest.mark.ray
def test_raycollectors_form_takes_a_policy_without_weights_as_any_fleet_does() -> None:
    """TorchRL's RayCollector tests act with ``RandomPolicy(spec)``: it used to be refused
    here ("wrap it: TensorDictModule"), while a collector of any other fleet takes it with a
    warning and its actors act randomly; so do the actors placed on Ray now."""
    from torchrl.data import Bounded
    from torchrl.envs.utils import RandomPolicy

    for policy in (RandomPolicy(Bounded(-2.0, 2.0, shape=(1,))), lambda td: td):
        fleet = ray_fleet_of(_placement(policy=policy))
        assert fleet._policy_module is None  # the actors' own policy: a random one
        assert fleet._common_args[fleet._common_args.index("--policy") + 1] == "random"
    with pytest.raises(TypeError, match=r"policy is a Linear: .*TensorDictModule"):
        ray_fleet_of(_placement(policy=torch.nn.Linear(3, 1)))  # weights it cannot ship


@pytest.mark.ray
def test_raycollectors_form_reads_num_collectors_0_as_the_lists_length() -> None:
    """RayCollector reads ``num_collectors=0`` as not given (``if num_collectors:``): as many
    collectors as the lists. It used to be refused here (``must be an int >= 1``)."""
    assert ray_fleet_of(_placement(create_env_fn=[_env_fn] * 3, num_collectors=0)).num_actors == 3
    assert ray_fleet_of(_placement(num_collectors=0)).num_actors == 1  # as with None


class _UnstartedFleet:
    """A fleet of the collector's slot (``ActorFleet``) that records being started."""

    num_actors = 2
    started = False

    def __init__(self) -> None:
        self.worker_ids = [0, 1]
        self.starts = 0
        self.closes = 0

    @property
    def addresses(self) -> list[str]:
        raise AssertionError("a fleet not started has no addresses")

    def start(self) -> None:
        self.starts += 1
        raise RuntimeError("placing the actors (Ray's take ~18 s on 2 cores)")

    def close(self) -> None:
        self.closes += 1


def test_collector_raises_if_sync_frames_do_not_split_before_starting_its_fleet() -> None:
    """RayCollector refuses a sync ``frames_per_batch`` its collectors cannot share before it
    places them; the drop-in form (its ``RayFleet``), as any fleet not started, used to be
    started first (every Ray actor placed), then refused."""
    fleet = _UnstartedFleet()
    with pytest.raises(ValueError, match=r"frames_per_batch=41 evenly over 2 actors"):
        GrpcCollector(fleet, frames_per_batch=41, sync=True)
    assert (fleet.starts, fleet.closes) == (0, 1)
