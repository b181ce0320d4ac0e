"""A Jupyter-like web app for the links' tests: run as a workload's command (``python3 link_app.py PORT``).

Its page opens a WebSocket to a path relative to itself (as Jupyter's kernels do) and shows what the socket echoed;
``/api/headers`` answers the request headers it received (the tests check what the proxy kept from it);
``/api/upload`` counts a streamed body; ``/api/bytes?n=N`` streams N bytes; ``/api/kernels/echo`` echoes messages.
Runs on Debian's python3-aiohttp (3.8) as well as the project's own aiohttp, with nothing else.
"""

from __future__ import annotations

import sys

from aiohttp import WSMsgType, web

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Notebook (test app)</title>
<style>body{font-family:sans-serif;margin:2rem} #echo{font-size:1.4rem;color:#0a5}</style></head>
<body><h1>Notebook server (test app)</h1>
<p>Kernel: <span id="echo">connecting…</span></p>
<script>
const url = new URL("api/kernels/echo", location.href);
url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
const ws = new WebSocket(url);
ws.onopen = () => ws.send("ping from the browser");
ws.onmessage = (m) => { document.getElementById("echo").textContent = "echo: " + m.data; };
ws.onerror = () => { document.getElementById("echo").textContent = "websocket failed"; };
</script></body></html>
"""
CHUNK = 64 * 1024


async def index(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def headers(request: web.Request) -> web.Response:
    return web.json_response({k.lower(): v for k, v in request.headers.items()} | {":path": request.path_qs})


async def upload(request: web.Request) -> web.Response:
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        size += len(chunk)
    return web.json_response({"received": size})


async def stream_bytes(request: web.Request) -> web.StreamResponse:
    left = int(request.query.get("n", "0"))
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = left
    await response.prepare(request)
    block = b"x" * CHUNK
    while left > 0:
        await response.write(block[: min(left, CHUNK)])
        left -= CHUNK
    await response.write_eof()
    return response


async def kernel(request: web.Request) -> web.WebSocketResponse:
    socket = web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        if message.type == WSMsgType.TEXT:
            await socket.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await socket.send_bytes(message.data)
    return socket


async def moved(_: web.Request) -> web.Response:
    raise web.HTTPFound("/api/headers")


def main() -> None:
    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/headers", headers)
    app.router.add_post("/api/upload", upload)
    app.router.add_get("/api/bytes", stream_bytes)
    app.router.add_get("/api/kernels/echo", kernel)
    app.router.add_get("/api/moved", moved)
    print(f"test app serving on {sys.argv[1]}", flush=True)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
