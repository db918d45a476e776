"""Policies and helpers for the push-form tests: a user module with a shared Linear and an
integer buffer (also compiled), one with a broadcast buffer, in-process actors, and reading an
actor's weights back through GetState."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from torch import nn

from actor_service import ActorConfig, create_server
from actor_service._core._state import decode_state


class SharedLinearPolicy(nn.Module):
    """Observation -> action index through one Linear applied twice, a BatchNorm and a head."""

    def __init__(self, obs_dim: int, n: int) -> None:
        super().__init__()
        self.shared = nn.Linear(obs_dim, obs_dim)
        self.blocks = nn.ModuleList([self.shared, self.shared])
        self.norm = nn.BatchNorm1d(obs_dim)
        self.head = nn.Linear(obs_dim, n)

    def logits(self, observation: torch.Tensor) -> torch.Tensor:
        x = observation
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(self.norm(x))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.logits(observation).argmax(-1)


def shared_linear_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """The actor-side factory (``push_policies:shared_linear_policy``)."""
    return SharedLinearPolicy(int(np.prod(observation_space.shape)), int(action_space.n)).eval()


def compiled_shared_linear_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """The factory of a script that ``torch.compile``s its policy (keys ``_orig_mod.*``)."""
    policy = shared_linear_policy(observation_space, action_space)
    return torch.compile(policy, backend="eager")


class BroadcastScalePolicy(nn.Module):
    """Observation -> action index through a head whose scores a broadcast buffer scales."""

    def __init__(self, obs_dim: int, n: int, scale: float = 1.0) -> None:
        super().__init__()
        self.head = nn.Linear(obs_dim, n)
        self.register_buffer("scale", torch.tensor([scale]).expand(n))  # stride 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (self.head(observation) * self.scale).argmax(-1)


def broadcast_scale_policy(observation_space: Any, action_space: Any) -> nn.Module:
    """The actor-side factory (``push_policies:broadcast_scale_policy``)."""
    return BroadcastScalePolicy(int(np.prod(observation_space.shape)), int(action_space.n))


@contextlib.contextmanager
def in_process_actor(**overrides: Any) -> Iterator[Any]:
    """A real actor server on a loopback port, in this process (its ``.server`` is inspectable)."""
    base: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "num_envs": 2, "seed": 0}
    handle = create_server(ActorConfig(**(base | overrides))).run_in_thread()
    try:
        yield handle
    finally:
        handle.stop(grace=1.0)


def serving(port: int) -> bool:
    """Whether the actor's health service answers SERVING."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def actor_weights(collector: Any, worker_id: int = 0) -> tuple[int, dict[str, torch.Tensor]]:
    """``(version, weights)`` of the ``policy`` model, as the actor reports them (GetState)."""
    blob = collector.state_dict()["workers"][worker_id]
    state = decode_state(bytes(blob.numpy()))
    model = state["models"]["policy"]
    return model["version"], model["weights"]


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Same keys, dtypes, shapes and bytes."""
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert torch.equal(
            a[key].reshape(-1).view(torch.uint8), b[key].reshape(-1).view(torch.uint8)
        ), key
