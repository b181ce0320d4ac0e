"""Money out, the rules (pure: no I/O, no clock): what a provider may be paid, when a payout is due, its ledger entry,
and how the ledger's payouts compare with the payment provider's transfers (docs/payments.md, "Payouts",
"Reconciliation").

- **Matured earnings.** What is payable to ``provider:<id>`` is its ledger balance less what it earned within the
  dispute window: the entries crediting it (net positive on it) newer than ``now - window``. Money moved out of the
  provider's account by any other entry (a refund, a dispute's hold, an SLA credit) is already gone from the balance,
  so it is never paid; a payout pays from the matured balance and nothing else. Never negative.
- **A payout** is due once per provider and payout period (a UTC day, ISO week or month), in whole units of the
  currency (cents: the rest waits): its key
  ``payout:<provider>:<period label>`` is the ledger entry's key, the transfer's idempotency key and its transfer group,
  so a run repeated in the same period, or after a crash at any point, pays nothing twice. Below the minimum, nothing is
  due (the earnings wait for the next period).
- **The reconciliation** pairs the ledger's payout entries with the provider's transfers by key: any entry without its
  transfer, transfer without its entry (the grid's key, or no key at all to a connected account of the grid), or pair
  whose amounts differ is a ``Difference``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from management.market.ledger import EXTERNAL, calendar_period, provider_account
from management.payments.provider import TransferRecord
from master.port import LedgerEntry, LedgerLine

PAYOUT_KIND = "payout"
PayoutPeriod = Literal["day", "week", "month"]


@dataclass(frozen=True)
class PayoutSettings:
    """Money out's settings (master/config.py ``payout_*``)."""

    window_s: float = 7 * 86400.0  # the dispute window: earnings younger than this wait
    period: PayoutPeriod = "week"  # one payout per provider per UTC period
    minimum: int = 10_000_000  # micro-units: less waits for a later period
    check_s: float = 3600.0  # how often the run looks for a period not paid yet
    reconcile_s: float = 86400.0  # how often the reconciliation runs
    # The first one after this Master starts (or takes over): its result is kept in memory, so a restart would
    # otherwise leave a difference unseen, and its alert quiet, for a whole reconcile_s.
    reconcile_first_s: float = 60.0
    reconcile_window_s: float = 35 * 86400.0  # how far back it compares


def earned_within(entries: Iterable[LedgerEntry], ledger_account: str, since: float) -> int:
    """What the entries newer than ``since`` credited to ``ledger_account`` (each entry's net on it, when positive)."""
    total = 0
    for entry in entries:
        if entry.ts > since:
            net = sum(line.amount for line in entry.lines if line.account == ledger_account)
            total += max(0, net)
    return total


def matured(entries: Iterable[LedgerEntry], ledger_account: str, balance: int, now: float, window_s: float) -> int:
    """What ``ledger_account`` may be paid at ``now``: its ``balance`` less what it earned within ``window_s``, at
    least 0. ``entries`` are the account's entries (those of other accounts count nothing)."""
    return max(0, balance - earned_within(entries, ledger_account, now - window_s))


def payout_key(account_id: str, period_label: str) -> str:
    """The key of provider ``account_id``'s payout for one period: ledger entry, idempotency key, transfer group."""
    return f"payout:{account_id}:{period_label}"


def period_label(now: float, period: PayoutPeriod) -> str:
    """The payout period holding ``now`` ("2026-12-07", "2026-W50", "2026-12")."""
    return calendar_period(now, period)[2]


class PayoutDue(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    account: str
    amount: int
    period: str


def due(account_id: str, payable: int, minimum: int, label: str, unit: int = 1) -> PayoutDue | None:
    """The payout of ``payable`` micro-units to provider ``account_id`` for period ``label``, in whole ``unit``s (the
    currency's smallest: a transfer is in cents; the rest stays for a later payout); None below ``minimum``."""
    payable -= payable % unit
    if payable <= 0 or payable < minimum:
        return None
    return PayoutDue(key=payout_key(account_id, label), account=account_id, amount=payable, period=label)


def payout_entry(account_id: str, amount: int, key: str, ts: float, memo: str) -> LedgerEntry:
    """The ledger entry of a payout: ``amount`` from ``provider:<id>`` to ``external`` (the money left the grid)."""
    if amount <= 0:
        raise ValueError(f"a payout moves more than 0, not {amount}")
    lines = [LedgerLine(account=provider_account(account_id), amount=-amount), LedgerLine(account=EXTERNAL, amount=amount)]
    return LedgerEntry(key=key, ts=ts, kind=PAYOUT_KIND, memo=memo, lines=lines)


def paid_out(entry: LedgerEntry) -> int:
    """What a payout entry moved out of the grid (its line on ``external``)."""
    return sum(line.amount for line in entry.lines if line.account == EXTERNAL)


DifferenceKind = Literal["missing_transfer", "missing_entry", "amount", "unknown_transfer"]


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One disagreement between the ledger's payouts and the provider's transfers: ``key`` the payout's (or "" for a
    transfer without one), what the ledger says (``ledger``) and what the provider's transfers say (``provider``), in
    micro-units, and the transfer (``reference``) when there is one."""

    kind: DifferenceKind
    key: str
    ledger: int
    provider: int
    reference: str = ""


def reconcile(
    entries: Iterable[LedgerEntry], transfers: Iterable[TransferRecord], destinations: Mapping[str, str]
) -> list[Difference]:
    """Every difference between the ledger's payout ``entries`` and the provider's ``transfers`` of the same span.
    ``destinations``: connected account reference -> the grid's provider account: a transfer without a payout key to
    one of these is the grid's money moved outside a payout run (``unknown_transfer``); one to any other account is
    not the grid's business."""
    ledger = {e.key: paid_out(e) for e in entries if e.kind == PAYOUT_KIND}
    sent: dict[str, list[TransferRecord]] = {}
    differences: list[Difference] = []
    for transfer in transfers:
        if transfer.key:
            sent.setdefault(transfer.key, []).append(transfer)
        elif transfer.destination in destinations:
            differences.append(
                Difference(kind="unknown_transfer", key="", ledger=0, provider=transfer.amount, reference=transfer.reference)
            )
    for key in sorted(set(ledger) | set(sent)):
        made = sent.get(key, [])
        amount = sum(t.amount for t in made)
        reference = ",".join(t.reference for t in made)
        if key not in ledger:
            differences.append(Difference(kind="missing_entry", key=key, ledger=0, provider=amount, reference=reference))
        elif not made:
            differences.append(Difference(kind="missing_transfer", key=key, ledger=ledger[key], provider=0))
        elif amount != ledger[key]:
            differences.append(Difference(kind="amount", key=key, ledger=ledger[key], provider=amount, reference=reference))
    return differences
