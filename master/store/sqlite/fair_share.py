"""The scheduler's fair-share usage in SQLite."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from master.records import FairShareUsage
from master.store.aggregates import Aggregate, fair_share_key, fair_share_order
from master.store.sqlite.table import SqliteTable


class SqliteFairShareRepo(SqliteTable[FairShareUsage]):
    aggregate = Aggregate.FAIR_SHARE
    record_type = FairShareUsage

    async def put_many(self, recs: Sequence[FairShareUsage]) -> None:
        keyed = [(key := fair_share_key(r.account, r.project), (key, r.account, self._doc(key, r))) for r in recs]
        await self._write_many("INSERT OR REPLACE INTO fair_share (key, account, doc) VALUES (?, ?, ?)", keyed)

    async def list(self) -> builtins.list[FairShareUsage]:
        return sorted(await self._select("SELECT key, doc FROM fair_share"), key=fair_share_order)
