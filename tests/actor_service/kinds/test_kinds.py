"""The collection cores on their shared base: one per actor kind, one error after close."""

from __future__ import annotations

import pytest

from actor_service import ActorConfig, ModelSpec
from actor_service._config import CHOICES
from actor_service._core._base import CoreBase
from actor_service._kinds.llm.settings import LLMActorSettings
from actor_service._kinds.registry import CORES, core_factory
from common.config import CollectSettings
from common.errors import ClosedError
from common.llm import LLMSettings

LLM = {
    "kind": "llm",
    "llm": LLMActorSettings(task="arith"),
    "models": (ModelSpec("policy", "rlfleet:tiny-qwen2", {"hidden": 32, "layers": 1}),),
}


def _core(kind: str) -> CoreBase:
    if kind == "llm":
        pytest.importorskip("transformers")
    config = ActorConfig(num_envs=2, seed=0, **(LLM if kind == "llm" else {}))
    core = core_factory(config)(config)  # what the server builds for this kind
    assert isinstance(core, CoreBase)
    return core


def _settings(kind: str) -> CollectSettings:
    return CollectSettings(frames_per_batch=2, llm=LLMSettings() if kind == "llm" else None)


def test_cores_every_actor_kind_has_its_core() -> None:
    assert set(CORES) == set(CHOICES["kind"])
    assert {kind: core.kind for kind, core in CORES.items()} == {k: k for k in CORES}


@pytest.mark.usefixtures("loopback_only")
@pytest.mark.parametrize("kind", ["env", "llm"])
def test_cores_raise_closed_error_after_close(kind: str) -> None:
    core = _core(kind)
    assert type(core) is CORES[kind]
    core.configure(_settings(kind))
    state = core.state_dict()
    core.close()
    core.close()  # idempotent
    for call in (
        core.collect_batch,
        lambda: core.set_seed(1),
        lambda: core.load_state_dict(state),
    ):
        with pytest.raises(ClosedError, match="closed"):
            call()


@pytest.mark.usefixtures("loopback_only")
@pytest.mark.parametrize(("kind", "backend"), [("env", "sync"), ("llm", "llm")])
def test_cores_describe_their_slots_in_neutral_words(kind: str, backend: str) -> None:
    with _core(kind) as core:
        description = core.describe()
        assert core.force_close() == 0  # nothing runs in a subprocess here
    assert (description.kind, description.num_slots, description.backend) == (kind, 2, backend)
