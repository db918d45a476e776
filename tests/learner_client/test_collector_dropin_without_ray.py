"""RayCollector's drop-in form where Ray is not installed: a clear ImportError naming the extra."""

from __future__ import annotations

import importlib.util

import pytest

from learner_client import GrpcCollector

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is not None, reason="Ray is installed here"
)


def test_the_drop_in_form_without_ray_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r"rlfleet\[ray\]"):
        GrpcCollector(create_env_fn=[lambda: None], num_collectors=1, frames_per_batch=16)


def test_no_actors_and_no_create_env_fn_says_what_is_needed() -> None:
    with pytest.raises(TypeError, match="needs the actors"):
        GrpcCollector(frames_per_batch=16)
