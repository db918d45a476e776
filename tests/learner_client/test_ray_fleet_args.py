"""RayFleet's arguments are checked when it is built, before Ray is imported or started.

A ``remote_configs`` or ``ray_init_config`` of the wrong type used to surface as Python's own
``dict()`` errors (``dictionary update sequence element #0 has length 1``), naming neither.
"""

from __future__ import annotations

from typing import Any

import pytest

from learner_client import GrpcCollector, RayFleet


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
