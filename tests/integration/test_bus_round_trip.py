"""A round trip to the bus that its caller stops waiting for leaves the connection working.

nats-py queues a future for each ping and sets its pong's result on it; one cancelled before its pong
arrives raises in the connection's read loop, which then reads nothing more while the connection
still counts as up (every request of the api timed out after a dashboard stream, closed while its
subscription's ping was out, took the api's connection down so)."""

from __future__ import annotations

import asyncio

from tests.waits import until_async


async def _still_reads(bus) -> bool:
    """A request this connection makes gets its reply (JetStream's account info, as the admin role may)."""
    try:
        await asyncio.wait_for(bus.js.account_info(), 5)
    except Exception:  # no reply read: timed out
        return False
    return True


def test_a_round_trip_its_caller_gives_up_on_leaves_the_connection_reading(isolated):
    async def scenario() -> None:
        bus = await isolated.bus("admin")
        try:
            assert await bus.round_trip(timeout=5) is True
            for _ in range(5):
                waiter = asyncio.ensure_future(bus.round_trip())
                while not bus.nc._pongs:  # its ping is out: the pong comes after the waiter is gone
                    await asyncio.sleep(0)
                waiter.cancel()
            await until_async(lambda: not bus.nc._pongs, "every pong back", timeout=5)
            assert await _still_reads(bus), "the connection stopped reading after a round trip was given up"
            assert await bus.round_trip(timeout=5) is True
        finally:
            await bus.close()

    asyncio.run(scenario())
