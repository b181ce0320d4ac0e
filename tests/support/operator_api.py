"""The ``api`` fixture: the operator API on a real Master (SQLite in the test's tmp_path), with an operator key."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from management.api import build_app
from master.config import MasterConfig
from master.service import Master


@pytest.fixture
async def api(tmp_path):
    """A test client of the API; ``api.master`` is the Master behind it, ``api.auth`` the operator's header."""
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    key = await master.create_api_key("test operator")
    client = TestClient(TestServer(build_app(master)))
    await client.start_server()
    client.master = master
    client.auth = {"Authorization": f"Bearer {key}"}
    yield client
    await client.close()
    await master.stop()
