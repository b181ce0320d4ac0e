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

Downloads and uploads are the expensive part: with a ``TransferGate`` (the relay always passes one), each
client address gets a few transfers at once and a byte budget per window; over either, the answer is
429 with ``Retry-After`` and a text saying which limit and when to come back. The index and the latency
probe cost nothing and are never limited.
"""

from __future__ import annotations

import functools
import math
import random
import re
from typing import Protocol

from aiohttp import web

from access.ratelimit import TransferGate, TransferRefusal

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


class SpeedtestMeter(Protocol):
    """What the endpoint reports as it goes (the relay's metrics)."""

    def speedtest_bytes(self, direction: str, count: int) -> None: ...  # direction: download or upload

    def speedtest_refused(self, reason: str) -> None: ...  # transfers, bytes or too_large


class _Unmetered:
    def speedtest_bytes(self, direction: str, count: int) -> None:
        pass

    def speedtest_refused(self, reason: str) -> None:
        pass


def add_speedtest_routes(
    app: web.Application,
    prefix: str = "/speedtest",
    *,
    gate: TransferGate | None = None,
    meter: SpeedtestMeter | None = None,
) -> None:
    """Mount a Speedtest Mini server at ``prefix``: its mini URL is ``<relay HTTPS base><prefix>``.

    ``gate`` limits transfers per client address (none: unlimited, for a server of one's own); ``meter`` hears
    of bytes moved and refusals."""
    endpoint = SpeedtestEndpoint(gate, meter or _Unmetered())
    root = "/" + prefix.strip("/")
    files = root + "/speedtest"
    app.router.add_get(root, _index)
    if root != "/":
        app.router.add_get(root + "/", _index)
    app.router.add_get(files + "/latency.txt", _latency)
    app.router.add_get(files + "/upload.php", _upload_probe)
    app.router.add_post(files + "/upload.php", endpoint.upload)
    app.router.add_get(files + "/{image:random[0-9]+x[0-9]+\\.jpg}", endpoint.image)


def image_bytes(side: int) -> int:
    """Size of ``random{side}x{side}.jpg``: about what the stock Mini image of that side weighs."""
    return 2 * side * side


@functools.cache
def _payload_block() -> bytes:
    """Made on first use and kept: every download streams slices of this one block."""
    return random.Random(_PAYLOAD_SEED).randbytes(_BLOCK_BYTES)


class SpeedtestEndpoint:
    """The two routes that move bytes, each transfer admitted by the gate and counted by the meter."""

    def __init__(self, gate: TransferGate | None, meter: SpeedtestMeter) -> None:
        self._gate = gate
        self._meter = meter

    async def image(self, request: web.Request) -> web.StreamResponse:
        match = _IMAGE_NAME.fullmatch(request.match_info["image"])
        if match is None or match[1] != match[2] or not 0 < int(match[1]) <= MAX_IMAGE_SIDE:
            raise web.HTTPNotFound(text=f"no such image; sides run from 1 to {MAX_IMAGE_SIDE}, e.g. random350x350.jpg")
        size = image_bytes(int(match[1]))
        address = request.remote or ""
        refusal = self._gate.begin(address, size) if self._gate is not None else None
        if refusal is not None:
            return self._refuse(refusal)
        try:
            response = web.StreamResponse(headers={"Content-Type": "image/jpeg", **_NO_CACHE})
            response.content_length = size
            await response.prepare(request)
            try:
                await _stream(response, size, self._meter)
            except ConnectionError:
                pass  # speedtest-cli hangs up mid-image when its test time is up: an expected end, not an error
            return response
        finally:
            if self._gate is not None:
                self._gate.end(address)

    async def upload(self, request: web.Request) -> web.Response:
        declared = request.content_length
        if declared is not None and declared > UPLOAD_CAP_BYTES:
            self._meter.speedtest_refused("too_large")
            raise web.HTTPRequestEntityTooLarge(max_size=UPLOAD_CAP_BYTES, actual_size=declared)
        address = request.remote or ""
        refusal = self._gate.begin(address, declared or 0) if self._gate is not None else None
        if refusal is not None:
            return self._refuse(refusal)
        received = 0
        try:
            async for chunk in request.content.iter_any():
                received += len(chunk)
                self._meter.speedtest_bytes("upload", len(chunk))
                if received > UPLOAD_CAP_BYTES:
                    self._meter.speedtest_refused("too_large")
                    raise web.HTTPRequestEntityTooLarge(max_size=UPLOAD_CAP_BYTES, actual_size=received)
        except ConnectionError:
            pass  # speedtest-cli stops sending mid-body when its test time is up: an expected end, not an error
        finally:
            if self._gate is not None:
                if declared is None:
                    self._gate.charge(address, received)  # a chunked body is paid for once its size is known
                self._gate.end(address)
        return web.Response(text=f"size={received}", headers=_NO_CACHE)

    def _refuse(self, refusal: TransferRefusal) -> web.Response:
        self._meter.speedtest_refused(refusal.reason)
        return web.Response(
            status=429,
            text=refusal.message + "\n",
            headers={"Retry-After": str(max(1, math.ceil(refusal.retry_after_s))), **_NO_CACHE},
        )


async def _stream(response: web.StreamResponse, remaining: int, meter: SpeedtestMeter) -> None:
    block = memoryview(_payload_block())
    offset = 0
    while remaining:
        size = min(_WRITE_BYTES, remaining, len(block) - offset)
        await response.write(block[offset : offset + size])
        meter.speedtest_bytes("download", size)
        remaining -= size
        offset = (offset + size) % len(block)
    await response.write_eof()


async def _upload_probe(request: web.Request) -> web.Response:
    return web.Response(text="size=0", headers=_NO_CACHE)


async def _latency(request: web.Request) -> web.Response:
    return web.Response(text="test=test", headers=_NO_CACHE)


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=_INDEX, content_type="text/html", headers=_NO_CACHE)
