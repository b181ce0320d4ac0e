"""A Jupyter-like web app for the links' tests: run as a workload's command (``python3 link_app.py PORT``).

Its page opens a WebSocket to a path relative to itself (as Jupyter's kernels do) and shows what the socket echoed;
``/api/headers`` answers the request headers it received (the tests check what the proxy kept from it);
``/api/upload`` counts a streamed body; ``/api/bytes?n=N`` streams N bytes; ``/api/kernels/echo`` echoes messages;
``/probe`` is a hostile page that tries to read the console as its visitor (what it got is shown on the page);
``/plant?value=V`` is another, whose answer tries to set the console's cookie (``V``, another account's session) at
/console and at /, one with a Domain, and two cookies of its own: one at its own path, one at /.
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
# A hostile page, as a renter's image could serve it: it tries to read the console (``?console=<its origin>``) as the
# visitor, whose console session cookie the browser holds for the same host (cookies ignore ports), and to make an API
# key there. It shows what it got in #probe as JSON; "own" is a control (its own origin's page, which it may read).
PROBE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Probe (test app)</title></head>
<body><h1>Probe</h1><pre id="probe">running</pre>
<script>
const consoleOrigin = new URLSearchParams(location.search).get("console");
const got = {};
async function attempt(name, step) {
  try { got[name] = await step(); } catch (e) { got[name] = "blocked: " + e.name; }
}
(async () => {
  await attempt("own", async () => (await fetch("api/headers")).status);
  await attempt("read", async () => {
    const text = await (await fetch(consoleOrigin + "/console/account", {credentials: "include"})).text();
    const csrf = text.match(/name="csrf_token" value="([^"]+)"/);
    return "read " + text.length + " characters, csrf " + (csrf ? csrf[1] : "none");
  });
  await attempt("opaque", async () => {
    const answer = await fetch(consoleOrigin + "/console/account", {credentials: "include", mode: "no-cors"});
    return answer.type + " " + (await answer.text()).length;
  });
  await attempt("post", async () => {
    const body = new URLSearchParams({name: "stolen-by-a-link"});
    await fetch(consoleOrigin + "/console/account/keys", {method: "POST", body, credentials: "include", mode: "no-cors"});
    return "sent";
  });
  document.getElementById("probe").textContent = JSON.stringify(got);
})();
</script></body></html>
"""
PLANT = """<!doctype html>
<html><head><meta charset="utf-8"><title>Planted (test app)</title></head>
<body><h1>Cookies planted</h1><p>This page's answer tried to set the console's cookie in your browser.</p></body></html>
"""
CHUNK = 64 * 1024


async def index(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def probe(_: web.Request) -> web.Response:
    return web.Response(text=PROBE, content_type="text/html")


async def plant(request: web.Request) -> web.Response:
    response = web.Response(text=PLANT, content_type="text/html")
    value = request.query.get("value", "stolen")
    for cookie in (
        f"idlegrid_console={value}; Path=/console; HttpOnly; SameSite=Lax",
        f"idlegrid_console={value}; Path=/",
        f"idlegrid_console={value}; Path=/console/account",
        f"idlegrid_console={value}; Domain=127.0.0.1; Path=/console",
        "theme=dark; Domain=127.0.0.1",
        "app_root=1; Path=/",
        "app_own=1",  # no Path: the page's directory, the link's own path
    ):
        response.headers.add("Set-Cookie", cookie)
    return response


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
    app.router.add_get("/probe", probe)
    app.router.add_get("/plant", plant)
    print(f"test app serving on {sys.argv[1]}", flush=True)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
