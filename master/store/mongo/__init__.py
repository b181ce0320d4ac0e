"""The MongoDB store: ``connection`` (the client and the URL), ``collection`` (what every repository
shares), one module per aggregate, and ``store`` (the repositories together)."""

from master.store.mongo.connection import database_name, redacted
from master.store.mongo.store import MongoStore

__all__ = ["MongoStore", "database_name", "redacted"]
