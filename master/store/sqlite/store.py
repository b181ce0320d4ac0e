"""The embedded store: one SQLite file, nothing to install or start."""

from __future__ import annotations

import sqlite3

from common.errors import ConfigError
from master.store.base import (
    AccountRepo,
    AgentRepo,
    ApiKeyRepo,
    CommandRepo,
    EventRepo,
    GpuRepo,
    HostRollupRepo,
    LeaseRepo,
    RevocationRepo,
    RollupRepo,
    SecretRepo,
    TokenRepo,
)
from master.store.metrics import StoreMetrics
from master.store.migrations import migrate_sqlite, sqlite_schema_version
from master.store.plugin import AggregatePlugin, PluggedRepositories, Repo
from master.store.quarantine import Quarantine
from master.store.sqlite.accounts import SqliteAccountRepo
from master.store.sqlite.agents import SqliteAgentRepo
from master.store.sqlite.api_keys import SqliteApiKeyRepo
from master.store.sqlite.commands import SqliteCommandRepo
from master.store.sqlite.database import SqliteDatabase
from master.store.sqlite.events import SqliteEventRepo
from master.store.sqlite.gpus import SqliteGpuRepo
from master.store.sqlite.host_rollups import SqliteHostHourlyRollupRepo, SqliteHostRollupRepo
from master.store.sqlite.leases import SqliteLeaseRepo
from master.store.sqlite.revocations import SqliteRevocationRepo
from master.store.sqlite.rollups import SqliteHourlyRollupRepo, SqliteRollupRepo
from master.store.sqlite.secrets import SqliteSecretRepo
from master.store.sqlite.tokens import SqliteTokenRepo


class SqliteStore:
    backend = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = SqliteDatabase(path)
        self.quarantine = Quarantine(self.backend)
        self.metrics = StoreMetrics(self.backend, self.quarantine)
        upkeep = (self._db, self.quarantine, self.metrics)
        self.agents: AgentRepo = SqliteAgentRepo(*upkeep)
        self.gpus: GpuRepo = SqliteGpuRepo(*upkeep)
        self.commands: CommandRepo = SqliteCommandRepo(*upkeep)
        self.tokens: TokenRepo = SqliteTokenRepo(*upkeep)
        self.api_keys: ApiKeyRepo = SqliteApiKeyRepo(*upkeep)
        self.accounts: AccountRepo = SqliteAccountRepo(*upkeep)
        self.events: EventRepo = SqliteEventRepo(*upkeep)
        self.revocations: RevocationRepo = SqliteRevocationRepo(*upkeep)
        self.rollups: RollupRepo = SqliteRollupRepo(*upkeep)
        self.hourly_rollups: RollupRepo = SqliteHourlyRollupRepo(*upkeep)
        self.secrets: SecretRepo = SqliteSecretRepo(*upkeep)
        self.leases: LeaseRepo = SqliteLeaseRepo(self._db)
        self.host_rollups: HostRollupRepo = SqliteHostRollupRepo(*upkeep)
        self.host_hourly_rollups: HostRollupRepo = SqliteHostHourlyRollupRepo(*upkeep)
        self._plugged = PluggedRepositories(self.metrics)

    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo:
        return self._plugged.get(plugin, lambda: plugin.sqlite(self._db, self.quarantine, self.metrics))

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    async def open(self) -> None:
        try:
            await self._db.open()
            await self._db.run(lambda conn: migrate_sqlite(conn, store_name=f"the SQLite store at {self.path}"))
        except (sqlite3.Error, OSError) as exc:  # e.g. "file is not a database", or a folder we may not write
            await self._db.close()
            raise ConfigError(f"cannot open the SQLite store at {self.path}: {exc}") from exc
        except BaseException:
            await self._db.close()
            raise

    async def close(self) -> None:
        await self._db.close()

    def writes_by(self, holder: str, epoch: int) -> None:
        """One Master per file: no writer to tell apart (docs/ha.md)."""

    async def schema_version(self) -> int:
        return await self._db.run(sqlite_schema_version)
