"""How an agent keeps its relay cheap: the kernel (TCP_USER_TIMEOUT) notices a dead host or network, rare pings a
hung relay process, and jittered report periods keep thousands of agents from reporting in step."""

from __future__ import annotations

import socket

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from agent.daemon import give_up_unacknowledged, jittered


async def test_the_relay_connection_is_given_up_when_sent_data_stays_unacknowledged():
    async def silent(connection):
        await connection.wait_closed()

    async with serve(silent, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as ws:
            assert give_up_unacknowledged(ws, 30.0)
            sock = ws.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000


def test_report_periods_are_jittered_around_their_interval():
    periods = [jittered(5.0) for _ in range(2000)]
    assert all(4.0 <= p <= 6.0 for p in periods)
    assert max(periods) - min(periods) > 1.5  # spread out, not one period for everyone
    assert abs(sum(periods) / len(periods) - 5.0) < 0.1  # the mean stays the interval: the load is unchanged
