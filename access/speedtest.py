"""The relay's own speed-test endpoint: a Speedtest Mini server mounted at ``prefix``, so that
speedtest-cli's mini mode measures an agent's link to its relay and nothing leaves the relay.

A Mini server is an index page plus a ``speedtest/`` folder; speedtest-cli's mini mode reads the
index at the URL it is given and then uses ``<URL>/speedtest/...``. Mounted at ``/speedtest``
(the default), the mini URL is ``https://RELAY/speedtest`` and the routes are:

- ``GET /speedtest``: the index; it names the upload extension (``uploadExtension: "php"``), which
  is what mini mode looks for in it;
- ``GET /speedtest/speedtest/random{N}x{N}.jpg``: the download payload, about 2·N² bytes like the
  stock Mini images, streamed from one cached block of deterministic pseudo-random bytes
  (incompressible, so a compressing proxy cannot inflate the figure): a request costs no memory
  of its own;
- ``POST /speedtest/speedtest/upload.php``: reads the body, discards it, answers ``size=<bytes>``;
  bodies over the cap are refused, being far larger than any chunk speedtest-cli sends;
- ``GET /speedtest/speedtest/upload.php``: ``size=0``, the reply mini mode's extension probe expects
  should an index not name the extension;
- ``GET /speedtest/speedtest/latency.txt``: ``test=test``, what speedtest-cli's latency probe checks.
"""

from __future__ import annotations

import functools
import random
import re

from aiohttp import web

# The stock Mini images run to random4000x4000.jpg (about 31 MB); nothing larger is served.
MAX_IMAGE_SIDE = 4000
UPLOAD_CAP_BYTES = 16 * 1024 * 1024
_BLOCK_BYTES = 1024 * 1024
_PAYLOAD_SEED = 0x1D1E
_WRITE_BYTES = 256 * 1024
_IMAGE_NAME = re.compile(r"random(\d{1,4})x(\d{1,4})\.jpg")
_INDEX = (
    "<!DOCTYPE html><html><head><title>idlegrid speed test</title></head><body>"
    '<script>var mini = {uploadExtension: "php"};</script>'
    "<p>idlegrid Access relay speed-test endpoint (Speedtest Mini layout).</p></body></html>"
)
_NO_CACHE = {"Cache-Control": "no-cache, no-store"}


def add_speedtest_routes(app: web.Application, prefix: str = "/speedtest") -> None:
    """Mount a Speedtest Mini server at ``prefix``: its mini URL is ``<relay HTTPS base><prefix>``."""
    root = "/" + prefix.strip("/")
    files = root + "/speedtest"
    app.router.add_get(root, _index)
    if root != "/":
        app.router.add_get(root + "/", _index)
    app.router.add_get(files + "/latency.txt", _latency)
    app.router.add_get(files + "/upload.php", _upload_probe)
    app.router.add_post(files + "/upload.php", _upload)
    app.router.add_get(files + "/{image:random[0-9]+x[0-9]+\\.jpg}", _image)


def image_bytes(side: int) -> int:
    """Size of ``random{side}x{side}.jpg``: about what the stock Mini image of that side weighs."""
    return 2 * side * side


@functools.cache
def _payload_block() -> bytes:
    """Made on first use and kept: every download streams slices of this one block."""
    return random.Random(_PAYLOAD_SEED).randbytes(_BLOCK_BYTES)


async def _image(request: web.Request) -> web.StreamResponse:
    match = _IMAGE_NAME.fullmatch(request.match_info["image"])
    if match is None or match[1] != match[2] or not 0 < int(match[1]) <= MAX_IMAGE_SIDE:
        raise web.HTTPNotFound(text=f"no such image; sides run from 1 to {MAX_IMAGE_SIDE}, e.g. random350x350.jpg")
    remaining = image_bytes(int(match[1]))
    response = web.StreamResponse(headers={"Content-Type": "image/jpeg", **_NO_CACHE})
    response.content_length = remaining
    await response.prepare(request)
    try:
        await _stream(response, remaining)
    except ConnectionError:
        pass  # speedtest-cli hangs up mid-image when its test time is up: an expected end, not an error
    return response


async def _stream(response: web.StreamResponse, remaining: int) -> None:
    block = memoryview(_payload_block())
    offset = 0
    while remaining:
        size = min(_WRITE_BYTES, remaining, len(block) - offset)
        await response.write(block[offset : offset + size])
        remaining -= size
        offset = (offset + size) % len(block)
    await response.write_eof()


async def _upload(request: web.Request) -> web.Response:
    if request.content_length is not None and request.content_length > UPLOAD_CAP_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=UPLOAD_CAP_BYTES, actual_size=request.content_length)
    received = 0
    try:
        async for chunk in request.content.iter_any():
            received += len(chunk)
            if received > UPLOAD_CAP_BYTES:
                raise web.HTTPRequestEntityTooLarge(max_size=UPLOAD_CAP_BYTES, actual_size=received)
    except ConnectionError:
        pass  # speedtest-cli stops sending mid-body when its test time is up: an expected end, not an error
    return web.Response(text=f"size={received}", headers=_NO_CACHE)


async def _upload_probe(request: web.Request) -> web.Response:
    return web.Response(text="size=0", headers=_NO_CACHE)


async def _latency(request: web.Request) -> web.Response:
    return web.Response(text="test=test", headers=_NO_CACHE)


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=_INDEX, content_type="text/html", headers=_NO_CACHE)
