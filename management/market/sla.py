"""Automatic SLA credits (docs/disputes.md): what a renter is credited when a host causes downtime, by a published
formula from the meter's own seconds. Pure: no I/O, no clock.

A run that ends through its host (``host_failure``: the host lost, a GPU fault, a container the host failed to start)
is already refunded every charge (``refund:<rental>``, management/market/charges.py). The credit is on top of that, for
the downtime, which was never charged (charges stop at the host's last heartbeat):

    downtime_s = max(min_downtime_s, whole seconds from the host's last heartbeat the meter counted (the rental's
                     ``ended_at``) to the moment the meter saw the run end)
    credit     = price x GPUs of the failing host x min(downtime_s x percent / 100, cap_s) / 3600, rounded down,
                 and at most what the host's provider has on ``provider:<id>`` then

It moves ``provider:<id> -> renter:<id>`` under the key ``sla:<rental>`` (kind ``sla_credit``): once per rental, so a
replay or a restart credits nothing twice, and no provider balance goes below zero (what it cannot pay is noted in the
entry's memo; the grid does not owe it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from management.market.ledger import provider_account, renter_account
from management.market.money import format_amount
from master.port import LedgerEntry, LedgerLine

KIND = "sla_credit"


class SlaTerms(msgspec.Struct, frozen=True, kw_only=True):
    """The published formula's figures (``MasterConfig.sla_credit_percent``, ``sla_min_downtime_s``,
    ``sla_credit_cap_s``)."""

    percent: int = 200  # the downtime is credited at this percent of its cost
    min_downtime_s: float = 600.0  # a failure costs a renter at least this (noticing it, starting again elsewhere)
    cap_s: float = 3600.0  # at most this long of the failing host's cost is credited for one failure


def sla_key(rental_id: str) -> str:
    """The one key of a rental's SLA credit."""
    return f"sla:{rental_id}"


def downtime_s(last_heard: float, noticed: float, terms: SlaTerms) -> int:
    """Whole seconds of downtime a failure is credited for: from the host's last heartbeat to when the meter saw the
    run end, at least ``min_downtime_s``."""
    return max(math.ceil(terms.min_downtime_s), math.floor(max(0.0, noticed - last_heard)))


def credit_amount(price: int, gpus: int, downtime: int, terms: SlaTerms) -> int:
    """The formula before the provider's balance caps it: price x GPUs x min(downtime x percent%, cap) / 3600."""
    credited_s = min(downtime * terms.percent, math.floor(terms.cap_s) * 100)  # in hundredths of a second
    return price * gpus * credited_s // (3600 * 100)


def sla_credit(
    *,
    rental_id: str,
    renter: str,
    workload: str,
    agent_id: str,
    provider: str,
    price: int,
    gpus: int,
    last_heard: float,
    noticed: float,
    why: str,
    terms: SlaTerms,
    provider_balances: Mapping[str, int],
) -> LedgerEntry | None:
    """The credit entry for one failure, or None when it moves nothing (a free host, a provider with nothing)."""
    down = downtime_s(last_heard, noticed, terms)
    owed = credit_amount(price, gpus, down, terms)
    account = provider_account(provider)
    amount = max(0, min(owed, provider_balances.get(account, 0)))
    if amount <= 0:
        return None
    memo = (
        f"SLA credit {format_amount(amount)}: {down} s down x {terms.percent}% at {format_amount(price)}/GPU-hour x "
        f"{gpus} GPU(s) on {agent_id} (capped at {terms.cap_s:g} s) ({why})"
    )
    if amount < owed:
        memo += f"; the formula gives {format_amount(owed)}, the provider had {format_amount(amount)}"
    lines = [
        LedgerLine(account=account, amount=-amount, host=agent_id, workload=workload),
        LedgerLine(account=renter_account(renter), amount=amount, workload=workload),
    ]
    return LedgerEntry(key=sla_key(rental_id), ts=noticed, kind=KIND, memo=memo, lines=lines, rental=rental_id)
