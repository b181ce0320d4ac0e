"""Renters' secrets: create (the value is taken once and never shown again), list by name, delete.

Every call acts on the caller's own account: there is no operator view of another account's secrets, since nothing
needs one (a workload uses its own account's secrets only, resolved by the scheduler when it builds a host's create
command: management/workloads/storage.py). The Master keeps them sealed (master/secrets.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.containers import RegistryAuth
from master.port import MasterPort, SecretRecord


@dataclass(frozen=True)
class SecretListing:
    """What an answer may say of a secret: never its value."""

    name: str
    created_at: float
    size: int


def listing(rec: SecretRecord) -> SecretListing:
    return SecretListing(name=rec.name, created_at=rec.created_at, size=rec.size)


class SecretsService:
    def __init__(self, master: MasterPort) -> None:
        self._master = master
        self._vault = master.secrets  # read: creating and deleting are the port's operations

    async def create(self, account: str, name: str, value: str) -> SecretListing:
        return listing(await self._master.create_secret(account, name, value))

    async def list(self, account: str) -> list[SecretListing]:
        return [listing(rec) for rec in await self._vault.list(account)]

    async def delete(self, account: str, name: str) -> None:
        await self._master.delete_secret(account, name)

    async def registry_auth(self, account: str, username: str, password_secret: str) -> RegistryAuth:
        """Credentials for a private image's registry whose password is ``account``'s secret ``password_secret``
        (the spec takes the password itself: the console's form names a stored secret instead of asking for it).
        NotFound when the account has no such secret."""
        values = await self._vault.resolve(account, [password_secret])
        return RegistryAuth(username=username, password=values[password_secret])
