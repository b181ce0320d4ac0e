"""A console write is an audit event naming the account, as an API write is (management/api/audit.py): the route's
pattern, what it changed and the answer's status; key id "" (a session, not a key)."""

from __future__ import annotations

from aiohttp import web

from management.access_control import Scope
from management.http.keys import SERVICES_KEY
from management.services.accounts import AuditEntry


async def record_write(request: web.Request, scope: Scope, status: int, target: str) -> None:
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else request.path
    entry = AuditEntry(
        account=scope.principal.account, key_id="", role=scope.principal.role.value, method=request.method,
        route=route, target=target, status=status,
    )  # fmt: skip
    await request.app[SERVICES_KEY].accounts.record_audit(entry)
