"""Accounts and their API keys: who may use the grid, with which role, and what the scheduler reads about them.

An account's id is chosen by the operator and is what the rest of the Master already calls a provider
(an agent's ``provider``, a join token's ``provider``). A key belongs to one account and takes its role
from it at every check, so changing an account's role or disabling it changes what its keys may do at
once. Keys are stored hashed and shown once; each has a public ``key_id`` to list and revoke it by.

Every API request checks its key, so checked keys are remembered for ``API_KEY_CACHE_S`` (a store read
per request cost a thread hop each). Whatever this Master changes (a revocation, an account disabled or
given another role) evicts the keys it concerns from the cache at once; another Master sharing the store
sees the change within ``API_KEY_CACHE_S``.
"""

from __future__ import annotations

import asyncio
import builtins
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import msgspec

from common.errors import Conflict, InvalidAccount, InvalidPassword, NotFound, SignInRefused
from master.enrollment import hash_secret
from master.passwords import hash_password, password_matches
from master.records import AccountRecord, ApiKeyRecord
from master.store.base import Store

ACCOUNT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}\Z"
_ACCOUNT_ID = re.compile(ACCOUNT_ID_PATTERN)
MAX_NAME = 128
MAX_SHARE = 1e6
MAX_QUOTA = 1_000_000
MAX_QUOTA_ENTRIES = 64
API_KEY_PREFIX = "igak_"
KEY_ID_PREFIX = "key-"
BOOTSTRAP_ACCOUNT = "operator"  # the account the Master creates at first start; legacy keys naming none belong to it
API_KEY_CACHE_S = 10.0  # how long a checked API key is trusted without reading the store again
MAX_KEYS_PER_ACCOUNT = 20  # keys not revoked an account may hold (MasterConfig.api_keys_per_account)
API_KEY_CACHE_SIZE = 10_000  # keys remembered at most (the cache starts over when full)


class AccountRole(str, Enum):
    OPERATOR = "operator"
    PROVIDER = "provider"
    RENTER = "renter"


ROLES = tuple(r.value for r in AccountRole)


