"""Accounts, their API keys and passwords, the console's sign-in, and the audit trail of changes.

``owner`` (as the API's auth decided it): the one account a provider's or renter's call may see; another account
answers NotFound, as a missing one does.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from common.errors import InvalidPassword, NotFound, SignInRefused
from management.services.models import KeyText, Page, PositionKey, page_of, positioned_page
from master.port import AccountChange, AccountRecord, ApiKeyRecord, Credential, IssuedKey, MasterPort


class AccountIdKey(msgspec.Struct, array_like=True, frozen=True):
    id: KeyText


@dataclass(frozen=True)
class AuditEntry:
    """One successful change made through the API, as the audit middleware saw it."""

    account: str
    key_id: str
    role: str
    method: str
    route: str  # the route's pattern, e.g. "/api/v1/agents/{agent_id}/drain"
    target: str  # what it changed: the id in the path, or the id of what it created
    status: int


def _owned(account_id: str, owner: str | None) -> None:
    if owner is not None and account_id != owner:
        raise NotFound(f"no account {account_id!r}")


class AccountsService:
    def __init__(self, master: MasterPort) -> None:
        self._master = master

    async def credential(self, key: str) -> Credential:
        return await self._master.accounts.credential(key)

    async def create_account(self, account: AccountRecord) -> AccountRecord:
        return await self._master.create_account(account)

    async def get_account(self, account_id: str, *, owner: str | None = None) -> AccountRecord:
        _owned(account_id, owner)
        return await self._master.accounts.get(account_id)

    async def checked_account(self, account_id: str) -> AccountRecord:
        """The account as a credential's check reads it: from the Master's memory of checked accounts (up to its
        API key cache's seconds old from another Master; this one's changes at once). NotFound for none."""
        return await self._master.accounts.checked(account_id)

    async def list_accounts(
        self, *, role: str | None = None, owner: str | None = None, after: AccountIdKey | None = None, limit: int
    ) -> Page[AccountRecord]:
        """Ordered by id. A non-operator's list holds its own account only."""
        if owner is not None:
            own = await self._master.accounts.get(owner)
            wanted = (role is None or own.role == role) and (after is None or own.id > after.id)
            return Page([own] if wanted else [], None)
        found = await self._master.accounts.list(role=role, after=after.id if after else None, limit=limit + 1)
        return page_of(found, limit, lambda a: AccountIdKey(a.id))

    async def update_account(self, account_id: str, change: AccountChange) -> AccountRecord:
        return await self._master.update_account(account_id, change)

    async def create_api_key(self, account_id: str, name: str, *, owner: str | None = None) -> IssuedKey:
        _owned(account_id, owner)
        return await self._master.create_account_key(account_id, name)

    async def list_api_keys(
        self, account_id: str, *, owner: str | None = None, after: PositionKey | None = None, limit: int
    ) -> Page[ApiKeyRecord]:
        """Oldest first; the key is the position in that order (keys are only ever added, at the end)."""
        _owned(account_id, owner)
        return positioned_page(await self._master.accounts.keys(account_id), after, limit)

    async def revoke_api_key(self, key_id: str, *, owner: str | None = None) -> ApiKeyRecord:
        key = await self._master.accounts.key(key_id)
        if owner is not None and key.subject != owner:
            raise NotFound(f"no API key {key_id!r}")
        return await self._master.revoke_account_key(key_id)

    # --- passwords and the console's sign-in (master/passwords.py, docs/console.md) ------------------------------

    async def set_password(
        self, account_id: str, password: str, *, owner: str | None = None, by: str, current_password: str | None = None
    ) -> AccountRecord:
        """Set ``account_id``'s password as account ``by``; changing one's own needs the current password when one is
        set. Every console session of the account ends (its password epoch moves on)."""
        _owned(account_id, owner)
        own = account_id == by
        if own and current_password is None and (await self._master.accounts.get(account_id)).password_hash:
            raise InvalidPassword("current_password: required to change your own password")
        updated = await self._master.set_password(account_id, password, current_password=current_password if own else None)
        await self._master.record_event("account.password_set", account_id, by=by)
        return updated

    async def sign_in(self, account_id: str, password: str, *, address: str) -> AccountRecord:
        """The account, when ``password`` is its password and it is enabled; SignInRefused otherwise. Either way an
        audit event (``console.signin`` or ``console.signin_refused``) names the account and the client's address."""
        try:
            account = await self._master.accounts.sign_in(account_id, password)
        except SignInRefused as exc:
            await self._master.record_event("console.signin_refused", account_id[:64], address=address, reason=str(exc))
            raise
        await self._master.record_event("console.signin", account.id, address=address)
        return account

    async def record_audit(self, entry: AuditEntry) -> None:
        await self._master.record_event(
            "audit",
            entry.account,
            key_id=entry.key_id,
            role=entry.role,
            method=entry.method,
            route=entry.route,
            target=entry.target,
            status=entry.status,
        )
