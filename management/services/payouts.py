"""Money out: providers' payout accounts, the scheduled payout run of matured earnings, and the daily reconciliation of
the ledger's payouts with the payment provider's transfers (docs/payments.md, "Payout accounts", "Payouts",
"Reconciliation"; the rules are management/payments/payouts.py, pure).

A payout moves in three steps, each written before the next, so a run repeated after a crash at any point pays nothing
twice:

1. the payout record, ``pending``, with its amount (what matured) under its key ``payout:<provider>:<period>``;
2. the transfer, under that key as its idempotency key and group (the adapter finds a transfer made under the key
   before making one), then the record ``transferred``;
3. the ledger entry under the same key (the ledger refuses a key twice), then the record ``paid``.

A run first finishes the unfinished records (the same amount, the same key), then pays each onboarded provider of the
period that has none. The service's lock keeps one run or reconciliation at a time in this Master; the key keeps two
Masters from paying twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.errors import Conflict, NotFound
from management.market.ledger import LedgerBook, provider_account
from management.market.money import format_amount
from management.payments.payouts import (
    Difference,
    PayoutSettings,
    due,
    matured,
    payout_entry,
    payout_key,
    period_label,
    reconcile,
)
from management.payments.provider import OnboardingLink, PaymentProvider, PaymentProviderError, TransferRequest
from management.payments.records import PayoutAccountRecord, PayoutRecord
from management.payments.topups import PaymentsNotConfigured, minor_unit
from management.store.payouts import PayoutAccountRepo, PayoutRepo
from master.port import Loop, MasterPort, stop_loop

log = logging.getLogger(__name__)

PAYOUTS_LISTED = 100
PAGE = 500
PAID_EVENT = "payments.payout_paid"
FAILED_EVENT = "payments.payout_failed"
MISMATCH_EVENT = "payments.payout_mismatch"
TRANSFER_SLACK_S = 86400.0  # transfers are read this much further back than the ledger's entries (a run's length)

# A seam for the crash tests: called after each step of a payout ("made": the transfer made, not yet recorded;
# "transferred": recorded; "posted": the ledger entry posted, the record not yet paid); raising there is a Master dying
# at that point. The composition root passes none.
Checkpoint = Callable[[str, PayoutRecord], Awaitable[None]]


async def _no_checkpoint(step: str, record: PayoutRecord) -> None:
    return None


@dataclass(frozen=True)
class Connected:
    account: PayoutAccountRecord
    link: OnboardingLink | None  # where the owner finishes onboarding (None once it has)


@dataclass(frozen=True)
class Reconciliation:
    at: float
    since: float
    payouts: int  # ledger payouts compared
    transfers: int  # provider transfers read
    differences: list[Difference]


class PayoutService:
    def __init__(
        self,
        master: MasterPort,
        provider: PaymentProvider | None,
        accounts: PayoutAccountRepo,
        payouts: PayoutRepo,
        ledger: LedgerBook,
        *,
        currency: str,
        settings: PayoutSettings,
        restart_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        checkpoint: Checkpoint = _no_checkpoint,
    ) -> None:
        self._master = master
        self._provider = provider
        self._accounts = accounts
        self._payouts = payouts
        self._ledger = ledger
        self.currency = currency
        self.settings = settings
        self._restart_s = restart_s
        self._clock = clock
        self._checkpoint = checkpoint
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_reconciliation: Reconciliation | None = None

    def _configured(self) -> PaymentProvider:
        if self._provider is None:
            raise PaymentsNotConfigured(
                "this grid pays no one through a payment provider: its operator sets payment_provider (and the "
                "provider's secrets) in the Master's configuration"
            )
        return self._provider

    # --- payout accounts -----------------------------------------------------------------------------------------

    async def connect(self, account_id: str, *, return_url: str, refresh_url: str) -> Connected:
        """Make provider ``account_id``'s connected account on the payment provider (once), and a link to its hosted
        onboarding while it is not finished."""
        provider = self._configured()
        account = await self._master.accounts.get(account_id)  # NotFound for no such account
        if account.role != "provider":
            raise Conflict(f"account {account_id!r} is a {account.role}; only providers are paid out")
        async with self._lock:
            record = await self._accounts.get(account_id)
            now = self._clock()
            if record is None:
                made = await provider.create_payout_account(account_id)
                record = PayoutAccountRecord(id=account_id, provider=provider.name, reference=made.reference, created_at=now)
            status = await provider.payout_account(record.reference)
            record.details_submitted, record.payouts_enabled, record.updated_at = (
                status.details_submitted,
                status.payouts_enabled,
                now,
            )
            await self._accounts.put(record)
        link = None
        if not record.payouts_enabled:
            link = await provider.onboarding_link(record.reference, return_url=return_url, refresh_url=refresh_url)
        return Connected(record, link)

    async def payout_account(self, account_id: str, *, refresh: bool = True) -> PayoutAccountRecord:
        """Provider ``account_id``'s payout account, its status read again from the payment provider."""
        record = await self._accounts.get(account_id)
        if record is None:
            raise NotFound(f"account {account_id!r} has connected no payout account")
        if refresh and self._provider is not None:
            status = await self._provider.payout_account(record.reference)
            if (status.details_submitted, status.payouts_enabled) != (record.details_submitted, record.payouts_enabled):
                record.details_submitted, record.payouts_enabled = status.details_submitted, status.payouts_enabled
                record.updated_at = self._clock()
                await self._accounts.put(record)
        return record

    async def payable(self, account_id: str, now: float | None = None) -> int:
        """What provider ``account_id`` may be paid now: its matured earnings."""
        ledger_account = provider_account(account_id)
        entries = await self._ledger.entries([ledger_account])
        at = self._clock() if now is None else now
        return matured(entries, ledger_account, self._ledger.balance(ledger_account), at, self.settings.window_s)

    async def list_payouts(self, *, owner: str | None, account: str | None = None) -> list[PayoutRecord]:
        if owner is not None:
            account = owner
        return await self._payouts.list(account=account, limit=PAYOUTS_LISTED)

    # --- the payout run ------------------------------------------------------------------------------------------

    async def run(self) -> list[PayoutRecord]:
        """Finish every unfinished payout, then pay each onboarded provider's matured earnings for the current period
        (once per period); returns the payouts this run finished."""
        provider = self._configured()
        async with self._lock:
            finished: list[PayoutRecord] = []
            waiting: set[str] = set()
            for record in reversed(await self._payouts.list(unfinished=True, limit=PAGE)):
                done = await self._finish(provider, record)
                if done is None:
                    waiting.add(record.account)
                else:
                    finished.append(done)
            now = self._clock()
            label = period_label(now, self.settings.period)
            for account in await self._all_accounts():
                if account.id in waiting or await self._payouts.get(payout_key(account.id, label)) is not None:
                    continue
                if not account.payouts_enabled and not await self._enabled_now(provider, account):
                    continue
                payable = await self.payable(account.id, now)
                found = due(account.id, payable, self.settings.minimum, label, minor_unit(self.currency))
                if found is None:
                    continue
                record = PayoutRecord(
                    id=found.key, account=account.id, period=label, amount=found.amount, currency=self.currency,
                    destination=account.reference, created_at=now,
                )  # fmt: skip
                await self._payouts.put(record)
                done = await self._finish(provider, record)
                if done is not None:
                    finished.append(done)
            return finished

    async def _finish(self, provider: PaymentProvider, record: PayoutRecord) -> PayoutRecord | None:
        """Carry ``record`` through its remaining steps; None when the payment provider refused (it stays, for the
        next run)."""
        if record.state == "pending":
            request = TransferRequest(
                key=record.id, account=record.account, destination=record.destination, amount=record.amount,
                currency=record.currency,
            )  # fmt: skip
            try:
                made = await provider.transfer(request)
            except PaymentProviderError as exc:
                log.warning("payout %s: the transfer failed, tried again next run: %s", record.id, exc)
                await self._master.record_event(FAILED_EVENT, record.account, payout=record.id, reason=str(exc)[:500])
                return None
            await self._checkpoint("made", record)
            record.state, record.transfer, record.transferred_at = "transferred", made.reference, self._clock()
            await self._payouts.put(record)
            await self._checkpoint("transferred", record)
        if record.state == "transferred":
            memo = f"payout {record.period} ({provider.name} {record.transfer})"
            await self._ledger.post(payout_entry(record.account, record.amount, record.id, self._clock(), memo))
            await self._checkpoint("posted", record)
            record.state, record.paid_at = "paid", self._clock()
            await self._payouts.put(record)
            await self._master.record_event(
                PAID_EVENT, record.account, payout=record.id, amount=format_amount(record.amount), currency=record.currency
            )
        return record

    async def _enabled_now(self, provider: PaymentProvider, account: PayoutAccountRecord) -> bool:
        """Whether an account not onboarded at the last reading is now (its owner finished since)."""
        try:
            status = await provider.payout_account(account.reference)
        except PaymentProviderError as exc:
            log.warning("payout account of %s could not be read: %s", account.id, exc)
            return False
        if status.payouts_enabled != account.payouts_enabled or status.details_submitted != account.details_submitted:
            account.details_submitted, account.payouts_enabled = status.details_submitted, status.payouts_enabled
            account.updated_at = self._clock()
            await self._accounts.put(account)
        return status.payouts_enabled

    async def _all_accounts(self) -> list[PayoutAccountRecord]:
        found: list[PayoutAccountRecord] = []
        after: str | None = None
        while True:
            page = await self._accounts.list(after=after, limit=PAGE)
            found += page
            if len(page) < PAGE:
                return found
            after = page[-1].id

    # --- the reconciliation --------------------------------------------------------------------------------------

    async def reconcile(self) -> Reconciliation:
        """Compare the ledger's payouts of the last ``reconcile_window_s`` with the payment provider's transfers; each
        difference is logged and recorded as a ``payments.payout_mismatch`` event, and the alert rule
        ``payout_unreconciled`` fires while the last reconciliation found any."""
        provider = self._configured()
        async with self._lock:
            now = self._clock()
            since = now - self.settings.reconcile_window_s
            accounts = await self._all_accounts()
            entries = [
                e
                for e in await self._ledger.entries([provider_account(a.id) for a in accounts])
                if e.kind == "payout" and e.ts >= since
            ]
            transfers = await provider.transfers_since(since - TRANSFER_SLACK_S)
            unfinished = {r.id for r in await self._payouts.list(unfinished=True, limit=PAGE)}
            in_span = {e.key for e in entries}
            # A transfer older than the span counts only when its entry is in it (a run that crossed the span's start);
            # one whose payout is still unfinished is the next run's to finish, not a difference.
            transfers = [t for t in transfers if t.key not in unfinished and (t.created >= since or t.key in in_span)]
            differences = reconcile(entries, transfers, {a.reference: a.id for a in accounts})
            report = Reconciliation(now, since, len(entries), len(transfers), differences)
            self.last_reconciliation = report
        for difference in differences:
            log.error(
                "payout reconciliation: the ledger and the payment provider differ",
                extra={"kind": difference.kind, "key": difference.key, "reference": difference.reference},
            )
            await self._master.record_event(
                MISMATCH_EVENT,
                difference.key.split(":")[1] if difference.key.count(":") == 2 else "platform",
                kind=difference.kind,
                key=difference.key,
                ledger=format_amount(difference.ledger),
                provider=format_amount(difference.provider),
                reference=difference.reference,
            )
        return report

    def unreconciled(self) -> int:
        """How many differences the last reconciliation found (the alert's metric; 0 before the first)."""
        return len(self.last_reconciliation.differences) if self.last_reconciliation is not None else 0

    # --- loops ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """The payout run every ``check_s``; the reconciliation ``reconcile_first_s`` after the start, then every
        ``reconcile_s`` (nothing without a provider)."""
        if self._provider is not None and not self._tasks:
            self._tasks = [
                Loop("payout run", self.settings.check_s, self._run_step, self._restart_s).start(),
                Loop(
                    "payout reconciliation",
                    self.settings.reconcile_s,
                    self._reconcile_step,
                    self._restart_s,
                    first_s=min(self.settings.reconcile_first_s, self.settings.reconcile_s),
                ).start(),
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            await stop_loop(task)
        self._tasks = []

    async def _run_step(self) -> None:
        paid = await self.run()
        if paid:
            log.info("payout run: %d payouts made", len(paid))

    async def _reconcile_step(self) -> None:
        await self.reconcile()
