"""The one API client (management/client/api.py) against the real API, and its cursor paging against a paging server."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from management.client.api import ApiClient, ApiError, ApiRequest, ApiUnreachable, AsyncApiClient, instant, next_page
from tests.support.grid import free_port


async def test_an_api_error_carries_the_apis_code_and_http_status(api):
    with pytest.raises(ApiError) as missing:
        await api.operator.agent("agt-nope")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(ApiError) as bad:
        await api.operator.create_join_token("acme", ttl_s=-5)
    assert bad.value.status == 400 and bad.value.code == "bad_request"


async def test_calls_carry_the_bearer_key_and_without_it_are_refused(api):
    await api.operator.create_account("acme", "provider")
    token = await api.operator.create_join_token("acme", ttl_s=60)
    assert token["token"].startswith("igjt_")
    anonymous = AsyncApiClient(str(api.make_url("")), None)
    try:
        with pytest.raises(ApiError) as refused:
            await anonymous.list("/api/v1/agents")
        assert refused.value.status == 401
    finally:
        await anonymous.close()


async def test_the_blocking_client_makes_the_same_calls(api):
    client = ApiClient(str(api.make_url("")), api.auth["Authorization"].removeprefix("Bearer "))
    assert await asyncio.to_thread(client.list, "/api/v1/agents") == []
    status, body = await asyncio.to_thread(client.exchange, ApiRequest("GET", "/api/v1/agents/agt-nope"))
    assert status == 404 and body["error"]["code"] == "not_found"


def paging_app(items: list[int], page_size: int) -> web.Application:
    """A list resource that pages the way the API does: ``limit``/``cursor`` in, ``items``/``next_cursor`` out."""

    async def listing(request: web.Request) -> web.Response:
        start = int(request.query.get("cursor", "0"))
        limit = min(int(request.query.get("limit", "100")), page_size)
        end = start + limit
        cursor = str(end) if end < len(items) else None
        return web.json_response({"items": items[start:end], "next_cursor": cursor, "tag": request.query.get("tag")})

    app = web.Application()
    app.router.add_get("/api/v1/things", listing)
    return app


async def test_list_follows_the_cursor_through_every_page_keeping_the_filters():
    server = TestServer(paging_app(list(range(2_345)), page_size=100))
    await server.start_server()
    try:
        url = str(server.make_url(""))
        async with AsyncApiClient(url, "key") as client:
            assert await client.list("/api/v1/things", tag="x") == list(range(2_345))
        blocking = ApiClient(url, "key")
        pages = await asyncio.to_thread(lambda: list(blocking.pages("/api/v1/things", limit=1_000)))
        assert [len(p) for p in pages] == [100] * 23 + [45]
    finally:
        await server.close()


def test_a_page_without_a_cursor_is_the_last():
    first = ApiRequest("GET", "/api/v1/gpus", {"tier": "flagship", "limit": "100"})
    following = next_page(first, {"items": [1], "next_cursor": "abc"})
    assert following is not None and following.query == {"tier": "flagship", "limit": "100", "cursor": "abc"}
    assert next_page(first, {"items": [1]}) is None
    assert next_page(first, {"items": [], "next_cursor": None}) is None


def test_an_api_nobody_answers_is_named_with_status_zero():
    client = ApiClient(f"http://127.0.0.1:{free_port()}", "key", timeout_s=2)
    with pytest.raises(ApiUnreachable) as unreachable:
        client.health()
    assert unreachable.value.status == 0
    assert "cannot reach the management API at http://127.0.0.1:" in str(unreachable.value)


def test_timestamps_are_read_as_rfc3339_or_epoch_seconds():
    assert instant("2026-11-22T17:40:00Z") == instant(1795369200.0) == 1795369200.0
    assert instant(None) is None and instant("soon") is None and instant(True) is None
