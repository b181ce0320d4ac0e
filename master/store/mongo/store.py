"""The MongoDB store: one collection per aggregate, one document per record, for Masters sharing a replica set.

Some choices are owed to nx-27017, the wire-compatible server the tests run on (0.8.1; each is checked
by the contract tests, each is also correct on a real mongod); they are noted where they are made.
"""

from __future__ import annotations

from pymongo.errors import PyMongoError

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
from master.store.migrations import migrate_mongo, mongo_schema_version
from master.store.mongo.accounts import MongoAccountRepo
from master.store.mongo.agents import MongoAgentRepo
from master.store.mongo.api_keys import MongoApiKeyRepo
from master.store.mongo.commands import MongoCommandRepo
from master.store.mongo.connection import MongoConnection, Writer, redacted
from master.store.mongo.events import MongoEventRepo
from master.store.mongo.gpus import MongoGpuRepo
from master.store.mongo.host_rollups import MongoHostHourlyRollupRepo, MongoHostRollupRepo
from master.store.mongo.leases import MongoLeaseRepo
from master.store.mongo.revocations import MongoRevocationRepo
from master.store.mongo.rollups import MongoHourlyRollupRepo, MongoRollupRepo
from master.store.mongo.secrets import MongoSecretRepo
from master.store.mongo.tokens import MongoTokenRepo
from master.store.plugin import AggregatePlugin, PluggedRepositories, Repo
from master.store.quarantine import Quarantine


class MongoStore:
    backend = "mongodb"

    def __init__(self, url: str) -> None:
        self._conn = MongoConnection(url)
        self.quarantine = Quarantine(self.backend)
        self.metrics = StoreMetrics(self.backend, self.quarantine)
        upkeep = (self._conn, self.quarantine, self.metrics)
        self.agents: AgentRepo = MongoAgentRepo(*upkeep)
        self.gpus: GpuRepo = MongoGpuRepo(*upkeep)
        self.commands: CommandRepo = MongoCommandRepo(*upkeep)
        self.tokens: TokenRepo = MongoTokenRepo(*upkeep)
        self.api_keys: ApiKeyRepo = MongoApiKeyRepo(*upkeep)
        self.accounts: AccountRepo = MongoAccountRepo(*upkeep)
        self.events: EventRepo = MongoEventRepo(*upkeep)
        self.revocations: RevocationRepo = MongoRevocationRepo(*upkeep)
        self.rollups: RollupRepo = MongoRollupRepo(*upkeep)
        self.hourly_rollups: RollupRepo = MongoHourlyRollupRepo(*upkeep)
        self.secrets: SecretRepo = MongoSecretRepo(*upkeep)
        self.leases: LeaseRepo = MongoLeaseRepo(self._conn)
        self.host_rollups: HostRollupRepo = MongoHostRollupRepo(*upkeep)
        self.host_hourly_rollups: HostRollupRepo = MongoHostHourlyRollupRepo(*upkeep)
        self._plugged = PluggedRepositories(self.metrics)

    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo:
        return self._plugged.get(plugin, lambda: plugin.mongo(self._conn, self.quarantine, self.metrics))

    @property
    def url(self) -> str:
        return self._conn.url

    @property
    def database(self) -> str:
        return self._conn.database

    def __repr__(self) -> str:
        return f"MongoStore({redacted(self._conn.url)!r})"

    async def open(self) -> None:
        self._conn.connect()
        try:
            await migrate_mongo(self._conn.db)
        except PyMongoError as exc:
            await self.close()
            raise ConfigError(f"cannot open the MongoDB store at {redacted(self._conn.url)}: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._conn.disconnect()

    def writes_by(self, holder: str, epoch: int) -> None:
        self._conn.writer = Writer(holder, epoch)

    async def schema_version(self) -> int:
        return await mongo_schema_version(self._conn.db)