class AccountChange(msgspec.Struct, kw_only=True):
    """What an operator may change on an account; a field left UNSET is left as it is."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    role: str | msgspec.UnsetType = msgspec.UNSET  # the account's keys take the new role on their next call
    disabled: bool | msgspec.UnsetType = msgspec.UNSET
    share: float | msgspec.UnsetType = msgspec.UNSET
    project_shares: dict[str, float] | msgspec.UnsetType = msgspec.UNSET
    gpu_quota: int | None | msgspec.UnsetType = msgspec.UNSET  # None: no limit
    tier_quotas: dict[str, int] | msgspec.UnsetType = msgspec.UNSET


@dataclass(frozen=True)
class Credential:
    """What checking a key found: the key, and its account (None for a legacy key, or an account that is gone)."""

    key: ApiKeyRecord
    account: AccountRecord | None


@dataclass(frozen=True)
class IssuedKey:
    key: str  # shown once; only its hash is stored
    record: ApiKeyRecord


def check_account(rec: AccountRecord) -> None:
    """InvalidAccount naming the first field that breaks a rule."""
    if not _ACCOUNT_ID.match(rec.id):
        raise InvalidAccount(
            f"id: {rec.id!r} is not an account id: 1 to 63 lowercase letters, digits and '-', starting with a letter or digit"
        )
    if rec.role not in ROLES:
        raise InvalidAccount(f"role: {rec.role!r} is not one of: {', '.join(ROLES)}")
    if len(rec.name) > MAX_NAME:
        raise InvalidAccount(f"name: {len(rec.name)} characters long; at most {MAX_NAME}")
    _check_weight("share", rec.share)
    _check_entries("project_shares", rec.project_shares)
    for project, weight in rec.project_shares.items():
        _check_weight(f"project_shares[{project!r}]", weight)
    if rec.gpu_quota is not None:
        _check_quota("gpu_quota", rec.gpu_quota)
    _check_entries("tier_quotas", rec.tier_quotas)
    for tier, quota in rec.tier_quotas.items():
        _check_quota(f"tier_quotas[{tier!r}]", quota)


def _check_weight(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidAccount(f"{field}: must be a finite number")
    if not 0 < value <= MAX_SHARE:
        raise InvalidAccount(f"{field}: {value} is not a weight; it must be greater than 0 and at most {MAX_SHARE:g}")


def _check_quota(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA:
        raise InvalidAccount(f"{field}: {value!r} is not a quota; it must be a whole number of GPUs from 0 to {MAX_QUOTA}")


def _check_entries(field: str, entries: Mapping[str, object]) -> None:
    if len(entries) > MAX_QUOTA_ENTRIES:
        raise InvalidAccount(f"{field}: {len(entries)} entries; at most {MAX_QUOTA_ENTRIES}")
    for name in entries:
        if not name or len(name) > 64:
            raise InvalidAccount(f"{field}: every name must be 1 to 64 characters long")


class AccountBook:
    """Accounts and API keys in the store, and the cache of checked keys."""

    def __init__(self, store: Store, *, max_keys: int = MAX_KEYS_PER_ACCOUNT) -> None:
        self._store = store
        self._max_keys = max_keys
        self._issuing = asyncio.Lock()  # one key issued at a time, so concurrent requests cannot pass the cap together
        self._checked: dict[str, tuple[Credential, float]] = {}  # key hash -> (credential, until when it is trusted)
        self._checked_accounts: dict[str, tuple[AccountRecord, float]] = {}  # id -> (account, until when trusted)

    # --- accounts ------------------------------------------------------------------------------

    async def create(self, rec: AccountRecord) -> AccountRecord:
        """Add a new account; Conflict when its id is taken."""
        rec = msgspec.structs.replace(rec, created_at=rec.created_at or time.time())
        check_account(rec)
        if not await self._store.accounts.add(rec):
            raise Conflict(f"account {rec.id!r} already exists; choose another id, or PATCH that account")
        return rec

    async def ensure(self, account_id: str, role: AccountRole, name: str = "") -> AccountRecord:
        """The account, created with ``role`` if it does not exist (left as it is if it does)."""
        found = await self._store.accounts.get(account_id)
        if found is not None:
            return found
        rec = AccountRecord(id=account_id, role=role.value, name=name, created_at=time.time())
        check_account(rec)
        if await self._store.accounts.add(rec):
            return rec
        # Taken meanwhile by a concurrent ensure, or there but unreadable (quarantined, reported): left as it is.
        return await self._store.accounts.get(account_id) or rec

    async def get(self, account_id: str) -> AccountRecord:
        found = await self._store.accounts.get(account_id)
        if found is None:
            raise NotFound(f"no account {account_id!r}")
        return found

    async def checked(self, account_id: str) -> AccountRecord:
        """The account as a credential's check reads it (an endpoint's invocation key checks its owner's at every
        request): remembered for ``API_KEY_CACHE_S`` like a checked key, and forgotten at once when this Master changes
        it. NotFound for no such account (never remembered)."""
        now = time.monotonic()
        cached = self._checked_accounts.get(account_id)
        if cached is not None and cached[1] > now:
            return cached[0]
        found = await self.get(account_id)
        if len(self._checked_accounts) >= API_KEY_CACHE_SIZE:
            self._checked_accounts.clear()
        self._checked_accounts[account_id] = (found, now + API_KEY_CACHE_S)
        return found

    async def list(self, *, role: str | None = None, after: str | None = None, limit: int = 1000) -> builtins.list[AccountRecord]:
        return await self._store.accounts.list(role=role, after=after, limit=limit)

    async def update(self, account_id: str, change: AccountChange) -> AccountRecord:
        """Apply ``change``; the account's keys are checked afresh on their next use (disabling takes effect at once)."""
        current = await self.get(account_id)
        fields = {k: v for k, v in msgspec.structs.asdict(change).items() if v is not msgspec.UNSET}
        updated = msgspec.structs.replace(current, **fields, updated_at=time.time())
        check_account(updated)
        await self._store.accounts.put(updated)
        self._forget_account(account_id)
        return updated

    async def require_provider(self, account_id: str) -> AccountRecord:
        """The enabled provider account ``account_id``; InvalidAccount saying what is wrong otherwise."""
        found = await self._store.accounts.get(account_id)
        if found is None:
            raise InvalidAccount(
                f"provider: no account {account_id!r}; create it first (idlegrid account create {account_id} --role provider)"
            )
        if found.role != AccountRole.PROVIDER.value:
            raise InvalidAccount(f"provider: account {account_id!r} is a {found.role} account, not a provider")
        if found.disabled:
            raise InvalidAccount(f"provider: account {account_id!r} is disabled; enable it before enrolling hosts for it")
        return found

    # --- passwords (the console's sign-in, master/passwords.py) --------------------------------------

    async def set_password(self, account_id: str, password: str, *, current_password: str | None = None) -> AccountRecord:
        """Set the account's password and move its epoch on (every console session of it ends). With
        ``current_password`` given, it must match the password set now (an account changing its own)."""
        account = await self.get(account_id)
        if current_password is not None and account.password_hash:
            if not await asyncio.to_thread(password_matches, account.password_hash, current_password):
                raise InvalidPassword("current_password: does not match the account's password")
        new_hash = await asyncio.to_thread(hash_password, password)
        account = await self.get(account_id)  # read again: what changed while hashing is kept
        updated = msgspec.structs.replace(
            account, password_hash=new_hash, password_epoch=account.password_epoch + 1, updated_at=time.time()
        )
        await self._store.accounts.put(updated)
        self._forget_account(account_id)
        return updated

    async def sign_in(self, account_id: str, password: str) -> AccountRecord:
        """The account whose password this is; SignInRefused (one message for every reason) otherwise. A disabled
        account with the right password is refused too, and only then told so."""
        account = await self._store.accounts.get(account_id) if _ACCOUNT_ID.match(account_id) else None
        stored = account.password_hash if account is not None else ""
        matched = await asyncio.to_thread(password_matches, stored, password)  # the same work whatever was found
        if account is None or not matched:
            raise SignInRefused("wrong account or password")
        if account.disabled:
            raise SignInRefused(f"account {account.id!r} is disabled; an operator can enable it")
        return account

    # --- keys ----------------------------------------------------------------------------------

    async def create_key(self, account_id: str, name: str) -> IssuedKey:
        """A new key for an existing, enabled account that holds fewer than ``max_keys`` keys not revoked (Conflict
        otherwise: keys are what the API's per-key rate limit counts, so minting them must not be free); the key is
        returned once and stored hashed."""
        async with self._issuing:
            return await self._create_key(account_id, name)

    async def _create_key(self, account_id: str, name: str) -> IssuedKey:
        account = await self.get(account_id)
        if account.disabled:
            raise Conflict(f"account {account_id!r} is disabled; enable it before issuing it keys")
        active = sum(1 for key in await self._store.api_keys.list(subject=account_id) if key.revoked_at is None)
        if active >= self._max_keys:
            raise Conflict(
                f"account {account_id!r} holds {active} API keys, the most an account may (api_keys_per_account); "
                "revoke one it no longer uses first"
            )
        key = API_KEY_PREFIX + secrets.token_urlsafe(32)
        record = ApiKeyRecord(
            key_hash=hash_secret(key),
            name=name,
            role="",  # the account's role counts, read at every check
            created_at=time.time(),
            subject=account_id,
            key_id=KEY_ID_PREFIX + secrets.token_hex(8),
        )
        await self._store.api_keys.put(record)
        return IssuedKey(key, record)

    async def create_legacy_key(self, name: str, role: str = AccountRole.OPERATOR.value) -> str:
        """A key naming no account (what the Master issued before accounts): it works as ``role`` (the operator)."""
        key = API_KEY_PREFIX + secrets.token_urlsafe(32)
        await self._store.api_keys.put(ApiKeyRecord(key_hash=hash_secret(key), name=name, role=role, created_at=time.time()))
        return key

    async def adopt_legacy_keys(self) -> int:
        """Give operator keys from before accounts (no account, role operator) to the bootstrap account, each with a
        key id, so they are listed and can be revoked like any other; they keep working as the operator. Returns how
        many were adopted. Keys naming no account with another role stay as they are (and are refused)."""
        adopted = 0
        for key in await self._store.api_keys.list(subject=""):
            if key.role == AccountRole.OPERATOR.value and not key.key_id and key.revoked_at is None:
                key_id = KEY_ID_PREFIX + secrets.token_hex(8)
                await self._store.api_keys.put(msgspec.structs.replace(key, subject=BOOTSTRAP_ACCOUNT, key_id=key_id))
                self._checked.pop(key.key_hash, None)
                adopted += 1
        return adopted

    async def keys(self, account_id: str) -> builtins.list[ApiKeyRecord]:
        await self.get(account_id)
        return await self._store.api_keys.list(subject=account_id)

    async def key(self, key_id: str) -> ApiKeyRecord:
        found = await self._store.api_keys.by_key_id(key_id)
        if found is None:
            raise NotFound(f"no API key {key_id!r}")
        return found

    async def revoke_key(self, key_id: str) -> ApiKeyRecord:
        """Refuse the key from now on (on this Master at once). Revoking a revoked key changes nothing."""
        found = await self.key(key_id)
        if found.revoked_at is None:
            found = msgspec.structs.replace(found, revoked_at=time.time())
            await self._store.api_keys.put(found)
        self._checked.pop(found.key_hash, None)
        return found

    async def credential(self, key: str) -> Credential:
        """The key's record and account; NotFound for a key never issued. Revoked keys and disabled accounts are
        returned as they are: refusing them is the API's decision (management/api/auth.py)."""
        key_hash = hash_secret(key)
        now = time.monotonic()
        cached = self._checked.get(key_hash)
        if cached is not None and cached[1] > now:
            return cached[0]
        record = await self._store.api_keys.get(key_hash)
        if record is None:
            self._checked.pop(key_hash, None)  # unknown keys are never remembered: nothing a caller invents is
            raise NotFound("unknown API key")
        if record.revoked_at is None:
            await self._store.api_keys.mark_used(key_hash, time.time())
        account = await self._store.accounts.get(record.subject) if record.subject else None
        credential = Credential(record, account)
        if len(self._checked) >= API_KEY_CACHE_SIZE:
            self._checked.clear()
        self._checked[key_hash] = (credential, now + API_KEY_CACHE_S)
        return credential

    def _forget_account(self, account_id: str) -> None:
        self._checked_accounts.pop(account_id, None)
        for key_hash in [h for h, (c, _) in self._checked.items() if c.key.subject == account_id]:
            del self._checked[key_hash]
