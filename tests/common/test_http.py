"""``common.http.HttpServer``: any aiohttp application, served with request heads held to a deadline (plain HTTP
here; the relay's HTTPS endpoint is tested with TLS in tests/access/test_slow_requests.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from common.http import HttpServer

HEAD_TIMEOUT_S = 0.5


@dataclass
class Served:
    http: HttpServer
    cuts: list[float] = field(default_factory=list)  # when on_head_timeout was called

    @property
    def port(self) -> int:
        return self.http.port


@pytest.fixture
async def server():
    app = web.Application()

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app.router.add_get("/", hello)
    cuts: list[float] = []
    http = HttpServer(app, "127.0.0.1", 0, head_timeout_s=HEAD_TIMEOUT_S, on_head_timeout=lambda: cuts.append(time.monotonic()))
    await http.start()
    try:
        yield Served(http, cuts)
    finally:
        await http.stop()


async def get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()


async def test_a_head_that_stops_halfway_gets_408_and_the_connection_closes(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
    started = time.monotonic()
    answer = await asyncio.wait_for(reader.read(), 3)
    writer.close()

    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"Connection: close" in answer
    assert time.monotonic() - started < HEAD_TIMEOUT_S + 1.5  # the deadline is kept (behaviour); slack for load
    assert len(server.cuts) == 1
    assert (await get(server.port)).endswith(b"hello")


async def test_a_prompt_request_is_served_as_usual(server):
    answer = await get(server.port)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    await asyncio.sleep(HEAD_TIMEOUT_S * 2)
    assert server.cuts == []


def test_a_deadline_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="head_timeout_s must be positive"):
        HttpServer(web.Application(), "127.0.0.1", 0, head_timeout_s=0)


async def _one_kept_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return await asyncio.wait_for(reader.readuntil(b"hello"), 3)


async def test_a_kept_alive_connection_serving_requests_past_the_first_deadline_is_not_cut(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        answers = []
        for _ in range(8):  # 8 heads, each whole, across more than two deadlines' length: the clock set at the first
            answers.append(await _one_kept_alive(reader, writer))  # one looks again when it fires, and finds no head
            await asyncio.sleep(HEAD_TIMEOUT_S / 4)
    finally:
        writer.close()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert server.cuts == []


async def test_a_later_head_that_stops_halfway_gets_its_own_whole_deadline(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await _one_kept_alive(reader, writer)  # the connection's clock was set for this head's deadline
    await asyncio.sleep(HEAD_TIMEOUT_S * 0.6)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
    started = time.monotonic()
    answer = await asyncio.wait_for(reader.read(), 3)
    writer.close()

    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert time.monotonic() - started >= HEAD_TIMEOUT_S * 0.9  # not cut at the first head's deadline, 0.4 s on
    assert len(server.cuts) == 1
