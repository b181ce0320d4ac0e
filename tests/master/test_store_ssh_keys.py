"""The SSH-key collection, management's (management/store/ssh_keys.py), on both backends, as the contract tests run the
others."""

from __future__ import annotations

from management.store import ssh_key_repo
from master.records import SshKeyRecord
from master.store.base import Store
from tests.master.test_store_contract import NOW, assert_same


def ssh_key(key_id: str, account: str, created_at: float) -> SshKeyRecord:
    return SshKeyRecord(
        id=key_id,
        account=account,
        name=f"{account}@laptop",
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ1n4g1+Wm0sMC5Ml8fG8gTmPjq2bK9h0b7o1sZJ9Y0x",
        fingerprint=f"SHA256:{key_id}",
        created_at=created_at,
    )


async def test_ssh_keys_list_by_creation_per_account_and_delete_says_whether_there_was_one(store: Store) -> None:
    for rec in [ssh_key("sshk-2", "ana", NOW + 1), ssh_key("sshk-1", "bo", NOW), ssh_key("sshk-3", "ana", NOW + 2)]:
        await ssh_key_repo(store).put(rec)
    assert [k.id for k in await ssh_key_repo(store).list()] == ["sshk-1", "sshk-2", "sshk-3"]
    assert_same(
        await ssh_key_repo(store).list(account="ana"), [ssh_key("sshk-2", "ana", NOW + 1), ssh_key("sshk-3", "ana", NOW + 2)]
    )
    assert await ssh_key_repo(store).list(account="nobody") == []
    assert await ssh_key_repo(store).delete("sshk-2") is True
    assert await ssh_key_repo(store).delete("sshk-2") is False
    assert [k.id for k in await ssh_key_repo(store).list(account="ana")] == ["sshk-3"]
