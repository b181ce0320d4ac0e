"""HTTPS links to workloads' http ports (the links service, docs/links.md): the links a workload has, link tokens,
who a visitor is, whether it may pass (management/links/gate.py), and the tunnels the proxy sends requests through.

A link is served by the Master through a renter-access ``port`` tunnel (management/services/tunnels.py), so the owner
check, the ticket and the ``tunnel.opened`` event are the tunnels service's, and the agent checks the port against the
ones its create command declared. One tunnel per link is shared by its requests (management/links/tunnels.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import IdlegridError, NotFound
from management.client.tunnel import TunnelGrant
from management.links.gate import Admitted, Refused, Visitor, admit, declared_link
from management.links.names import LinkAddress, check_token, endpoint_url, is_link_token, link_url, mint_token
from management.links.tunnels import LinkTunnels
from management.services.accounts import AccountsService
from management.services.tunnels import RenterAccess, TunnelRequest
from master.port import LinkSettings, Loop, WorkloadRecord, stop_loop

KEY_FILE = "link-tokens.key"
SWEEP_PERIOD_S = 30.0  # how often idle link tunnels are looked for; well under any sensible idle_close_s
SWEEP_RESTART_S = 5.0


class InvalidLink(IdlegridError):
    """A link request that cannot be served as asked (the request's fault: 400)."""

    code = "invalid_link"


@dataclass(frozen=True)
class WorkloadLink:
    """One of a workload's links: its http port, the URL it is served at, and whether it opens without a token."""

    port: int
    url: str
    public: bool


@dataclass(frozen=True)
class IssuedLinkToken:
    """A link token minted for one link: ``url`` opens the link with it in a browser (it becomes a cookie there)."""

    token: str
    url: str
    expires_at: float


class LinksService:
    """``Services.links``."""

    def __init__(
        self,
        workloads: Callable[..., Awaitable[WorkloadRecord]],
        access: RenterAccess,
        accounts: AccountsService,
        settings: LinkSettings,
        *,
        public_url: str,
        key: bytes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._workload = workloads  # WorkloadsService.get_workload: 404 for another account's
        self._access = access
        self._accounts = accounts
        self.settings = settings
        self.public_url = settings.public_url or public_url
        self._key = key
        self._clock = clock
        self.tunnels = LinkTunnels(
            self._grant,
            connections=settings.connections_per_link,
            idle_close_s=settings.idle_close_s,
            bytes_per_s=settings.bytes_per_s,
        )
        # Swept at least twice per idle time, so a link is closed between one and one and a half of it after its last use.
        self._sweeper = Loop("link tunnels", min(SWEEP_PERIOD_S, settings.idle_close_s / 2), self._sweep, SWEEP_RESTART_S)
        self._task: asyncio.Task[None] | None = None

    def listening_at(self, links_url: str) -> None:
        """The links listener's address once it listens: path links are under it unless ``public_url`` is configured."""
        self.public_url = self.settings.public_url or links_url

    # --- what a workload's links are -----------------------------------------------------------------------------

    def url(self, address: LinkAddress) -> str:
        s = self.settings
        return link_url(address, public_url=self.public_url, domain=s.domain, scheme=s.scheme)

    def endpoint_url(self, endpoint_id: str) -> str:
        """A load-balanced endpoint's URL (its requests go to its ready workers: management/links/endpoint_proxy.py)."""
        return endpoint_url(endpoint_id, public_url=self.public_url)

    def links_of(self, workload: WorkloadRecord) -> list[WorkloadLink]:
        return [
            WorkloadLink(port=link.port, url=self.url(LinkAddress(workload.id, link.port)), public=link.public)
            for link in workload.spec.links
            if link.kind == "http"
        ]

    async def list_links(self, workload_id: str, *, owner: str | None) -> list[WorkloadLink]:
        return self.links_of(await self._workload(workload_id, account=owner))

    async def mint(
        self, workload_id: str, port: int, *, account: str, owner: str | None, ttl_s: float | None = None
    ) -> IssuedLinkToken:
        """A token that opens ``workload_id``'s link on ``port`` for ``account`` (its owner or an operator)."""
        workload = await self._workload(workload_id, account=owner)
        if declared_link(workload, port) is None:
            ports = ", ".join(str(v.port) for v in self.links_of(workload)) or "none"
            raise InvalidLink(f"port: workload {workload_id} has no http link on port {port} (its links: {ports})")
        ttl = self.settings.browser_token_s if ttl_s is None else ttl_s
        if not 60 <= ttl <= self.settings.max_token_s:
            raise InvalidLink(f"ttl_s: a link token lasts 60 to {self.settings.max_token_s:.0f} seconds, not {ttl:g}")
        expires_at = self._clock() + ttl
        address = LinkAddress(workload.id, port)
        return IssuedLinkToken(
            token=mint_token(self._key, account, address, expires_at), url=self.url(address), expires_at=expires_at
        )

    # --- who is at the door -----------------------------------------------------------------------------------------

    async def visitor(self, credential: str, address: LinkAddress) -> Visitor:
        """The account ``credential`` (a link token or an API key) acts for at ``address``; InvalidCredential."""
        if is_link_token(credential):
            try:
                account_id = check_token(self._key, credential, address, self._clock())
            except IdlegridError as exc:
                raise InvalidCredential(str(exc)) from None
        else:
            try:
                found = await self._accounts.credential(credential)
            except NotFound:
                raise InvalidCredential("API key not recognised") from None
            if found.key.revoked_at is not None:
                raise InvalidCredential(f"API key {found.key.key_id} was revoked")
            if not found.key.subject:  # a legacy operator key names no account
                return Visitor(account="", operator=found.key.role == "operator")
            account_id = found.key.subject
        try:
            account = await self._accounts.get_account(account_id)
        except NotFound:
            raise InvalidCredential(f"account {account_id!r} no longer exists") from None
        if account.disabled:
            raise InvalidCredential(f"account {account_id!r} is disabled")
        return Visitor(account=account.id, operator=account.role == "operator")

    async def admit(self, address: LinkAddress, visitor: Visitor | None) -> Admitted | Refused:
        try:
            workload: WorkloadRecord | None = await self._workload(address.workload, account=None)
        except NotFound:
            workload = None
        return admit(workload, address.port, visitor)

    # --- the tunnels -------------------------------------------------------------------------------------------------

    async def _grant(self, address: LinkAddress) -> TunnelGrant:
        """A port tunnel to the link's container, asked for by its owner (whose workload the link is)."""
        workload = await self._workload(address.workload, account=None)
        request = TunnelRequest(kind="port", port=address.port)
        return await self._access.open(address.workload, request, account=workload.account, owner=workload.account)

    async def _sweep(self) -> None:
        await self.tunnels.sweep()

    def start(self) -> None:
        self._task = self._sweeper.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_loop(task)
        await self.tunnels.close()


class InvalidCredential(IdlegridError):
    """A credential sent to a link that does not let anyone in (401)."""

    code = "unauthorized"


def link_key(state_dir: Path) -> bytes:
    """The key link tokens are signed with: ``link-tokens.key`` in the Master's state dir, made 0600 on first use, so
    tokens survive a restart (Masters serving one grid together share the file, as the console's session key)."""
    path = state_dir / KEY_FILE
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
    return path.read_bytes()
