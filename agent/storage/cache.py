"""The per-host input cache: objects kept by content, so a workload that lands on a host that fetched its inputs
before starts at once.

An entry is one object version, named by a hash of (endpoint, bucket, key, ETag): a changed object has another ETag,
so it is another entry. Entries live in ``<root>/objects/`` (0444 files in a 0700 directory) and are hard-linked
into each container's input directory, so the bytes are on the disk once. A link shares the entry's mode, so what
keeps an entry from other renters is the path, not the mode: the cache and every container's data directory are the
agent's and 0700, and a container sees its own input directory through a bind in its own mount namespace only
(docs/storage.md, "A container's data is its own"). The index (``index.json``, 0600) keeps
each entry's size and last use. Invariants:

- the entries together stay within ``budget_bytes``: before a fetch, least recently used entries no container holds
  are removed; an object larger than the budget, or one that does not fit beside the entries in use, is refused
  (``StorageTooLarge``: the renter's inputs do not fit this host);
- an entry a container holds (``hold``) is never removed until ``release``;
- two creates asking for the same entry at once fetch it once;
- a cached entry is used only after the renter's own credentials listed the object with that ETag (the data plane
  reads the ETag with the renter's keys), so a renter cannot read another's cached object without access to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from agent.storage.objects import ObjectInfo, ObjectStore
from common.errors import StorageTooLarge
from common.files import write_atomically


class CacheEntry(msgspec.Struct, kw_only=True):
    size: int
    last_used: float
    source: str = ""  # "s3://bucket/key" for people reading the index


@dataclass(frozen=True)
class Fetched:
    path: Path
    entry: str
    fetched: bool  # False: it was in the cache already
    size: int


def entry_id(endpoint: str, bucket: str, key: str, etag: str) -> str:
    return hashlib.sha256("\n".join((endpoint, bucket, key, etag)).encode()).hexdigest()


def evictions(entries: dict[str, CacheEntry], held: Iterable[str], need: int, budget: int) -> list[str] | None:
    """The entries to remove, least recently used first, so ``need`` more bytes fit in ``budget``; None when even
    removing every entry no container holds would not make room."""
    held = set(held)
    used = sum(e.size for e in entries.values())
    out: list[str] = []
    for eid, entry in sorted(entries.items(), key=lambda kv: (kv[1].last_used, kv[0])):
        if used + need <= budget:
            break
        if eid in held:
            continue
        out.append(eid)
        used -= entry.size
    return out if used + need <= budget else None


class InputCache:
    def __init__(self, root: Path, budget_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.budget = budget_bytes
        self._clock = clock
        self._objects = root / "objects"
        self._objects.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        self._index_path = root / "index.json"
        self.entries: dict[str, CacheEntry] = self._read_index()
        self._holds: dict[str, set[str]] = {}  # entry -> the containers holding it
        self._fetching: dict[str, asyncio.Future[None]] = {}
        self.fetches = 0  # objects fetched from a store since start (the per-host cache's whole point: tests read it)

    def _read_index(self) -> dict[str, CacheEntry]:
        try:
            entries = msgspec.json.decode(self._index_path.read_bytes(), type=dict[str, CacheEntry])
        except (FileNotFoundError, msgspec.DecodeError):
            return {}
        return {eid: e for eid, e in entries.items() if (self._objects / eid).exists()}

    def _save(self) -> None:
        write_atomically(self._index_path, msgspec.json.encode(self.entries), mode=0o600)

    def used(self) -> int:
        return sum(e.size for e in self.entries.values())

    def path(self, eid: str) -> Path:
        return self._objects / eid

    async def ensure(self, store: ObjectStore, bucket: str, obj: ObjectInfo, holder: str) -> Fetched:
        """The cached file of ``obj``, fetched if absent, held for ``holder`` until ``release(holder)``."""
        eid = entry_id(store.endpoint, bucket, obj.key, obj.etag)
        self._holds.setdefault(eid, set()).add(holder)
        while eid in self._fetching:  # another create fetches it now: wait for that one
            await asyncio.shield(self._fetching[eid])
        entry = self.entries.get(eid)
        if entry is not None:
            entry.last_used = self._clock()
            self._save()
            return Fetched(self.path(eid), eid, False, entry.size)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fetching[eid] = done
        try:
            self._make_room(obj, eid)
            target = self.path(eid)
            await store.fetch(bucket, obj.key, target, size=obj.size)
            os.chmod(target, 0o444)
            self.entries[eid] = CacheEntry(size=obj.size, last_used=self._clock(), source=f"s3://{bucket}/{obj.key}")
            self.fetches += 1
            self._save()
        except BaseException:
            self._holds.get(eid, set()).discard(holder)
            raise
        finally:
            del self._fetching[eid]
            done.set_result(None)
        return Fetched(self.path(eid), eid, True, obj.size)

    def _make_room(self, obj: ObjectInfo, eid: str) -> None:
        held = [e for e, holders in self._holds.items() if holders and e != eid]
        out = evictions(self.entries, held, obj.size, self.budget)
        if out is None:
            raise StorageTooLarge(
                f"input s3://.../{obj.key} ({obj.size} bytes) does not fit in this host's input cache "
                f"({self.budget} bytes, {sum(self.entries[e].size for e in held if e in self.entries)} held by running work)"
            )
        for gone in out:
            self.path(gone).unlink(missing_ok=True)
            del self.entries[gone]

    def release(self, holder: str) -> None:
        for holders in self._holds.values():
            holders.discard(holder)

    def sources(self) -> list[str]:
        """What the cache holds, most recently used first (for the host's offers)."""
        return [e.source for e in sorted(self.entries.values(), key=lambda e: -e.last_used)]
