"""The embedded SQLite store: ``database`` (the file and its worker thread), ``table`` (what every repository
shares), one module per aggregate, and ``store`` (the repositories together)."""

from master.store.sqlite.database import SqliteDatabase
from master.store.sqlite.store import SqliteStore

__all__ = ["SqliteDatabase", "SqliteStore"]
