"""Renters' serverless endpoints (docs/endpoints.md, "The endpoint resource"): create, read, list, update, delete,
and their invocation keys: create (the key shown once), list, revoke, and the check a request's route makes
(``authorize_invocation``).

``account``: the renter account a call is limited to (the API's ``Scope.owner``), None for the operator; another
account's endpoint answers NotFound, as a missing one does. An endpoint's worker spec is checked as a workload's is at
submit (the workload book's checks, then whether it could ever run on this grid), at create and at every update.

An invocation key is not an API key: it is stored in its own aggregate, hashed, and the API's authentication never
finds it, so it opens no other route; it names one endpoint, and ``authorize_invocation`` refuses it for any other.
It spends nothing itself: requests run on the endpoint's workers, which its owner pays for.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from common.errors import Conflict, IdlegridError, NotFound
from management.endpoints.queue import QueueLimits
from management.endpoints.scaler import EndpointScale
from management.endpoints.spec import (
    INVOCATION_KEY_PREFIX,
    EndpointKeyRecord,
    EndpointRecord,
    EndpointSpec,
    EndpointSpecJson,
    hash_key,
    new_endpoint_id,
    new_invocation_key,
)
from management.store import EndpointKeyRepo, EndpointRepo
from master.port import SEALED, SecretShelf, WorkloadSpec

__all__ = [
    "EndpointsService",
    "InvalidEndpointSpec",
    "Invocation",
    "InvocationForbidden",
    "InvocationRefused",
    "IssuedInvocationKey",
    "MAX_ENDPOINTS_PER_ACCOUNT",
    "MAX_KEYS_PER_ENDPOINT",
]

MAX_ENDPOINTS_PER_ACCOUNT = 50
MAX_KEYS_PER_ENDPOINT = 20  # keys not revoked
MAX_KEY_NAME = 100

SpecCheck = Callable[[str, WorkloadSpec], Awaitable[None]]


class InvalidEndpointSpec(IdlegridError):
    """An endpoint's spec, or a change to it, that does not decode or breaks a bound (the request's fault: 400)."""

    code = "invalid_endpoint_spec"


class InvocationRefused(IdlegridError):
    """A bearer key that is not a live invocation key (401 on a request route)."""

    code = "unauthorized"


class InvocationForbidden(IdlegridError):
    """A live invocation key of another endpoint (403 on a request route)."""

    code = "forbidden"


@dataclass(frozen=True)
class IssuedInvocationKey:
    key: str  # shown once; only its hash is stored
    record: EndpointKeyRecord


@dataclass(frozen=True)
class Invocation:
    """What ``authorize_invocation`` let through: the endpoint (its owner pays) and the key that called."""

    endpoint: EndpointRecord
    key: EndpointKeyRecord


class EndpointsService:
    def __init__(
        self,
        secrets: SecretShelf,
        endpoints: EndpointRepo,
        keys: EndpointKeyRepo,
        *,
        check_worker: SpecCheck,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``check_worker(account, spec)``: refuses a worker spec as a workload's submit would (the book's checks,
        then the market's "could it ever run here"), raising the same errors."""
        self._secrets = secrets
        self._endpoints = endpoints
        self._keys = keys
        self._check_worker = check_worker
        self._clock = clock
        # Each endpoint's request bounds, for the request queue's synchronous reads (a worker's take, a report):
        # read at load, kept by this service, the only writer of endpoints.
        self._limits: dict[str, QueueLimits] = {}
        # The endpoints and invocation keys read so far, kept true by this service, the only writer of both, so that a
        # request's route checks its key and reads its endpoint from memory (docs/endpoints.md, "The request path's
        # cost"). Emptied at each load (a Master that takes over reads the store afresh); a miss reads the store.
        self._records: dict[str, EndpointRecord] = {}
        self._key_by_hash: dict[str, EndpointKeyRecord] = {}
        self._deleted: list[Callable[[EndpointRecord], Awaitable[None]]] = []

    def when_deleted(self, listener: Callable[[EndpointRecord], Awaitable[None]]) -> None:
        """Call ``listener`` with each endpoint deleted, after it is gone (the request routes end its open requests)."""
        self._deleted.append(listener)
        self.loaded = False  # the bounds read from the store (the composition's check)
        # What the autoscaler's last tick found for an endpoint (management/endpoints/scaler.py; set by the composition).
        self.scale_of: Callable[[str], EndpointScale | None] = lambda _endpoint_id: None
        # A load-balanced endpoint's URL on the links listener (set by the composition); None in queue mode.
        self.url_of: Callable[[EndpointRecord], str | None] = lambda _record: None

    async def load(self) -> None:
        """Read every endpoint's request bounds (at start, and on the Master that takes over)."""
        records = await self._endpoints.list()
        self._records = {record.id: record for record in records}
        self._limits = {record.id: record.spec.limits() for record in records}
        self._key_by_hash = {}
        self.loaded = True

    def limits_of(self, endpoint_id: str) -> QueueLimits:
        """The endpoint's request bounds; the defaults for one deleted (its last requests end under them)."""
        return self._limits.get(endpoint_id) or QueueLimits()

    # --- endpoints

    async def create(self, account: str, spec: EndpointSpec) -> EndpointRecord:
        """A new endpoint of ``account``; its name is unique within the account (Conflict)."""
        await self._check_worker(account, spec.worker_spec())
        owned = await self._endpoints.list(account=account)
        if any(e.spec.name == spec.name for e in owned):
            raise Conflict(f"account {account!r} already has an endpoint named {spec.name!r}; choose another name")
        if len(owned) >= MAX_ENDPOINTS_PER_ACCOUNT:
            raise Conflict(
                f"account {account!r} holds {len(owned)} endpoints, the most an account may; delete one it no longer uses"
            )
        now = self._clock()
        spec, sealed = self._sealed(spec)
        record = EndpointRecord(
            id=new_endpoint_id(), account=account, spec=spec, created_at=now, updated_at=now, sealed_registry_password=sealed
        )
        await self._endpoints.put(record)
        self._records[record.id] = record
        self._limits[record.id] = spec.limits()
        return record

    async def get(self, endpoint_id: str, *, account: str | None = None) -> EndpointRecord:
        record = await self._record(endpoint_id)
        if record is None or (account is not None and record.account != account):
            raise NotFound(f"no endpoint {endpoint_id!r}")
        return record

    async def _record(self, endpoint_id: str) -> EndpointRecord | None:
        """The endpoint from memory, or from the store the first time it is asked for since the load."""
        record = self._records.get(endpoint_id)
        if record is None:
            record = await self._endpoints.get(endpoint_id)
            if record is not None:
                self._records[record.id] = record
        return record

    def _forget(self, endpoint_id: str) -> None:
        self._records.pop(endpoint_id, None)
        self._key_by_hash = {h: k for h, k in self._key_by_hash.items() if k.endpoint != endpoint_id}

    async def list(self, *, owner: str | None = None, account: str | None = None) -> builtins.list[EndpointRecord]:
        """By creation. ``owner`` limits it to one account whatever ``account`` asks (another's finds nothing)."""
        if owner is not None:
            if account is not None and account != owner:
                return []
            account = owner
        return await self._endpoints.list(account=account)

    async def update(self, endpoint_id: str, changes: EndpointSpecJson, *, account: str | None = None) -> EndpointRecord:
        """Change some of the spec's fields (``changes``, JSON: a field given replaces the stored one; the tables
        ``scaling``, ``replica`` and ``constraints`` are merged field by field). The env's values and the registry
        password are kept unless given again. The result is checked as at create."""
        record = await self.get(endpoint_id, account=account)
        current = msgspec.to_builtins(record.spec)
        merged = dict(current)
        for field, value in changes.items():
            if field in ("scaling", "replica", "constraints") and isinstance(value, dict):
                merged[field] = {**current.get(field, {}), **value}
            else:
                merged[field] = value
        try:
            spec = msgspec.convert(merged, EndpointSpec)
        except msgspec.ValidationError as exc:
            raise InvalidEndpointSpec(f"the changed spec is refused: {exc}") from None
        if "registry_auth" in changes:  # a new password (checked as given), or none
            await self._check_worker(record.account, spec.worker_spec())
            spec, sealed = self._sealed(spec)
        else:  # the stored one, SEALED in the spec: the check sees it opened, as at create
            sealed = record.sealed_registry_password
            await self._check_worker(record.account, self.worker_spec(msgspec.structs.replace(record, spec=spec)))
        if spec.name != record.spec.name:
            owned = await self._endpoints.list(account=record.account)
            if any(e.spec.name == spec.name for e in owned if e.id != record.id):
                raise Conflict(f"account {record.account!r} already has an endpoint named {spec.name!r}; choose another name")
        record = msgspec.structs.replace(record, spec=spec, sealed_registry_password=sealed, updated_at=self._clock())
        await self._endpoints.put(record)
        self._records[record.id] = record
        self._limits[record.id] = spec.limits()
        return record

    async def delete(self, endpoint_id: str, *, account: str | None = None) -> EndpointRecord:
        """Remove an endpoint and its invocation keys (they stop working at once)."""
        record = await self.get(endpoint_id, account=account)
        self._forget(record.id)  # from here on no key of it is let through, whatever the store's writes do
        await self._keys.delete_of(record.id)
        await self._endpoints.delete(record.id)
        self._forget(record.id)  # and nothing a read under way meanwhile found stays
        for listener in self._deleted:
            await listener(record)
        self._limits.pop(record.id, None)  # after its requests ended: they end under its own bounds
        return record

    def worker_spec(self, record: EndpointRecord) -> WorkloadSpec:
        """The workload each of the endpoint's workers is submitted as, its registry password opened from the record
        (the workload book seals it again in the worker's record)."""
        worker = record.spec.worker_spec()
        if worker.registry_auth is not None and record.sealed_registry_password:
            auth = msgspec.structs.replace(worker.registry_auth, password=self._secrets.unseal(record.sealed_registry_password))
            worker = msgspec.structs.replace(worker, registry_auth=auth)
        return worker

    def _sealed(self, spec: EndpointSpec) -> tuple[EndpointSpec, str]:
        """The spec to store (its registry password replaced by SEALED) and the password sealed ("" for none)."""
        if spec.registry_auth is None:
            return spec, ""
        sealed = self._secrets.seal(spec.registry_auth.password)
        return msgspec.structs.replace(spec, registry_auth=msgspec.structs.replace(spec.registry_auth, password=SEALED)), sealed

    # --- invocation keys

    async def create_key(self, endpoint_id: str, name: str, *, account: str | None = None) -> IssuedInvocationKey:
        endpoint = await self.get(endpoint_id, account=account)
        name = name.strip() or "invocation key"
        if len(name) > MAX_KEY_NAME:
            raise InvalidEndpointSpec(f"name: {MAX_KEY_NAME} characters at most")
        active = sum(1 for k in await self._keys.list(endpoint.id) if k.revoked_at is None)
        if active >= MAX_KEYS_PER_ENDPOINT:
            raise Conflict(
                f"endpoint {endpoint.id} holds {active} invocation keys, the most an endpoint may; revoke one it no longer uses"
            )
        key_id, key = new_invocation_key()
        record = EndpointKeyRecord(
            id=key_id, endpoint=endpoint.id, account=endpoint.account, name=name, key_hash=hash_key(key), created_at=self._clock()
        )
        await self._keys.put(record)
        self._key_by_hash[record.key_hash] = record
        return IssuedInvocationKey(key, record)

    async def keys(self, endpoint_id: str, *, account: str | None = None) -> builtins.list[EndpointKeyRecord]:
        endpoint = await self.get(endpoint_id, account=account)
        return await self._keys.list(endpoint.id)

    async def revoke_key(self, endpoint_id: str, key_id: str, *, account: str | None = None) -> EndpointKeyRecord:
        """Refuse the key from now on. Revoking a revoked key changes nothing."""
        endpoint = await self.get(endpoint_id, account=account)
        found = next((k for k in await self._keys.list(endpoint.id) if k.id == key_id), None)
        if found is None:
            raise NotFound(f"endpoint {endpoint.id} has no invocation key {key_id!r}")
        if found.revoked_at is None:
            found = msgspec.structs.replace(found, revoked_at=self._clock())
            self._key_by_hash.pop(found.key_hash, None)  # refused from now on, even while the store's write is under way
            await self._keys.put(found)
        self._key_by_hash[found.key_hash] = found
        return found

    async def authorize_invocation(self, endpoint_id: str, key: str) -> Invocation:
        """The check every request route of an endpoint makes with the caller's bearer ``key``: InvocationRefused (401)
        for a key that is not a live invocation key, InvocationForbidden (403) for one of another endpoint. Read from
        memory (read from the store once, then kept true by this service's own create, revoke and delete, and read
        afresh at each load: a Master that takes over), so a revoke or a delete takes effect at once."""
        key = key.strip()
        if not key.startswith(INVOCATION_KEY_PREFIX):
            raise InvocationRefused(
                f"send one of this endpoint's invocation keys ({INVOCATION_KEY_PREFIX}...) as 'Authorization: Bearer <key>'; "
                "make one with 'idlegrid endpoint keys create ENDPOINT'"
            )
        key_hash = hash_key(key)
        record = self._key_by_hash.get(key_hash)
        if record is None:
            record = await self._keys.by_hash(key_hash)
            if record is None:  # not remembered: a made-up key costs a read each time, as before
                raise InvocationRefused("invocation key not recognised")
            if record.endpoint in self._records or await self._record(record.endpoint) is not None:
                self._key_by_hash[key_hash] = record
        if record.revoked_at is not None:
            raise InvocationRefused(f"invocation key {record.id} ({record.name!r}) was revoked; use another key")
        if record.endpoint != endpoint_id:
            raise InvocationForbidden(f"invocation key {record.id} invokes endpoint {record.endpoint} only, not {endpoint_id!r}")
        endpoint = await self._record(endpoint_id)
        if endpoint is None:  # deleted between the two reads: its keys go with it
            raise InvocationRefused("invocation key not recognised")
        return Invocation(endpoint, record)
