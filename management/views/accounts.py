"""Accounts and API keys (never a key's secret after it is issued, never its hash), and whoami."""

from __future__ import annotations

from management.views.base import StructFields, Time, View, page_of, rfc3339
from master.port import (
    AccountRecord,
    ApiKeyRecord,
)


class AccountView(View):
    id: str
    role: str
    name: str
    disabled: bool
    created_at: Time | None
    updated_at: Time | None
    share: float
    project_shares: dict[str, float]
    gpu_quota: int | None
    tier_quotas: dict[str, int]


class ApiKeyView(View):
    key_id: str
    account: str
    name: str
    created_at: Time | None
    last_used: Time | None
    revoked_at: Time | None


class IssuedApiKeyView(ApiKeyView):
    key: str  # shown this once


class WhoamiView(View):
    account: str
    role: str
    key_id: str
    key_name: str
    name: str


AccountPage = page_of(AccountView)


ApiKeyPage = page_of(ApiKeyView)


def account_view(account: AccountRecord) -> AccountView:
    return AccountView(
        id=account.id,
        role=account.role,
        name=account.name,
        disabled=account.disabled,
        created_at=rfc3339(account.created_at),
        updated_at=rfc3339(account.updated_at or None),
        share=account.share,
        project_shares=account.project_shares,
        gpu_quota=account.gpu_quota,
        tier_quotas=account.tier_quotas,
    )


def _key_fields(key: ApiKeyRecord) -> StructFields:
    """Never the key, never its hash."""
    return {
        "key_id": key.key_id,
        "account": key.subject,
        "name": key.name,
        "created_at": rfc3339(key.created_at),
        "last_used": rfc3339(key.last_used),
        "revoked_at": rfc3339(key.revoked_at),
    }


def api_key_view(key: ApiKeyRecord) -> ApiKeyView:
    return ApiKeyView(**_key_fields(key))


def issued_api_key_view(key: str, record: ApiKeyRecord) -> IssuedApiKeyView:
    """The key itself is shown this once; only its hash is kept."""
    return IssuedApiKeyView(key=key, **_key_fields(record))


def whoami_view(account: str, role: str, key_id: str, key_name: str, name: str) -> WhoamiView:
    return WhoamiView(account=account, role=role, key_id=key_id, key_name=key_name, name=name)
