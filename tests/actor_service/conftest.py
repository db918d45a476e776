"""Fixtures for the actor-server tests: in-process actors on port 0, stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from actor_harness import Actor, small_config

from actor_service import create_server
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc


@pytest.fixture
def make_actor() -> Iterator[Callable[..., Actor]]:
    """Factory of in-process actors (stopped at teardown)."""
    started: list[Actor] = []

    def make(**overrides: Any) -> Actor:
        handle = create_server(small_config(**overrides)).run_in_thread()
        channel = grpc.insecure_channel(f"127.0.0.1:{handle.port}")
        actor = Actor(handle, channel, pb_grpc.ActorServiceStub(channel))
        started.append(actor)
        return actor

    yield make
    for actor in started:
        actor.channel.close()
        actor.handle.stop(grace=1.0)


@pytest.fixture
def actor(make_actor: Callable[..., Actor]) -> Actor:
    """One in-process actor with the small config."""
    return make_actor()
