"""Fixtures of the loop tests: a real Master (SQLite in tmp_path) with two renter accounts, and the relay link its
agents talk through (tests/master/linked.py: the Master's link handlers, no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from tests.master.linked import relay_link


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await m.start()
    await m.accounts.ensure("alice", AccountRole.RENTER)
    await m.accounts.ensure("bob", AccountRole.RENTER)
    yield m
    await m.stop()


@pytest.fixture
def link() -> AccessLink:
    return relay_link()
