"""Fixtures for the GrpcCollector tests (helpers are in ``learner_fleet.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import ActorProcess
from hostile_harness import real_description
from learner_fleet import FLEET_ARGS, start_actors

from common.rlfleet.v1 import actor_service_pb2 as pb


@pytest.fixture(scope="session")
def fleet() -> Iterator[list[ActorProcess]]:
    """Three actors (see ``learner_fleet.FLEET_ARGS``), shared by modules that only read them.

    Tests may push weights and reseed them; none may rely on absolute versions.
    """
    actors = start_actors(FLEET_ARGS)
    yield actors
    for actor in actors:
        actor.close()


@pytest.fixture(scope="module")
def description() -> pb.DescribeResponse:
    """A real CartPole actor's Describe, for the hostile actor tests (``hostile_harness.py``)."""
    return real_description()
