"""The relay's HTTPS endpoint holds request heads to ``http_head_timeout_s``: a client trickling its request line
and headers (or its TLS handshake) is cut off, with 408 where it got that far, while other clients are served.
Raw sockets against the real server, so nothing in an HTTP client library smooths the trickle over."""

from __future__ import annotations

import asyncio
import ssl
import time

import aiohttp

from tests.access.conftest import eventually
from tests.support.prometheus import sample

HEAD_TIMEOUT_S = 1.0
TRICKLE_S = 0.25  # one header byte this often: each byte is in time, the head as a whole is not


async def open_tls(relay, pki) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", relay.http.port, ssl=pki.client_context(), server_hostname="127.0.0.1")


async def trickle(writer: asyncio.StreamWriter, data: bytes, deadline_s: float) -> None:
    """Send ``data`` a byte at a time until it is sent, the server hangs up, or ``deadline_s`` passes."""
    started = time.monotonic()
    for byte in data:
        if writer.is_closing() or time.monotonic() - started > deadline_s:
            return
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            return
        await asyncio.sleep(TRICKLE_S)


async def read_until_closed(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the server says until it closes; raises TimeoutError if it does not close in time."""
    chunks = []
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(4096):
            chunks.append(chunk)
    return b"".join(chunks)


async def healthz(relay, pki) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{relay.http_url}/healthz", ssl=pki.client_context()) as response:
            return response.status


SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: relay\r\n" + b"X-Padding: " + b"p" * 60 + b"\r\n\r\n"


async def test_a_client_trickling_its_request_headers_is_cut_off_with_408_while_others_are_served(make_relay, pki):
    relay = await make_relay(http_head_timeout_s=HEAD_TIMEOUT_S)
    reader, writer = await open_tls(relay, pki)
    started = time.monotonic()
    sender = asyncio.create_task(trickle(writer, SLOW_HEAD, deadline_s=10.0))
    try:
        assert await healthz(relay, pki) == 200  # served while the trickler is being read
        answer = await read_until_closed(reader, timeout_s=HEAD_TIMEOUT_S + 3.0)
    finally:
        sender.cancel()
        writer.close()
    elapsed = time.monotonic() - started

    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"did not arrive in time" in answer
    # Behaviour, not speed: the 408 comes at the head's deadline, not before it and not long after (slack for a loaded
    # machine); the deadline is what the relay promises a slow client.
    assert HEAD_TIMEOUT_S - 0.1 < elapsed < HEAD_TIMEOUT_S + 1.5
    assert sample(relay.metrics.render(), "idlegrid_access_http_head_timeouts_total") == 1
    assert await healthz(relay, pki) == 200


async def test_the_next_request_on_a_kept_alive_connection_is_held_to_the_same_limit(make_relay, pki):
    relay = await make_relay(http_head_timeout_s=HEAD_TIMEOUT_S)
    reader, writer = await open_tls(relay, pki)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"}"), 3)
        assert first.startswith(b"HTTP/1.1 200")
        await asyncio.sleep(HEAD_TIMEOUT_S * 1.5)  # idle between requests: that is keep-alive's business, not this limit's
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
        second = await asyncio.wait_for(reader.readuntil(b"}"), 3)
        assert second.startswith(b"HTTP/1.1 200")
        sender = asyncio.create_task(trickle(writer, SLOW_HEAD, deadline_s=10.0))
        answer = await read_until_closed(reader, timeout_s=HEAD_TIMEOUT_S + 3.0)
        sender.cancel()
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")


async def test_a_slow_request_body_is_not_a_slow_head(make_relay, pki):
    relay = await make_relay(http_head_timeout_s=HEAD_TIMEOUT_S)
    reader, writer = await open_tls(relay, pki)
    body = b"x" * 8
    try:
        writer.write(b"POST /speedtest/speedtest/upload.php HTTP/1.1\r\nHost: relay\r\nContent-Length: %d\r\n\r\n" % len(body))
        await trickle(writer, body, deadline_s=10.0)  # 2 s of body, twice the head limit
        answer = await asyncio.wait_for(reader.readuntil(b"size=8"), 3)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")


async def test_a_client_that_never_finishes_its_tls_handshake_is_cut_off(make_relay, pki):
    relay = await make_relay(http_head_timeout_s=HEAD_TIMEOUT_S)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.http.port)  # TCP only: no ClientHello
    try:
        writer.write(b"\x16\x03\x01")  # the first bytes of a TLS record, and then nothing
        assert await read_until_closed(reader, timeout_s=HEAD_TIMEOUT_S + 3.0) == b""
    finally:
        writer.close()
    assert await healthz(relay, pki) == 200


async def test_many_trickling_clients_are_all_cut_off_and_the_endpoint_keeps_answering(make_relay, pki):
    relay = await make_relay(http_head_timeout_s=HEAD_TIMEOUT_S)
    connections = [await open_tls(relay, pki) for _ in range(20)]
    senders = [asyncio.create_task(trickle(writer, SLOW_HEAD, deadline_s=10.0)) for _, writer in connections]
    try:
        answers = await asyncio.gather(*(read_until_closed(reader, HEAD_TIMEOUT_S + 5.0) for reader, _ in connections))
    finally:
        for task in senders:
            task.cancel()
        for _, writer in connections:
            writer.close()
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers)
    await eventually(
        lambda: sample(relay.metrics.render(), "idlegrid_access_http_head_timeouts_total") == 20, "every cut counted"
    )
    assert await healthz(relay, pki) == 200
