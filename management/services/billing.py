"""What renters spent, as the console's billing page shows it: the balance, spend per hour and a page of the ledger,
read from the market's ledger (management/services/market.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from management.market.ledger import Statement, StatementLine
from management.services.market import FundsDetail, MarketService

LEDGER_PAGE = 1000  # ledger lines read a time while summing spend
MONEY_IN = frozenset({"credit", "topup"})  # entries that bring money in: not spending


@dataclass(frozen=True)
class SpendPoint:
    start: float  # unix time the bucket starts
    spent: int  # micro-units charged in it (refunds taken off); credits are not spending


@dataclass(frozen=True)
class SpendOverTime:
    account: str
    currency: str
    bucket_s: float
    points: list[SpendPoint]  # oldest first, every bucket from the first charge to now (empty ones included)
    total: int


@dataclass(frozen=True)
class BillingOverview:
    """The console's billing page in one read: the balance, spend per hour, and one page of the ledger."""

    funds: FundsDetail
    spend: SpendOverTime
    statement: Statement


class BillingService:
    ENTRIES_READ = 10_000  # ledger lines a spend chart reads at most (the newest)
    BUCKETS_SHOWN = 24 * 31  # a month of hours

    def __init__(self, market: MarketService) -> None:
        self._market = market

    async def billing_overview(self, account_id: str, *, owner: str | None, after_seq: int, limit: int) -> BillingOverview:
        """The balance, spend over time and the ledger page after ``after_seq`` of ``account_id`` (NotFound for
        another account's, as ``owner`` decides)."""
        return BillingOverview(
            funds=await self._market.funds(account_id, owner=owner),
            spend=await self.spend_over_time(account_id, owner=owner),
            statement=await self._market.ledger_statement(account_id, owner=owner, after_seq=after_seq, limit=limit),
        )

    async def spend_over_time(self, account_id: str, *, owner: str | None, bucket_s: float = 3600.0) -> SpendOverTime:
        """What a renter spent per ``bucket_s`` (charges less refunds, from its ledger statement), oldest first."""
        after, lines = 0, list[StatementLine]()
        while True:
            statement = await self._market.ledger_statement(account_id, owner=owner, after_seq=after, limit=LEDGER_PAGE)
            lines.extend(line for line in statement.lines if line.kind not in MONEY_IN)
            if not statement.more or len(lines) >= self.ENTRIES_READ:
                break
            after = statement.next_after
        spent: dict[int, int] = {}
        for line in lines[-self.ENTRIES_READ :]:
            bucket = int(line.ts // bucket_s)
            spent[bucket] = spent.get(bucket, 0) - line.amount
        points: list[SpendPoint] = []
        if spent:
            first, last = min(spent), max(max(spent), int(time.time() // bucket_s))
            first = max(first, last - self.BUCKETS_SHOWN + 1)
            points = [SpendPoint(b * bucket_s, spent.get(b, 0)) for b in range(first, last + 1)]
        return SpendOverTime(account_id, self._market.currency, bucket_s, points, sum(p.spent for p in points))
