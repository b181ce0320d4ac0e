"""The MongoDB client of one store, and what its URL names."""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from common.errors import ConfigError
from master.store.codec import Document


class Writer(NamedTuple):
    """The leader writing through this connection (docs/ha.md): stamped on every document it writes."""

    holder: str
    epoch: int


class MongoConnection:
    """The client, made in ``open()`` rather than at construction: it belongs to the event loop that opens it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = database_name(url)
        self._db: AsyncDatabase[Document] | None = None
        self.writer: Writer | None = None  # set once this Master leads (high availability); None: stamp nothing

    @property
    def db(self) -> AsyncDatabase[Document]:
        if self._db is None:
            raise RuntimeError(f"the MongoDB store at {redacted(self.url)} is not open")
        return self._db

    def connect(self) -> None:
        client: AsyncMongoClient[Document] = AsyncMongoClient(self.url)
        self._db = client[self.database]

    async def disconnect(self) -> None:
        if self._db is not None:
            await self._db.client.close()
            self._db = None


def database_name(url: str) -> str:
    """The database a ``mongodb://`` URL names in its path; ConfigError when it names none."""
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ConfigError(
            f"the MongoDB URL {redacted(url)!r} names no database: add it as the path, e.g. mongodb://host:27017/idlegrid"
        )
    if any(c in name for c in '/\\. "$'):
        raise ConfigError(f'{name!r} is not a valid MongoDB database name (no / \\ . space " or $)')
    return name


def redacted(url: str) -> str:
    """The URL without its credentials, fit for logs and error messages."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"
