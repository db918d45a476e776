"""The public names of the actor_service package, and that importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import actor_service


def test_actor_service_exports_exactly_the_public_api() -> None:
    assert sorted(actor_service.__all__) == sorted(
        [
            "ActorConfig",
            "EnvPoolSettings",
            "LLMActorSettings",
            "ModelSpec",
            "ActorServer",
            "ServerThread",
            "create_server",
            "serve",
            "parse_config",
            "main",
        ]
    )
    for name in actor_service.__all__:
        assert getattr(actor_service, name) is not None, name


def test_actor_service_import_does_not_load_torch_or_grpc() -> None:
    code = (
        "import sys, actor_service; print(sorted(m for m in ('torch', 'grpc') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
