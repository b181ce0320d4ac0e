"""Everything the Master learns or decides is recorded as an event in the store."""

from __future__ import annotations

import time
from typing import Any

from master.records import EventRecord
from master.store.base import Store


class EventLog:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def record(self, kind: str, subject: str, /, **data: Any) -> None:
        await self._store.events.append(EventRecord(ts=time.time(), kind=kind, subject=subject, data=data))

    async def transition(self, machine: str, subject: str, old: str, new: str, event: str, /, **data: Any) -> None:
        await self.record(f"{machine}.transition", subject, old=old, new=new, event=event, **data)
