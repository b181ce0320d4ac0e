"""The store's plugin seam (master/store/plugin.py), on every backend: an aggregate declared outside master/, here a
throwaway one written against ``master.store.kit`` alone, is kept by the store once a migration step makes its table,
with the store's quarantine, metrics and fence, as management's aggregates are (management/store/)."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Protocol

import msgspec
import pymongo
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pymongo import ASCENDING, IndexModel

import master.store.migrations as migrations
from common.errors import Fenced
from management.store import AGGREGATES, attach
from master.store import Aggregate, MongoStore, SqliteStore, Store, UnstorableRecord, open_store
from master.store.fenced import fenced
from master.store.kit import AggregatePlugin, MongoCollection, SqliteTable
from master.store.plugin import DuplicateAggregate


class Note(msgspec.Struct, kw_only=True):
    id: str
    text: str
    weight: float = 0.0


class NoteRepo(Protocol):  # the interface a plugin declares, as management/store/'s modules do
    async def put(self, rec: Note) -> None: ...
    async def list(self) -> builtins.list[Note]: ...


class SqliteNoteRepo(SqliteTable[Note]):
    aggregate = "test_notes"
    record_type = Note

    async def put(self, rec: Note) -> None:
        await self._write("INSERT OR REPLACE INTO test_notes (id, doc) VALUES (?, ?)", rec.id, (rec.id, self._doc(rec.id, rec)))

    async def list(self) -> builtins.list[Note]:
        return await self._select("SELECT id, doc FROM test_notes ORDER BY id")


class MongoNoteRepo(MongoCollection[Note]):
    aggregate = "test_notes"
    record_type = Note

    async def put(self, rec: Note) -> None:
        await self._upsert(rec.id, rec)

    async def list(self) -> builtins.list[Note]:
        return await self._find({}, [("_id", ASCENDING)])


NOTES: AggregatePlugin[NoteRepo] = AggregatePlugin("test_notes", SqliteNoteRepo, MongoNoteRepo)


@pytest.fixture
async def noted_store(store_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Store]:
    """A store whose migration sequence has one step more: the throwaway aggregate's table (and index)."""
    version = migrations.LATEST_VERSION + 1
    sqlite_step = migrations.SqliteMigration(
        version, "test notes", ("CREATE TABLE test_notes (id TEXT PRIMARY KEY, doc TEXT NOT NULL)",)
    )
    mongo_step = migrations.MongoMigration(version, "test notes", {"test_notes": [IndexModel([("text", ASCENDING)])]})
    monkeypatch.setattr(migrations, "SQLITE_MIGRATIONS", (*migrations.SQLITE_MIGRATIONS, sqlite_step))
    monkeypatch.setattr(migrations, "MONGO_MIGRATIONS", (*migrations.MONGO_MIGRATIONS, mongo_step))
    monkeypatch.setattr(migrations, "LATEST_VERSION", version)
    store = open_store(store_url)
    await store.open()
    yield store
    await store.close()


async def test_a_plugged_aggregate_is_kept_by_the_store_after_its_migration_step(noted_store: Store) -> None:
    notes = noted_store.repository(NOTES)
    assert noted_store.repository(NOTES) is notes  # built once
    await notes.put(Note(id="n-2", text="second"))
    await notes.put(Note(id="n-1", text="first"))
    await notes.put(Note(id="n-2", text="second, again"))
    assert await notes.list() == [Note(id="n-1", text="first"), Note(id="n-2", text="second, again")]
    assert await noted_store.schema_version() == migrations.LATEST_VERSION


async def test_a_plugged_aggregate_has_the_store_s_metrics_refusal_and_quarantine(noted_store: Store) -> None:
    registry = CollectorRegistry()
    noted_store.metrics.register(registry)
    assert 'aggregate="test_notes"' not in generate_latest(registry).decode()  # not used yet
    notes = noted_store.repository(NOTES)
    await notes.put(Note(id="n-1", text="first"))
    labels = {"aggregate": "test_notes", "backend": noted_store.backend}
    assert registry.get_sample_value("idlegrid_store_write_seconds_count", labels) == 1
    with pytest.raises(UnstorableRecord, match="test_notes record 'n-2': weight is nan"):
        await notes.put(Note(id="n-2", text="bad", weight=float("nan")))
    await _plant_undecodable_note(noted_store, "n-0")
    assert [n.id for n in await notes.list()] == ["n-1"]
    assert [(q.aggregate, q.key) for q in noted_store.quarantine.records] == [("test_notes", "n-0")]
    assert registry.get_sample_value("idlegrid_store_quarantined_records", labels) == 1


async def _plant_undecodable_note(store: Store, key: str) -> None:
    """A note no ``Note`` decodes, written from outside the store (as a hand edit would)."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path, isolation_level=None) as conn:
            conn.execute("INSERT INTO test_notes (id, doc) VALUES (?, ?)", (key, '{"id": "n-0", "text": 7}'))
        conn.close()
        return
    assert isinstance(store, MongoStore)
    async with pymongo.AsyncMongoClient[dict[str, Any]](store.url) as client:
        await client[store.database].test_notes.insert_one({"_id": key, "id": key, "text": 7})


async def test_a_plugged_aggregate_is_fenced_as_the_store_s_own(noted_store: Store) -> None:
    leading = True

    def fence() -> None:
        if not leading:
            raise Fenced("deposed")

    store = fenced(noted_store, fence)
    notes = store.repository(NOTES)
    await notes.put(Note(id="n-1", text="first"))
    leading = False
    with pytest.raises(Fenced):
        await notes.put(Note(id="n-2", text="second"))
    assert [n.id for n in await notes.list()] == ["n-1"]  # reads pass


async def test_an_aggregate_name_is_one_aggregate_s(noted_store: Store) -> None:
    noted_store.repository(NOTES)
    twin = replace(NOTES)  # another plugin, the same table
    with pytest.raises(DuplicateAggregate, match="test_notes"):
        noted_store.repository(twin)
    with pytest.raises(DuplicateAggregate, match="agents"):
        noted_store.repository(AggregatePlugin("agents", SqliteNoteRepo, MongoNoteRepo))
    with pytest.raises(ValueError, match="'test_other' builds a repository of aggregate 'test_notes'"):
        noted_store.repository(AggregatePlugin("test_other", SqliteNoteRepo, MongoNoteRepo))


async def test_management_s_aggregates_have_their_series_from_the_start(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        attach(store)  # as management's composition does, before anything is served
        registry = CollectorRegistry()
        store.metrics.register(registry)
        body = generate_latest(registry).decode()
        assert body.count("idlegrid_store_write_seconds_count{") == len(Aggregate) + len(AGGREGATES)
        assert body.count("idlegrid_store_quarantined_records{") == len(Aggregate) + len(AGGREGATES)
    finally:
        await store.close()
