"""The Master's store; ``open_store`` picks the backend from a URL.

URLs:

- ``sqlite:///<path>``: an SQLite file; everything after the third slash is the path, as in
  SQLAlchemy. So ``sqlite:///master.db`` is ``master.db`` in the working directory and
  ``sqlite:////var/lib/idlegrid/master.db`` (four slashes) is an absolute path.
  ``sqlite:///:memory:`` is a private in-memory database (tests, demos).
- ``mongodb://[user:pass@]host[:port][,host...]/<database>[?options]`` (or ``mongodb+srv://``):
  the database is required; options are passed to PyMongo unchanged.

Layout: ``base`` (the repository interfaces), ``aggregates``, ``codec``, ``quarantine``, ``metrics`` and
``migrations`` (shared by both backends), and one package per backend, ``sqlite`` and ``mongo``, with a
module per aggregate. docs/store.md tells the whole story.
"""

from __future__ import annotations

from common.errors import ConfigError
from master.store.aggregates import Aggregate
from master.store.base import Store, TokenOutcome
from master.store.errors import UnstorableRecord
from master.store.metrics import StoreMetrics
from master.store.mongo import MongoStore
from master.store.quarantine import Quarantine, QuarantinedRecord
from master.store.sqlite import SqliteStore

__all__ = [
    "Aggregate",
    "MongoStore",
    "Quarantine",
    "QuarantinedRecord",
    "SqliteStore",
    "Store",
    "StoreMetrics",
    "TokenOutcome",
    "UnstorableRecord",
    "open_store",
    "sqlite_path",
]

SQLITE_PREFIX = "sqlite:///"
MONGO_SCHEMES = ("mongodb://", "mongodb+srv://")


def sqlite_path(url: str) -> str:
    """The file an ``sqlite:///`` URL names (see the module doc); ConfigError if it names none."""
    if not url.startswith(SQLITE_PREFIX):
        raise ConfigError(
            f"SQLite store URL {url!r} must start with {SQLITE_PREFIX!r}: sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    path = url[len(SQLITE_PREFIX) :]
    if not path:
        raise ConfigError(f"SQLite store URL {url!r} names no file: sqlite:///relative.db or sqlite:////absolute/path.db")
    return path


def open_store(url: str) -> Store:
    """A store for ``url``, not yet opened: call ``await store.open()`` before use."""
    if url.startswith("sqlite:"):
        return SqliteStore(sqlite_path(url))
    if url.startswith(MONGO_SCHEMES):
        return MongoStore(url)
    raise ConfigError(f"unsupported store URL {url!r}: use sqlite:///<path> (the default) or mongodb://host:port/<database>")
