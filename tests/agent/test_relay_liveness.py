"""How an agent notices a relay that is gone: the kernel's TCP_USER_TIMEOUT for a dead host or network, rare pings
for a hung relay process."""

from __future__ import annotations

import socket

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from agent.daemon import give_up_unacknowledged


async def test_the_relay_connection_is_given_up_when_sent_data_stays_unacknowledged():
    async def silent(connection):
        await connection.wait_closed()

    async with serve(silent, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as ws:
            assert give_up_unacknowledged(ws, 30.0)
            sock = ws.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
