"""The console's WebSockets for live logs and the terminal: who may open them, and what a browser may send on them.

The bridge to a real tunnel is walked by the renter's journey on a real grid (test_journey_renter.py); here the
refusals, on the console as the Master serves it (aiohttp's test server, no browser)."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import WSMsgType

from common.tunnel import HEADER, Op, decode_frame, encode_frame
from management.console.terminal import FROM_BROWSER_TERMINAL, refusal
from management.http.keys import SERVICES_KEY
from master.records import AccountRecord, WorkloadSpec
from tests.console.plain_http import sign_in


def binary(data: bytes) -> aiohttp.WSMessage:
    return aiohttp.WSMessage(WSMsgType.BINARY, data, None)


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (aiohttp.WSMessage(WSMsgType.TEXT, "ls\n", None), "binary tunnel frames only"),
        (binary(b"\x01\x00"), "not a tunnel frame"),
        (binary(bytes([99]) + b"\x00\x00\x00\x00"), "not a tunnel frame: unknown tunnel op 99"),
        (binary(encode_frame(Op.OPEN, 0)), "op OPEN may not be sent here"),
        (binary(encode_frame(Op.EXIT, 0, b'{"code": 0}')), "op EXIT may not be sent here"),
        (binary(encode_frame(Op.DATA, 1, b"x")), "stream 1: the terminal uses stream 0 only"),
        (binary(encode_frame(Op.RESIZE, 0, b'{"cols": 0, "rows": 24}')), "RESIZE: Expected `int` >= 1"),
        (binary(encode_frame(Op.RESIZE, 0, b"wide")), "RESIZE: the payload is JSON"),
    ],
)
def test_the_terminal_refuses_what_a_browser_may_not_send(message, says):
    assert says in refusal(message, FROM_BROWSER_TERMINAL)


@pytest.mark.parametrize(
    "frame",
    [
        encode_frame(Op.DATA, 0, b"ls -l\r"),
        encode_frame(Op.EOF, 0),
        encode_frame(Op.RESIZE, 0, json.dumps({"cols": 120, "rows": 40}).encode()),
    ],
)
def test_the_terminal_passes_data_resize_and_eof_on_stream_0(frame):
    assert refusal(binary(frame), FROM_BROWSER_TERMINAL) == ""
    assert decode_frame(frame).stream == 0 and len(frame) >= HEADER.size


def test_the_logs_socket_takes_nothing_from_the_browser():
    assert refusal(binary(encode_frame(Op.DATA, 0, b"x")), frozenset()) == "this socket only receives"


async def test_a_socket_needs_a_session_and_the_consoles_own_origin(console):
    path = "/console/workloads/wl-0123456789abcdef/terminal"
    with pytest.raises(aiohttp.WSServerHandshakeError) as signed_out:
        await console.ws_connect(path, headers={"Origin": console.origin})
    assert signed_out.value.status == 401
    await sign_in(console)
    with pytest.raises(aiohttp.WSServerHandshakeError) as elsewhere:
        await console.ws_connect(path, headers={"Origin": "http://evil.example"})
    assert elsewhere.value.status == 403


async def test_another_accounts_workload_gets_an_error_frame_and_no_tunnel(console):
    await console.master.accounts.create(AccountRecord(id="zoe", role="renter"))
    theirs = await console.app[SERVICES_KEY].workloads.submit_workload("zoe", WorkloadSpec(name="theirs", image="python:3.12"))
    await sign_in(console)
    for kind in ("logs", "terminal"):
        socket = await console.ws_connect(f"/console/workloads/{theirs.id}/{kind}", headers={"Origin": console.origin})
        first = await socket.receive()
        frame = decode_frame(first.data)
        assert frame.op is Op.ERROR and f"no workload {theirs.id!r}" in frame.payload.decode()
        closed = await socket.receive()
        assert closed.type is WSMsgType.CLOSE and socket.close_code == 1011
    opened = await console.master.store.events.list(kind_prefix="tunnel.opened")
    assert opened == []
