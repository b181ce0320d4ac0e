"""What a plugged aggregate's module imports of the store (master/store/plugin.py), and nothing else of it.

Management's aggregates (management/store/) are written against this: the plugin itself, each backend's base class
(``SqliteTable``, ``MongoCollection``: decoding with quarantine, the non-finite refusal, timed writes) and their query
helpers, and the store's errors. tests/test_dependency_rule.py keeps management/store/ to this module and master.port.
"""

from __future__ import annotations

from master.store.base import prefix_upper_bound
from master.store.codec import Document
from master.store.errors import UnstorableRecord
from master.store.mongo.collection import DUPLICATE_KEY, MongoCollection, Sort, only, set_fields
from master.store.plugin import AggregatePlugin, Repositories
from master.store.sqlite.database import read_snapshot, transaction, where
from master.store.sqlite.table import SqliteTable

__all__ = [
    "DUPLICATE_KEY",
    "AggregatePlugin",
    "Document",
    "MongoCollection",
    "Repositories",
    "Sort",
    "SqliteTable",
    "UnstorableRecord",
    "only",
    "prefix_upper_bound",
    "read_snapshot",
    "set_fields",
    "transaction",
    "where",
]
