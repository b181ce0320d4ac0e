"""Everything the Master learns or decides is recorded as an event in the store."""

from __future__ import annotations

import time
from typing import Any

from master.batches import GroupWrite
from master.records import EventData, EventRecord
from master.store.base import Store


class EventLog:
    """Events are appended through a group write (master/batches.py ``GroupWrite``): the events of callers at once
    (a ramp's thousands of hellos) go to the store together, in the order recorded, each caller back once its own
    are written."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._appends: GroupWrite[EventRecord] = GroupWrite(lambda records: self._store.events.append_many(records))

    async def record(self, kind: str, subject: str, /, **data: Any) -> None:
        await self._appends.put([EventRecord(ts=time.time(), kind=kind, subject=subject, data=data)])

    async def record_many(self, events: list[tuple[str, str, EventData]]) -> None:
        """Several events (kind, subject, data), written together, in the order given."""
        if events:
            now = time.time()
            records = [EventRecord(ts=now, kind=kind, subject=subject, data=data) for kind, subject, data in events]
            await self._appends.put(records)

    async def transition(self, machine: str, subject: str, old: str, new: str, event: str, /, **data: Any) -> None:
        await self.record(f"{machine}.transition", subject, old=old, new=new, event=event, **data)
