"""Renters' secrets: named values an account stores once and uses in any workload, never shown again.

A value is sealed with the Master's secret key (Fernet: AES-128-CBC with an HMAC-SHA256, from ``cryptography``) before
it reaches the store, so the database, its backups and its replicas never hold one in clear. The key is a file beside
the Master's other keys (``<state_dir>/pki/secrets.key``, 0600), made at the first start; being in ``pki/``, it is in
every backup (``idlegrid master backup``, ``--pki-only`` too) and travels wherever the CA does (Masters sharing a store
share it as they share the CA: deploy/k8s's PKI secret, compose's volume).

Invariants: every read and write names its account, and a secret is found only under the account that made it (the
key is ``account/name``), so no call of one account can read, use or delete another's. A value leaves the vault only
through ``resolve``, which the scheduler calls to build a create command for a host; no answer carries it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from common.errors import IdlegridError, NotFound
from master.records import SecretRecord
from master.store.base import Store

SECRET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z"
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN)
MAX_SECRET_BYTES = 64 * 1024  # a token, a key pair, a small credentials file; not a dataset
MAX_SECRETS_PER_ACCOUNT = 200
KEY_FILE = "secrets.key"


class InvalidSecret(IdlegridError):
    """A secret's name or value this Master does not take: the message says which and why."""

    code = "bad_request"


class SecretUnreadable(IdlegridError):
    """A sealed value this Master's key cannot open: the store was written by a Master with another secrets.key."""

    code = "secret_unreadable"


class SecretBox:
    """Seals and opens values with one Fernet key."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def open(cls, key_dir: Path) -> SecretBox:
        """The key in ``key_dir/secrets.key``, made (0600, created exclusively) when there is none."""
        path = key_dir / KEY_FILE
        if not path.exists():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another process of this Master made it meanwhile: read theirs
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(Fernet.generate_key())
        return cls(path.read_bytes().strip())

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(value.encode()).decode("ascii")

    def unseal(self, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except InvalidToken:
            raise SecretUnreadable(
                "a stored secret cannot be opened with this Master's secrets.key (the store was written by a Master "
                "with another key: copy that Master's pki/secrets.key into this one's pki directory)"
            ) from None


def check_secret_name(name: str) -> None:
    if not _SECRET_NAME.match(name):
        raise InvalidSecret(
            f"secret name {name!r}: use 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )


class SecretVault:
    """The accounts' secrets: create, list, delete, and ``resolve`` for the scheduler."""

    def __init__(self, store: Store, box: SecretBox, *, max_per_account: int = MAX_SECRETS_PER_ACCOUNT) -> None:
        self._store = store
        self._box = box
        self._max = max_per_account

    async def create(self, account: str, name: str, value: str, *, now: float | None = None) -> SecretRecord:
        check_secret_name(name)
        size = len(value.encode())
        if size == 0:
            raise InvalidSecret(f"secret {name!r}: the value is empty")
        if size > MAX_SECRET_BYTES:
            raise InvalidSecret(f"secret {name!r}: the value is {size} bytes, more than {MAX_SECRET_BYTES}")
        if len(await self._store.secrets.list(account)) >= self._max:
            raise InvalidSecret(f"this account already has {self._max} secrets: delete one first")
        rec = SecretRecord(
            account=account, name=name, sealed=self._box.seal(value), created_at=time.time() if now is None else now, size=size
        )
        await self._store.secrets.insert(rec)  # DuplicateSecret (409) if the name is taken
        return rec

    async def list(self, account: str) -> list[SecretRecord]:
        return await self._store.secrets.list(account)

    async def names(self, account: str) -> set[str]:
        return {rec.name for rec in await self._store.secrets.list(account)}

    async def delete(self, account: str, name: str) -> None:
        check_secret_name(name)
        if not await self._store.secrets.delete(account, name):
            raise NotFound(f"no secret {name!r}")

    def seal(self, value: str) -> str:
        """``value`` encrypted with this Master's key: for a secret the grid keeps for a workload (its registry
        password) rather than under a name."""
        return self._box.seal(value)

    def unseal(self, sealed: str) -> str:
        """What ``seal`` was given; SecretUnreadable when another Master's key sealed it."""
        return self._box.unseal(sealed)

    async def resolve(self, account: str, names: Iterable[str]) -> dict[str, str]:
        """The values of ``account``'s secrets ``names``; NotFound naming the first missing one (deleted since the
        workload was submitted)."""
        values: dict[str, str] = {}
        for name in sorted(set(names)):
            rec = await self._store.secrets.get(account, name)
            if rec is None:
                raise NotFound(f"secret {name!r} no longer exists: create it again (idlegrid secret create {name})")
            values[name] = self._box.unseal(rec.sealed)
        return values
