"""A renter's billing settings (docs/payments.md): its saved payment method on the provider, its auto top-up, and (with
spend caps) its limits; and the loop that charges auto top-ups when a balance falls below its threshold.

This service is the one writer of billing records (``_lock``). Card data never reaches it: the renter's browser (or a
test) hands over the provider's token of a payment method, which the provider attaches to the renter's customer there.
The auto top-up loop runs every ``auto_topup_s`` on a serving Master: for each renter whose charge is due
(management/payments/auto_topup.py ``auto_topup_due``), it first stores the try's time (so a crash during the charge
cannot make a second one within the hour), then charges through ``TopupService.charge_saved``, whose record and the
provider's signed event credit it exactly like a top-up the renter opened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec

from common.errors import Conflict
from management.payments.auto_topup import auto_topup_due, check_auto_topup
from management.payments.caps import check_caps
from management.payments.provider import BrowserStep, CardSetup, PaymentProvider, SavedMethod
from management.payments.records import AutoTopup, BillingRecord, SpendCap, TopupRecord
from management.payments.topups import PaymentsNotConfigured, TopupLimits, check_topup
from management.services.topups import StartedTopup, TopupService
from management.store.billing import BillingRepo
from master.port import Loop, MasterPort, stop_loop

log = logging.getLogger(__name__)

PAGE = 200
BalanceLeft = Callable[[str, float], int]  # (renter, now) -> available + held - what ran since the last charges


class BillingSettingsService:
    def __init__(
        self,
        master: MasterPort,
        provider: PaymentProvider | None,
        repo: BillingRepo,
        topups: TopupService,
        balance_left: BalanceLeft,
        *,
        currency: str,
        limits: TopupLimits,
        auto_topup_s: float = 60.0,
        min_interval_s: float = 3600.0,
        restart_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._master = master
        self._provider = provider
        self._repo = repo
        self._topups = topups
        self._balance_left = balance_left
        self.currency = currency
        self.limits = limits
        self._auto_topup_s = auto_topup_s
        self.min_interval_s = min_interval_s
        self._restart_s = restart_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._recalled = False  # the failed auto top-ups were read back from the store (once, after a start)

    # --- reading -------------------------------------------------------------------------------------------------

    async def get(self, account_id: str) -> BillingRecord:
        """The renter's settings (its defaults when it set none); NotFound for no such account, Conflict for one that
        is no renter."""
        await self._renter(account_id)
        found = await self._repo.get(account_id)
        return found if found is not None else BillingRecord(id=account_id)

    def balance_left(self, account_id: str) -> int:
        return self._balance_left(account_id, self._clock())

    # --- writing -------------------------------------------------------------------------------------------------

    async def save_method(self, account_id: str, payment_method: str) -> BillingRecord:
        """Keep the provider's token ``payment_method`` as the renter's method for auto top-ups (replacing one kept
        before); PaymentDeclined / PaymentProviderError when the provider refuses it (nothing changes)."""
        provider = self._configured()
        async with self._lock:
            current = await self.get(account_id)
            saved = await provider.save_method(account_id, current.customer, payment_method)
            self._topups.forget_failed_auto(account_id)  # a new card: the failed charge's alert resolves
            return await self._put(
                current, customer=saved.customer, payment_method=saved.payment_method, payment_method_label=saved.label
            )

    async def start_card_setup(self, account_id: str, amount: int) -> CardSetup:
        """The console's top-up, first step: check ``amount`` (InvalidTopup says why, before any card is asked for) and
        open the saving of a card on the provider, which the provider's script completes in the renter's browser."""
        provider = self._configured()
        check_topup(amount, self.currency, self.limits)
        async with self._lock:
            current = await self.get(account_id)
            setup = await provider.start_card_setup(account_id, current.customer)
            if setup.customer != current.customer:
                await self._put(current, customer=setup.customer)
            return setup

    async def pay_with_new_card(self, account_id: str, amount: int, setup: str) -> StartedTopup:
        """The console's top-up, second step: keep the card the provider saved in setup ``setup`` as the renter's
        payment method (read from the provider's API, never from the browser), then charge ``amount`` to it now
        (``TopupService.pay_saved``). The balance grows when the provider's signed event says the money arrived."""
        provider = self._configured()
        check_topup(amount, self.currency, self.limits)
        async with self._lock:
            current = await self.get(account_id)
            if not current.customer:
                raise Conflict(f"account {account_id!r} has opened no card setup")
            saved = await provider.finish_card_setup(account_id, current.customer, setup)
            await self._put(current, payment_method=saved.payment_method, payment_method_label=saved.label)
            self._topups.forget_failed_auto(account_id)
        return await self._topups.pay_saved(account_id, amount, saved)

    @property
    def browser_step(self) -> BrowserStep | None:
        """What the console loads for the provider's card element (None: no card form on this grid)."""
        return self._provider.browser_step if self._provider is not None else None

    async def set_auto_topup(self, account_id: str, setting: AutoTopup | None) -> BillingRecord:
        """Turn auto top-up on (with its threshold and amount), change it, or off (None); InvalidTopup for amounts the
        grid does not take, Conflict when turned on with no saved payment method."""
        if setting is not None:
            self._configured()
            check_auto_topup(setting, self.currency, self.limits)
        async with self._lock:
            current = await self.get(account_id)
            if setting is not None and setting.enabled and not current.payment_method:
                raise Conflict(
                    f"account {account_id!r} has no saved payment method: save one first (PUT /api/v1/billing/payment-method)"
                )
            self._topups.forget_failed_auto(account_id)
            return await self._put(current, auto_topup=setting)

    async def set_caps(self, account_id: str, caps: list[SpendCap]) -> BillingRecord:
        """Replace the renter's spend caps (an empty list removes them); InvalidCaps for caps the grid does not take.
        They need no payment provider: a grid whose operator credits balances caps spending too."""
        check_caps(caps)
        async with self._lock:
            return await self._put(await self.get(account_id), caps=list(caps))

    # --- the auto top-up loop ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._provider is not None and self._task is None:
            self._task = Loop("auto top-up", self._auto_topup_s, self._auto_topup_now, self._restart_s).start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None

    async def _auto_topup_now(self) -> None:
        await self.auto_topup(self._clock())

    async def auto_topup(self, now: float) -> list[TopupRecord]:
        """Charge every renter whose auto top-up is due at ``now``; returns the top-ups made (failed ones too)."""
        made: list[TopupRecord] = []
        after: str | None = None
        while True:
            page = await self._repo.list(after=after, limit=PAGE)
            for rec in page:
                if not self._recalled and rec.auto_topup is not None:
                    await self._topups.recall_failed_auto(rec.id)
                if auto_topup_due(rec, self._balance_left(rec.id, now), now, min_interval_s=self.min_interval_s):
                    topup = await self._charge(rec.id, now)
                    if topup is not None:
                        made.append(topup)
            if len(page) < PAGE:
                self._recalled = True
                return made
            after = page[-1].id

    async def _charge(self, account_id: str, now: float) -> TopupRecord | None:
        async with self._lock:
            rec = await self._repo.get(account_id)  # read again: it may have changed since the page was read
            if rec is None or not auto_topup_due(
                rec, self._balance_left(account_id, now), now, min_interval_s=self.min_interval_s
            ):
                return None
            await self._put(rec, last_auto_topup_at=now)
        setting = rec.auto_topup
        assert setting is not None  # due says so
        method = SavedMethod(customer=rec.customer, payment_method=rec.payment_method, label=rec.payment_method_label)
        return await self._topups.charge_saved(account_id, setting.amount, method)

    # --- inside --------------------------------------------------------------------------------------------------

    async def _put(self, current: BillingRecord, **changes: object) -> BillingRecord:
        updated = msgspec.structs.replace(current, **changes, updated_at=self._clock(), version=current.version + 1)
        await self._repo.put(updated)
        return updated

    async def _renter(self, account_id: str) -> None:
        account = await self._master.accounts.get(account_id)  # NotFound for no such account
        if account.role != "renter":
            raise Conflict(f"account {account_id!r} is a {account.role}; billing settings are a renter's")

    def _configured(self) -> PaymentProvider:
        if self._provider is None:
            raise PaymentsNotConfigured(
                "this grid takes no payments: its operator sets payment_provider in the Master's configuration"
            )
        return self._provider
