"""API keys are checked against the store, and a known key is remembered a short while (every request checks one)."""

from __future__ import annotations

import pytest

from common.errors import NotFound
from master import accounts
from master.config import MasterConfig
from master.master import Master
from master.records import AccountRecord


async def test_a_known_key_is_read_from_the_store_once_per_cache_period(tmp_path, monkeypatch):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        key = await master.create_api_key("ops")
        reads: list[str] = []
        real_get = master.store.api_keys.get

        async def counting_get(key_hash):
            reads.append(key_hash)
            return await real_get(key_hash)

        monkeypatch.setattr(master.store.api_keys, "get", counting_get)
        for _ in range(5):
            assert (await master.check_api_key(key)).name == "ops"
        assert len(reads) == 1
        for _ in range(3):
            with pytest.raises(NotFound):
                await master.check_api_key("igak_made_up")
        assert len(reads) == 4  # unknown keys are never remembered
        monkeypatch.setattr(accounts, "API_KEY_CACHE_S", 0.0)
        other = await master.create_api_key("ci")
        await master.check_api_key(other)
        await master.check_api_key(other)
        assert len(reads) == 6  # trusted for no time at all: the store is asked every time
    finally:
        await master.stop()


async def test_a_checked_account_is_read_from_the_store_once_per_cache_period_and_forgotten_when_changed(tmp_path, monkeypatch):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        await master.accounts.create(AccountRecord(id="ana", role="renter"))
        reads: list[str] = []
        real_get = master.store.accounts.get

        async def counting_get(account_id):
            reads.append(account_id)
            return await real_get(account_id)

        monkeypatch.setattr(master.store.accounts, "get", counting_get)
        for _ in range(5):
            assert not (await master.accounts.checked("ana")).disabled
        assert len(reads) == 1
        await master.accounts.update("ana", accounts.AccountChange(disabled=True))
        assert (await master.accounts.checked("ana")).disabled  # this Master's change: at once, not 10 s later
        for _ in range(2):
            with pytest.raises(NotFound):
                await master.accounts.checked("nobody")
        assert reads.count("nobody") == 2  # no account is never remembered
    finally:
        await master.stop()
