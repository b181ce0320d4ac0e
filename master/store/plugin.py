"""The seam through which another part keeps its own aggregates in the Master's one store.

An ``AggregatePlugin`` declares one aggregate: its name (its SQLite table and MongoDB collection, the ``aggregate``
label of the store's metrics and of quarantined records) and how to build its repository on each backend, from the
upkeep every repository takes (the database or connection, the quarantine, the metrics). ``store.repository(plugin)``
answers that repository for the open store: built on first use, the same object after. The store brings what it brings
its own aggregates: decoding with quarantine, the refusal of non-finite values, timed writes, and, behind a
``FencedStore``, the fence on every write (master/store/fenced.py).

Management keeps its aggregates this way (management/store/, docs/store.md "Who owns what"): a new one is a module
there and a migration step in master/store/migrations.py, nothing else under master/. ``master.store.kit`` is all such
a module imports of the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

from master.store.aggregates import Aggregate
from master.store.metrics import StoreMetrics
from master.store.quarantine import Quarantine

if TYPE_CHECKING:  # the backends' packages import this module (their stores build plugged repositories)
    from master.store.mongo.connection import MongoConnection
    from master.store.sqlite.database import SqliteDatabase

Repo = TypeVar("Repo")
Repo_co = TypeVar("Repo_co", covariant=True)


@dataclass(frozen=True, eq=False)
class AggregatePlugin(Generic[Repo_co]):
    """One aggregate kept for another part; ``Repo_co`` is its repository's interface (a ``typing.Protocol``)."""

    name: str  # its table and collection; unique among the store's aggregates (built-in or plugged)
    sqlite: Callable[[SqliteDatabase, Quarantine, StoreMetrics], Repo_co]  # usually a ``SqliteTable`` subclass
    mongo: Callable[[MongoConnection, Quarantine, StoreMetrics], Repo_co]  # usually a ``MongoCollection`` subclass


class Repositories(Protocol):
    """Whatever answers a plugin's repository: a ``Store``, a fenced one, management's ``ManagementStore``."""

    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo: ...


class DuplicateAggregate(ValueError):
    """Two aggregates of one store under one name: they would share a table, a collection and metric series."""


BUILT_IN = frozenset(str(a) for a in Aggregate)


class PluggedRepositories:
    """The plugged repositories of one store, by aggregate name, each built on its first use."""

    def __init__(self, metrics: StoreMetrics) -> None:
        self._metrics = metrics
        self._made: dict[str, tuple[AggregatePlugin[object], object]] = {}

    def get(self, plugin: AggregatePlugin[Repo], build: Callable[[], Repo]) -> Repo:
        found = self._made.get(plugin.name)
        if found is not None:
            if found[0] is not plugin:
                raise DuplicateAggregate(f"two aggregates are named {plugin.name!r}: each needs a table of its own")
            return cast(Repo, found[1])
        if plugin.name in BUILT_IN:
            raise DuplicateAggregate(f"aggregate {plugin.name!r} is one of the store's own: name it otherwise")
        repo = build()
        declared = getattr(repo, "aggregate", plugin.name)  # a SqliteTable's or MongoCollection's own name
        if declared != plugin.name:
            raise ValueError(f"plugin {plugin.name!r} builds a repository of aggregate {declared!r}: name them alike")
        self._made[plugin.name] = (plugin, repo)
        self._metrics.track(plugin.name)
        return repo
