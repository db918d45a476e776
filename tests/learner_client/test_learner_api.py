"""The learner's public surface is exactly what training scripts import."""

from __future__ import annotations

import learner_client
from common.errors import ActorUnavailableError, RlfleetError


def test_learner_client_all_is_pinned():
    assert learner_client.__all__ == [
        "ActorDescription",
        "ActorFleet",
        "EndlessCollectorError",
        "GrpcCollector",
        "GrpcLLMCollector",
        "LocalFleet",
        "MissingWorkersError",
        "PartResult",
        "RayFleet",
        "RemoteActor",
        "SettingsRefusedError",
        "VersionConflictError",
        "WeightPushError",
        "WeightPushSettings",
        "check_metrics_port",
        "resolve_actors",
        "serve_metrics",
    ]
    for name in learner_client.__all__:
        assert getattr(learner_client, name).__module__.startswith("learner_client._")


def test_learner_errors_extend_the_common_tree():
    assert issubclass(learner_client.WeightPushError, RlfleetError)
    assert issubclass(learner_client.MissingWorkersError, ActorUnavailableError)
    endless = learner_client.EndlessCollectorError  # both what Python and TorchRL raise
    assert issubclass(endless, RlfleetError)
    assert issubclass(endless, TypeError)
    assert issubclass(endless, RuntimeError)
    err = learner_client.WeightPushError("x", succeeded={0: 3}, failed={1: ValueError("bad")})
    assert err.succeeded == {0: 3}
    assert list(err.failed) == [1]
