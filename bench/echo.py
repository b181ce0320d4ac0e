"""The transport's own limit: a plain ``websockets`` server with the relay's TLS settings that echoes every message.

It checks nothing and relays nothing, so what the fleet harness pushes through it is what mutual TLS and
WebSockets alone allow on this machine; the relay's figure is reported as a share of it.

    python -m bench.echo --port PORT --cert relay.crt --key relay.key --ca ca.crt
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import signal
import sys
from collections.abc import Sequence

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from access.daemon import TLS_READ_BUFFER_BYTES
from common.pki import server_tls_context
from common.wire import HARD_FRAME_BYTES


async def echo(connection: ServerConnection) -> None:
    try:
        while True:
            message = await connection.recv(decode=False)  # as the relay reads: bytes, never decoded
            await connection.send(message, text=True)
    except ConnectionClosed:
        pass


async def serve_echo(host: str, port: int, cert: str, key: str, ca: str) -> None:
    context = server_tls_context(cert, key, ca, require_client_cert=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    # The relay's connection options (access/relay.py), so only what the relay does differs.
    async with serve(echo, host, port, ssl=context, max_size=HARD_FRAME_BYTES, max_queue=8, compression=None):
        print(f"echo server on wss://{host}:{port}", flush=True)
        await stopping.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ca", required=True)
    args = p.parse_args(argv)
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES  # as the relay's serve() does
    asyncio.run(serve_echo(args.host, args.port, args.cert, args.key, args.ca))
    return 0


if __name__ == "__main__":
    sys.exit(main())
