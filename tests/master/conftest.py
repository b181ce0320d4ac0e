"""Stores for the Master's tests: every store test runs on each backend.

``sqlite``: a file in the test's tmp_path. ``nx27017``: an nx-27017 server started once for the
session, a fresh database per test. ``mongod``: the real server named by MONGODB_URI, only when set.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymongo
import pytest

from master.store import open_store
from master.store.base import Store
from tests.support.mongo import MongoServerError, Nx27017, database_url, real_mongodb_uri

MONGO_BACKENDS = ["nx27017"] + (["mongod"] if real_mongodb_uri() else [])
BACKENDS = ["sqlite", *MONGO_BACKENDS]

OpenStore = Callable[[], Awaitable[Store]]


@pytest.fixture(scope="session")
def nx27017_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An nx-27017 server for the whole session; the test fails (not skips) when it cannot start."""
    server = Nx27017(tmp_path_factory.mktemp("nx27017"))
    problem = None
    try:
        server.start()
    except MongoServerError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    try:
        yield server.uri
    finally:
        server.stop()


def _mongo_server_uri(request: pytest.FixtureRequest, backend: str) -> str:
    # Looked up lazily, so a run of the SQLite tests alone starts no server.
    if backend == "mongod":
        uri = real_mongodb_uri()
        assert uri is not None
        return uri
    nx_uri: str = request.getfixturevalue("nx27017_uri")
    return nx_uri


@contextmanager
def _fresh_database(server_uri: str) -> Iterator[str]:
    """A URL naming a database no other test uses; the database is dropped afterwards."""
    database = f"idlegrid_test_{uuid.uuid4().hex[:12]}"
    try:
        yield database_url(server_uri, database)
    finally:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server_uri)
        with client:
            client.drop_database(database)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty store on each backend in turn."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'master.db'}"
        return
    with _fresh_database(_mongo_server_uri(request, request.param)) as url:
        yield url


@pytest.fixture(params=MONGO_BACKENDS)
def mongo_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of an empty MongoDB database on each MongoDB server in turn."""
    with _fresh_database(_mongo_server_uri(request, request.param)) as url:
        yield url


@pytest.fixture
async def open_stores(store_url: str) -> AsyncIterator[OpenStore]:
    """Opens any number of stores on the same database (as several processes would); closes them all after."""
    opened: list[Store] = []

    async def open_one() -> Store:
        store = open_store(store_url)
        await store.open()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_stores: OpenStore) -> Store:
    return await open_stores()


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Any]:
    """A real Master on SQLite in tmp_path, its relay endpoint on a free port; tests drive it with tests/master/linked.py."""
    from master.config import MasterConfig
    from master.master import Master

    running = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0, relay_directory_coalesce_s=0.05))
    await running.start()
    yield running
    await running.stop()
