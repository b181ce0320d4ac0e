"""The ``api`` fixture: the operator API on a real Master (SQLite in the test's tmp_path), with an operator key."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from management.app import api_app
from management.client.api import AsyncApiClient
from master.config import MasterConfig
from master.master import Master


class OperatorApi(TestClient[web.Request, web.Application]):
    """aiohttp's test client, for asserting on raw HTTP, with the Master behind it and the operator's credentials."""

    master: Master
    auth: dict[str, str]  # the operator's Authorization header
    operator: AsyncApiClient  # the project's own API client (management/client/api.py), as the operator


@contextlib.asynccontextmanager
async def operator_api(config: MasterConfig) -> AsyncIterator[OperatorApi]:
    """The operator API on a real Master of ``config``, with an operator key; stopped when the block ends."""
    master = Master(config)
    await master.start()
    key = await master.create_api_key("test operator")
    client = OperatorApi(TestServer(api_app(master)))
    await client.start_server()
    client.master = master
    client.auth = {"Authorization": f"Bearer {key}"}
    client.operator = AsyncApiClient(str(client.make_url("")), key)
    try:
        yield client
    finally:
        await client.operator.close()
        await client.close()
        await master.stop()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[OperatorApi]:
    async with operator_api(MasterConfig(state_dir=str(tmp_path), link_port=0)) as client:
        yield client
