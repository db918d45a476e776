"""The relay inbox on its own: one open push per push id, a bounded number of waiting calls."""

from __future__ import annotations

import asyncio
import os

import pytest

from actor_service._serve import _relay
from common.errors import ActorBusyError, SessionStateError, UnknownModelError
from common.rlfleet.v1 import actor_service_pb2 as pb


def test_relay_calls_waiting_for_their_push_are_capped() -> None:
    """A peer cannot park unbounded RelayWeights calls: the one past MAX_WAITING is busy."""

    async def main() -> None:
        inbox = _relay.RelayInbox()
        waiting = [
            asyncio.ensure_future(inbox.take(pb.RelayOpen(push_id=os.urandom(16))))
            for _ in range(_relay.MAX_WAITING)
        ]
        await asyncio.sleep(0.05)
        with pytest.raises(ActorBusyError):
            await inbox.take(pb.RelayOpen(push_id=os.urandom(16)))
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(main())


def test_a_push_id_open_already_is_refused_and_the_first_push_keeps_it() -> None:
    """A second push under one id would take the first one's inbox, and its cleanup the rest."""

    async def main() -> None:
        inbox = _relay.RelayInbox()
        relay = pb.Relay(push_id=os.urandom(16), source_ticket=b"t" * 32)
        async with inbox.opened(relay) as first:
            with pytest.raises(SessionStateError, match="already open"):
                async with inbox.opened(pb.Relay(push_id=relay.push_id, source_ticket=b"u" * 32)):
                    pass
            # The first push's inbox is still open under its id, with its own ticket.
            taken = await inbox.take(pb.RelayOpen(push_id=relay.push_id, ticket=b"t" * 32))
            assert taken is first

    asyncio.run(main())


def test_a_relay_call_whose_push_closed_as_it_was_found_is_unknown() -> None:
    """A push that opens and closes while its relay's call waits leaves that call NOT_FOUND
    (UnknownModelError), never a KeyError the actor would answer as a bug (INTERNAL)."""

    async def main() -> None:
        inbox = _relay.RelayInbox()
        relay = pb.Relay(push_id=os.urandom(16), source_ticket=b"t" * 32)
        waiting = asyncio.ensure_future(
            inbox.take(pb.RelayOpen(push_id=relay.push_id, ticket=b"t" * 32))
        )
        await asyncio.sleep(0.05)
        async with inbox.opened(relay):
            await asyncio.sleep(0)  # the waiting call sees the push open, and is woken
        with pytest.raises(UnknownModelError):
            await asyncio.wait_for(waiting, 1.0)

    asyncio.run(main())
