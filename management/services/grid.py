"""The grid's control plane as the operator sees it: commands, events, join tokens, command-signing keys, tiers,
revoked certificates and the Master's health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec

from common.containers import WireSpec
from management.services.models import KeyText, Page, Position, PositionKey, page_of, positioned_page
from master.port import (
    CommandRecord,
    EventRecord,
    MasterPort,
    RevocationRecord,
    SigningKeyInfo,
    TierJson,
    TokenRecord,
    command_spec,
    describe_tiers,
)

# A page of commands is found by reading the newest ones until the cursor's position; the window grows by this
# factor while the position lies beyond it (the store lists commands newest first, with a limit but no cursor).
COMMAND_WINDOW_GROWTH = 4


class CommandKey(msgspec.Struct, array_like=True, frozen=True):
    created_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)]
    id: KeyText
    depth: Position  # how many commands the previous page's read went through: where the next read starts looking


class SeqKey(msgspec.Struct, array_like=True, frozen=True):
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once; only its hash is stored
    record: TokenRecord


@dataclass(frozen=True)
class Health:
    store: str
    relays: list[str]
    # High availability (docs/ha.md): leader | standby | stepped_down, and the leader's API URL when another leads.
    role: str = "leader"
    leader: str = ""
    ready: bool = True  # it serves: leads, and has loaded the state it took over


class GridService:
    def __init__(self, master: MasterPort) -> None:
        self._master = master

    # --- tiers ------------------------------------------------------------------------------------------------------

    def list_tiers(self, *, after: PositionKey | None = None, limit: int) -> Page[TierJson]:
        """Tiers in the policy's order (the order is meaningful: best first); the key is the position. Each tier is
        a JSON view (its criteria are the policy file's, open)."""
        return positioned_page(describe_tiers(self._master.policy), after, limit)

    # --- commands ---------------------------------------------------------------------------------------------------

    async def create_command(self, agent_id: str, kind: str, spec: WireSpec, *, timeout_s: float | None) -> CommandRecord:
        """A raw command: ``spec`` (the request's JSON, open until here) becomes the typed body of ``kind`` once,
        here; InvalidCommand names the field that is wrong. An unknown host (404) or one that takes no commands
        (409) is said first, as the command ledger always has."""
        self._master.check_command_target(agent_id)
        return await self._master.create_command(agent_id, command_spec(kind, spec), timeout_s=timeout_s)

    async def get_command(self, command_id: str, *, wait_s: float = 0.0) -> CommandRecord:
        return await self._master.command(command_id, wait_s=wait_s)

    async def list_commands(
        self,
        *,
        agent_id: str | None = None,
        states: list[str] | None = None,
        after: CommandKey | None = None,
        limit: int,
    ) -> Page[CommandRecord]:
        """Newest first, by (created_at, id) descending. New commands are created at the head, so they never shift
        a page that is under way; a deep page reads the store from the head to its position (see docs/api.md)."""
        start = (after.created_at, after.id) if after else None
        window = limit + 1 + (after.depth if after else 0)
        while True:
            records = await self._master.list_commands(agent_id=agent_id, states=states, limit=window)
            older = [r for r in records if start is None or (r.created_at, r.id) < start]
            if len(older) > limit or len(records) < window:
                break
            window *= COMMAND_WINDOW_GROWTH
        skipped = len(records) - len(older)
        return page_of(older[: limit + 1], limit, lambda r: CommandKey(r.created_at, r.id, skipped + limit))

    # --- events -----------------------------------------------------------------------------------------------------

    async def list_events(
        self, *, subject: str | None = None, kind: str | None = None, after_seq: int = 0, limit: int
    ) -> Page[EventRecord]:
        events = await self._master.events_after(subject=subject, kind_prefix=kind, after_seq=after_seq, limit=limit + 1)
        return page_of(events, limit, lambda e: SeqKey(e.seq))

    # --- join tokens ------------------------------------------------------------------------------------------------

    async def create_token(self, provider: str, ttl_s: float | None) -> IssuedToken:
        token, record = await self._master.create_token(provider, ttl_s)
        return IssuedToken(token, record)

    # --- command-signing keys and revoked certificates --------------------------------------------------------------

    def list_signing_keys(self, *, after: PositionKey | None = None, limit: int) -> Page[SigningKeyInfo]:
        """Newest first, as the key ring describes them; the key is the position in that order (keys are few and
        only ever added, at the head, so a rotation during paging repeats at most one key)."""
        return positioned_page(self._master.signing_keys(), after, limit)

    async def rotate_signing_key(self) -> SigningKeyInfo:
        return await self._master.rotate_signing_key()

    async def retire_signing_key(self, key_id: str) -> SigningKeyInfo:
        return await self._master.retire_signing_key(key_id)

    async def list_revocations(self) -> list[RevocationRecord]:
        """Every revoked certificate with its host and why, newest first (revocations are few: kept whole)."""
        found = await self._master.store.revocations.list()
        return sorted(found, key=lambda r: (r.revoked_at, r.serial), reverse=True)

    # --- health -----------------------------------------------------------------------------------------------------

    def health(self) -> Health:
        leadership = self._master.leadership
        return Health(
            store=self._master.store.backend,
            relays=sorted(self._master.hub.links),
            role=self._master.role,
            ready=self._master.serves(),
            leader=leadership.leader_api_url() if leadership is not None else "",
        )
