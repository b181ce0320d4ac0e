"""Everything the Master learns or decides is recorded as an event in the store."""

from __future__ import annotations

import time
from typing import Any

from master.records import EventData, EventRecord
from master.store.base import Store


class EventLog:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def record(self, kind: str, subject: str, /, **data: Any) -> None:
        await self._store.events.append(EventRecord(ts=time.time(), kind=kind, subject=subject, data=data))

    async def record_many(self, events: list[tuple[str, str, EventData]]) -> None:
        """Several events (kind, subject, data) in one store write, in the order given."""
        if events:
            now = time.time()
            await self._store.events.append_many(
                [EventRecord(ts=now, kind=kind, subject=subject, data=data) for kind, subject, data in events]
            )

    async def transition(self, machine: str, subject: str, old: str, new: str, event: str, /, **data: Any) -> None:
        await self.record(f"{machine}.transition", subject, old=old, new=new, event=event, **data)
