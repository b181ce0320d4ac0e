"""API keys are checked against the store, and a known key is remembered a short while (every request checks one)."""

from __future__ import annotations

import pytest

from common.errors import NotFound
from master import accounts
from master.config import MasterConfig
from master.master import Master


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
