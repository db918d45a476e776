"""Fixtures for the GrpcCollector tests (helpers are in ``learner_fleet.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import ActorProcess
from learner_fleet import FLEET_ARGS, start_actors


@pytest.fixture(scope="session")
def fleet() -> Iterator[list[ActorProcess]]:
    """Three actors (see ``learner_fleet.FLEET_ARGS``), shared by modules that only read them.

    Tests may push weights and reseed them; none may rely on absolute versions.
    """
    actors = start_actors(FLEET_ARGS)
    yield actors
    for actor in actors:
        actor.close()
