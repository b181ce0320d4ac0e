"""The relay directory: every relay linked to this Master that told where agents dial it.

Agents get it in their welcome (and new agents in their enrollment response), and again whenever it
changes: relays come and go in bursts (a restart, a network split), so a change is announced once,
``coalesce_s`` after the first of a burst, and only if the directory then differs from the last one
announced. An announcement is one frame per relay, which tells its agents one by one (``RelayHub.announce_directory``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from common.wire import RelayEntry
from master.link import AccessLink

Announce = Callable[[list[RelayEntry]], Awaitable[object]]  # tells every connected agent the directory


def directory_of(links: Iterable[AccessLink]) -> list[RelayEntry]:
    """The directory of ``links``, by relay id; a relay that gave no public URL cannot be dialled and is left out."""
    return [
        RelayEntry(relay_id=link.relay_id, region=link.region, url=link.public_url)
        for link in sorted(links, key=lambda link: link.relay_id)
        if link.public_url
    ]


class RelayDirectoryAnnouncer:
    def __init__(self, links: Callable[[], Iterable[AccessLink]], announce: Announce, *, coalesce_s: float) -> None:
        self._links = links
        self._announce = announce
        self._coalesce_s = coalesce_s
        self._announced: list[RelayEntry] = []  # what agents were last told
        self._pending: asyncio.Task[None] | None = None

    def current(self) -> list[RelayEntry]:
        return directory_of(self._links())

    def changed(self) -> None:
        """A relay linked or unlinked: announce the directory soon, once for the whole burst."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._announce_after_burst(), name="relay-directory")

    async def stop(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pending

    async def _announce_after_burst(self) -> None:
        await asyncio.sleep(self._coalesce_s)
        directory = self.current()
        if directory != self._announced:
            self._announced = directory
            await self._announce(directory)
