"""Money in: a renter's top-up through the payment provider, and the provider's signed webhook that credits it.

``create`` checks the amount (management/payments/topups.py), opens the payment on the provider (whose hosted step the
renter pays on: no card data reaches the grid) and keeps the top-up ``pending``. ``receive`` verifies a webhook
delivery over its raw bytes (InvalidWebhook: nothing of it is believed), answers a delivery of an event already acted
on from the store (``payment_events``) without acting again, and otherwise carries out ``judge``'s verdict: a credit
under the ledger key ``topup:<id>`` (idempotent: an event re-sent after a crash between the credit and the event's
record credits nothing), the top-up marked failed, or nothing. Deliveries are handled one at a time (``_lock``), so a
top-up's record is written by one of them at a time. ``catch_up`` (run every ``payment_catch_up_s`` while the Master
serves) reads the provider's recent events from its API and acts on each the same way: what a webhook missed during an
outage is credited then, and what a webhook brought is answered as replayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from common.errors import Conflict, NotFound
from management.market.ledger import LedgerBook
from management.market.money import format_amount
from management.payments.provider import (
    PaymentDeclined,
    PaymentEvent,
    PaymentProvider,
    PaymentProviderError,
    SavedMethod,
    TopupFailed,
    TopupPaid,
    TopupRequest,
    TopupStart,
)
from management.payments.records import (
    TOPUP_FAILED,
    EventOutcome,
    PaymentEventRecord,
    TopupRecord,
    event_key,
    new_topup_id,
)
from management.payments.topups import (
    Credit,
    Ignore,
    MarkFailed,
    PaymentsNotConfigured,
    Refuse,
    TopupLimits,
    Verdict,
    check_topup,
    judge,
)
from management.store.payments import PaymentEventRepo, TopupRepo
from master.port import Loop, MasterPort, stop_loop

log = logging.getLogger(__name__)

TOPUPS_LISTED = 100
AUTO_TOPUP_FAILED_EVENT = "payments.auto_topup_failed"


@dataclass(frozen=True)
class StartedTopup:
    """A top-up just opened, and where the renter pays it (shown once: the client secret is not stored)."""

    topup: TopupRecord
    client_secret: str
    url: str


@dataclass(frozen=True)
class WebhookReceipt:
    """What one verified delivery did: its event, the outcome, and whether the event had been acted on before."""

    event_id: str
    kind: str
    outcome: EventOutcome
    topup_id: str
    replayed: bool


class TopupService:
    def __init__(
        self,
        master: MasterPort,
        provider: PaymentProvider | None,
        topups: TopupRepo,
        events: PaymentEventRepo,
        ledger: LedgerBook,
        *,
        currency: str,
        limits: TopupLimits,
        catch_up_s: float = 300.0,
        catch_up_window_s: float = 3 * 86400.0,
        restart_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._master = master
        self._provider = provider
        self._topups = topups
        self._events = events
        self._ledger = ledger
        self.currency = currency
        self.limits = limits
        self._clock = clock
        self._lock = asyncio.Lock()
        self._catch_up_s = catch_up_s
        self._catch_up_window_s = catch_up_window_s
        self._restart_s = restart_s
        self._task: asyncio.Task[None] | None = None
        self._failed_auto: dict[str, TopupRecord] = {}  # renter -> its latest auto top-up, which failed

    def _configured(self) -> PaymentProvider:
        if self._provider is None:
            raise PaymentsNotConfigured(
                "this grid takes no payments: its operator sets payment_provider (and the provider's secrets) in the "
                "Master's configuration; until then balances are credited by an operator"
            )
        return self._provider

    # --- renters -------------------------------------------------------------------------------------------------

    async def create(self, account_id: str, amount: int) -> StartedTopup:
        """Open a top-up of ``amount`` micro-units for renter ``account_id``."""
        provider = self._configured()
        account = await self._master.accounts.get(account_id)  # NotFound for no such account
        if account.role != "renter":
            raise Conflict(f"account {account_id!r} is a {account.role}; only renters top up a balance")
        check_topup(amount, self.currency, self.limits)
        topup_id = new_topup_id()
        start = await provider.create_topup(
            TopupRequest(topup_id=topup_id, account=account_id, amount=amount, currency=self.currency)
        )
        record = TopupRecord(
            id=topup_id,
            account=account_id,
            amount=amount,
            currency=self.currency,
            provider=provider.name,
            reference=start.reference,
            created_at=self._clock(),
        )
        await self._topups.put(record)
        return StartedTopup(record, start.client_secret, start.url)

    async def charge_saved(self, account_id: str, amount: int, method: SavedMethod) -> TopupRecord:
        """An auto top-up: ``amount`` charged to the renter's saved method with no renter present, kept as a top-up
        (``auto``) credited like any other by the provider's signed event. A charge declined or refused at once is
        kept ``failed`` with the reason, and a ``payments.auto_topup_failed`` event tells the renter."""
        record, _ = await self._charge_saved(account_id, amount, method, auto=True)
        if record.state == TOPUP_FAILED:
            await self._auto_failed(record)
        return record

    async def pay_saved(self, account_id: str, amount: int, method: SavedMethod) -> StartedTopup:
        """A top-up the renter pays now, on the console, with the card it just saved on the provider's element: an
        on-session charge, credited like any other by the provider's signed event. A card that asks its holder to
        authenticate answers a ``client_secret`` for the provider's script; a charge declined at once is kept
        ``failed`` and raised (PaymentDeclined, PaymentProviderError)."""
        record, outcome = await self._charge_saved(account_id, amount, method, auto=False)
        if isinstance(outcome, PaymentProviderError):
            raise outcome
        return StartedTopup(record, outcome.client_secret, outcome.url)

    async def _charge_saved(
        self, account_id: str, amount: int, method: SavedMethod, *, auto: bool
    ) -> tuple[TopupRecord, TopupStart | PaymentProviderError]:
        """Under the deliveries' lock: the provider's event about the charge waits until the top-up naming its
        payment is stored."""
        provider = self._configured()
        check_topup(amount, self.currency, self.limits)
        topup_id = new_topup_id()
        request = TopupRequest(topup_id=topup_id, account=account_id, amount=amount, currency=self.currency)
        now = self._clock()
        record = TopupRecord(
            id=topup_id, account=account_id, amount=amount, currency=self.currency, provider=provider.name,
            reference="", created_at=now, auto=auto,
        )  # fmt: skip
        outcome: TopupStart | PaymentProviderError
        async with self._lock:
            try:
                outcome = await provider.charge_saved(request, method, on_session=not auto)
                record.reference = outcome.reference
            except PaymentProviderError as exc:
                outcome = exc
                record.reference = exc.reference if isinstance(exc, PaymentDeclined) else ""
                record.state, record.reason, record.settled_at = "failed", str(exc)[:500], now
            await self._topups.put(record)
        return record, outcome

    def failed_auto_topups(self) -> dict[str, TopupRecord]:
        """Renters whose latest auto top-up failed, and that top-up (the alert ``auto_topup_failed`` reads it): until
        a later auto top-up is credited or the renter changes its card or auto top-up (``forget_failed_auto``)."""
        return dict(self._failed_auto)

    def forget_failed_auto(self, account_id: str) -> None:
        self._failed_auto.pop(account_id, None)

    async def recall_failed_auto(self, account_id: str) -> None:
        """After a restart: whether the renter's latest auto top-up failed, from the stored top-ups."""
        for topup in await self._topups.list(account=account_id, limit=TOPUPS_LISTED):
            if topup.auto:
                if topup.state == TOPUP_FAILED:
                    self._failed_auto.setdefault(account_id, topup)
                return

    async def _auto_failed(self, record: TopupRecord) -> None:
        self._failed_auto[record.account] = record
        log.warning("auto top-up %s of %s failed: %s", record.id, record.account, record.reason)
        await self._master.record_event(
            AUTO_TOPUP_FAILED_EVENT,
            record.account,
            topup=record.id,
            amount=format_amount(record.amount),
            currency=record.currency,
            reason=record.reason,
        )

    async def list_topups(self, *, owner: str | None, account: str | None = None) -> list[TopupRecord]:
        """The newest top-ups: the caller's own (``owner``), or any account's for the operator (``account`` filters)."""
        if owner is not None:
            account = owner
        return await self._topups.list(account=account, limit=TOPUPS_LISTED)

    async def get(self, topup_id: str, *, owner: str | None) -> TopupRecord:
        found = await self._topups.get(topup_id)
        if found is None or (owner is not None and found.account != owner):
            raise NotFound(f"no top-up {topup_id!r}")
        return found

    # --- the provider's webhook ----------------------------------------------------------------------------------

    async def receive(self, payload: bytes, signature: str) -> WebhookReceipt:
        """Verify one webhook delivery and act on its event once (InvalidWebhook: nothing read, nothing changed)."""
        provider = self._configured()
        return await self._act(provider, provider.verify_event(payload, signature))

    async def catch_up(self, since: float) -> list[WebhookReceipt]:
        """Act on the provider's top-up events since unix time ``since`` that no webhook brought (a Master down, a
        network cut): read from the provider's API, each acted on once like a delivery (``replayed`` when it was)."""
        provider = self._configured()
        return [await self._act(provider, event) for event in await provider.events_since(since)]

    def start(self) -> None:
        """Run ``catch_up`` over the last ``catch_up_window_s`` every ``catch_up_s`` (nothing without a provider)."""
        if self._provider is not None and self._task is None:
            self._task = Loop("payments catch-up", self._catch_up_s, self._catch_up_step, self._restart_s).start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None

    async def _catch_up_step(self) -> None:
        receipts = await self.catch_up(self._clock() - self._catch_up_window_s)
        acted = [r for r in receipts if not r.replayed]
        if acted:
            log.warning("payments catch-up: %d events no webhook brought were acted on", len(acted))

    async def _act(self, provider: PaymentProvider, event: PaymentEvent) -> WebhookReceipt:
        key = event_key(provider.name, event.event_id)
        topup_id = event.topup_id if isinstance(event, TopupPaid | TopupFailed) else ""
        async with self._lock:
            seen = await self._events.get(key)
            if seen is not None:
                return WebhookReceipt(event.event_id, event.kind, seen.outcome, seen.topup_id, replayed=True)
            topup = await self._topups.get(topup_id) if topup_id else None
            outcome, detail = await self._carry_out(judge(event, topup, self.currency), event)
            record = PaymentEventRecord(
                id=key,
                provider=provider.name,
                event_id=event.event_id,
                kind=event.kind,
                received_at=self._clock(),
                outcome=outcome,
                topup_id=topup.id if topup is not None else "",
                detail=detail,
            )
            await self._events.insert(record)
        return WebhookReceipt(event.event_id, event.kind, outcome, record.topup_id, replayed=False)

    async def _carry_out(self, verdict: Verdict, event: PaymentEvent) -> tuple[EventOutcome, str]:
        match verdict:
            case Credit(topup=topup, amount=amount, key=key):
                memo = f"top-up {topup.id} ({topup.provider} {topup.reference})"
                try:
                    await self._ledger.credit(topup.account, amount, memo, key=key, kind="topup")
                except Conflict:
                    return await self._refuse(Refuse(topup, f"top-up {topup.id} was credited another amount already"), event)
                if topup.auto:
                    self._failed_auto.pop(topup.account, None)
                if topup.state != "credited":  # credited before (another event of one payment): told once
                    settled = msgspec.structs.replace(
                        topup, state="credited", credited=amount, ledger_key=key, event_id=event.event_id
                    )
                    settled.settled_at = self._clock()
                    await self._topups.put(settled)
                    await self._master.record_event(
                        "payments.topup_credited",
                        topup.account,
                        topup=topup.id,
                        amount=format_amount(amount),
                        currency=self.currency,
                        provider=topup.provider,
                    )
                return "credited", f"{format_amount(amount)} {self.currency}"
            case MarkFailed(topup=topup, reason=reason):
                failed = msgspec.structs.replace(
                    topup, state="failed", reason=reason[:500], event_id=event.event_id, settled_at=self._clock()
                )
                await self._topups.put(failed)
                await self._master.record_event("payments.topup_failed", topup.account, topup=topup.id, reason=reason[:500])
                if failed.auto:
                    await self._auto_failed(failed)
                return "failed", reason[:500]
            case Refuse():
                return await self._refuse(verdict, event)
            case Ignore(reason=reason):
                return "ignored", reason
        raise AssertionError(f"unhandled verdict {verdict!r}")  # every verdict is matched above

    async def _refuse(self, verdict: Refuse, event: PaymentEvent) -> tuple[EventOutcome, str]:
        log.error(
            "payment event refused: nothing credited, an operator must look",
            extra={"event": event.event_id, "topup": verdict.topup.id, "reason": verdict.reason},
        )
        await self._master.record_event(
            "payments.event_refused", verdict.topup.account, topup=verdict.topup.id, event=event.event_id, reason=verdict.reason
        )
        return "refused", verdict.reason
