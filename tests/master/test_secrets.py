"""Renters' secrets in the store (SQLite and nx-27017) and the vault that seals them."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from common.errors import NotFound
from master.records import SecretRecord
from master.secrets import InvalidSecret, SecretBox, SecretUnreadable, SecretVault
from master.store.base import Store
from master.store.errors import DuplicateSecret


async def test_secrets_round_trip_per_account_and_a_name_is_taken_once(store: Store) -> None:
    rec = SecretRecord(account="ann", name="s3-creds", sealed="gAAA-sealed", created_at=1.5, size=12)
    await store.secrets.insert(rec)
    await store.secrets.insert(SecretRecord(account="bob", name="s3-creds", sealed="other", created_at=2.0, size=3))
    await store.secrets.insert(SecretRecord(account="ann", name="a-token", sealed="x", created_at=3.0, size=1))
    assert await store.secrets.get("ann", "s3-creds") == rec
    assert [s.name for s in await store.secrets.list("ann")] == ["a-token", "s3-creds"]
    assert [s.sealed for s in await store.secrets.list("bob")] == ["other"]
    with pytest.raises(DuplicateSecret):
        await store.secrets.insert(SecretRecord(account="ann", name="s3-creds", sealed="y", created_at=4.0))
    assert await store.secrets.delete("ann", "s3-creds") is True
    assert await store.secrets.delete("ann", "s3-creds") is False
    assert await store.secrets.get("ann", "s3-creds") is None
    assert (await store.secrets.get("bob", "s3-creds")) is not None  # another account's, untouched


async def test_the_vault_stores_no_value_in_clear_and_resolves_only_the_accounts_own(store: Store, tmp_path: Path) -> None:
    vault = SecretVault(store, SecretBox.open(tmp_path))
    assert stat.S_IMODE((tmp_path / "secrets.key").stat().st_mode) == 0o600
    await vault.create("ann", "hf", "hf_live_value_123")
    rec = await store.secrets.get("ann", "hf")
    assert rec is not None and "hf_live_value_123" not in json.dumps(rec.sealed) and rec.size == len("hf_live_value_123")
    assert "hf_live" not in repr(rec)
    assert await vault.resolve("ann", ["hf"]) == {"hf": "hf_live_value_123"}
    with pytest.raises(NotFound, match="'hf' no longer exists"):
        await vault.resolve("bob", ["hf"])  # bob cannot use ann's secret by naming it
    with pytest.raises(NotFound):
        await vault.delete("bob", "hf")
    with pytest.raises(InvalidSecret, match="secret name"):
        await vault.create("ann", "../x", "v")
    with pytest.raises(InvalidSecret, match="empty"):
        await vault.create("ann", "empty", "")
    # The same key opens it again (a restarted Master); another key cannot, and says why.
    assert await SecretVault(store, SecretBox.open(tmp_path)).resolve("ann", ["hf"]) == {"hf": "hf_live_value_123"}
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(SecretUnreadable, match="secrets.key"):
        await SecretVault(store, SecretBox.open(other)).resolve("ann", ["hf"])
