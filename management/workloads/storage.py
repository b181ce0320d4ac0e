"""A workload's object storage and secrets, between its spec and its hosts. Pure: no I/O.

- ``check_storage(spec, secret_names)``: at submit (and rent), what the struct cannot check alone: the locations
  parse, the paths do not overlap, storage has credentials, and every secret the spec names exists in the account.
- ``secret_names(spec)``: the secrets a spec uses (its storage credentials, its env's ``${secret:NAME}`` values).
- ``container_storage(spec, secrets)``: what a host receives, the credentials secret resolved to its keys (the runner
  reads the secrets from the Master's vault just before it builds the create command; ``spec.container_spec`` puts the
  env's ``${secret:NAME}`` values in place).
- ``stop_grace(spec, grace_s, most_s)``: the SIGTERM-to-SIGKILL time a stop gives this workload.

docs/storage.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from common.storage import (
    BadCredentials,
    ContainerStorage,
    InvalidLocation,
    StorageMount,
    clean_path,
    parse_credentials,
    secret_ref,
    split_uri,
)
from management.workloads.spec import InvalidWorkloadSpec
from master.port import EventRecord, WorkloadSpec

STORAGE_EVENT_PREFIX = "storage."  # the Master records a host's transfers for a workload as storage.<what>
RECENT_TRANSFERS = 10

__all__ = [
    "STORAGE_EVENT_PREFIX",
    "StorageSummary",
    "summarize",
    "UnusableSecret",
    "check_storage",
    "container_storage",
    "secret_names",
    "stop_grace",
]


def _mounts(spec: WorkloadSpec) -> list[tuple[str, StorageMount]]:
    named = [(f"inputs[{i}]", m) for i, m in enumerate(spec.inputs)]
    named += [(f"outputs[{i}]", m) for i, m in enumerate(spec.outputs)]
    if spec.checkpoint is not None:
        named.append(("checkpoint", StorageMount(uri=spec.checkpoint.uri, path=spec.checkpoint.path)))
    return named


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def check_storage(spec: WorkloadSpec, secret_names_here: Collection[str]) -> None:
    """Refuse, naming the field, storage that cannot work and secrets the account does not have; InvalidWorkloadSpec."""
    named = _mounts(spec)
    if named and spec.storage is None:
        raise InvalidWorkloadSpec(
            f"{named[0][0]}: storage locations need 'storage' with the name of your credentials secret "
            "(idlegrid secret create NAME; --storage-credentials NAME)"
        )
    paths: list[tuple[str, str]] = []
    for where, mount in named:
        try:
            split_uri(mount.uri)
            path = clean_path(mount.path)
        except InvalidLocation as exc:
            raise InvalidWorkloadSpec(f"{where}: {exc}") from None
        for other_where, other in paths:
            if _overlap(path, other):
                raise InvalidWorkloadSpec(f"{where}: path {path} overlaps {other_where}'s {other}: give each its own directory")
        paths.append((where, path))
    missing = sorted(secret_names(spec) - set(secret_names_here))
    if missing:
        raise InvalidWorkloadSpec(
            f"no secret named {', '.join(map(repr, missing))} in this account: create it first (idlegrid secret create NAME)"
        )


def secret_names(spec: WorkloadSpec) -> set[str]:
    names = {name for value in spec.env.values() if (name := secret_ref(value)) is not None}
    if spec.storage is not None and _mounts(spec):
        names.add(spec.storage.credentials)
    return names


class UnusableSecret(InvalidWorkloadSpec):
    """A secret that exists but cannot serve as what the spec uses it for (credentials of the wrong shape)."""


def _per_replica(uri: str, replica: int) -> str:
    return f"{uri.rstrip('/')}/replica-{replica}/"


def container_storage(spec: WorkloadSpec, secrets: Mapping[str, str], replica: int = 0) -> ContainerStorage | None:
    """The storage a host gets, with the credentials secret resolved; None when the workload names no location. The
    replicas of a gang each get their own checkpoint and outputs under ``replica-<n>/`` (two writers of one manifest
    would undo each other's checkpoints); a single replica uses the locations as written."""
    if spec.storage is None or not _mounts(spec):
        return None
    access, checkpoint = spec.storage, spec.checkpoint

    def own(uri: str) -> str:
        return _per_replica(uri, replica) if spec.replicas > 1 else uri

    try:
        credentials = parse_credentials(secrets[access.credentials])
    except BadCredentials as exc:
        raise UnusableSecret(f"storage.credentials: secret {access.credentials!r} is not a key pair: {exc}") from None
    return ContainerStorage(
        credentials=credentials,
        endpoint=access.endpoint,
        region=access.region,
        path_style=access.path_style,
        inputs=[StorageMount(uri=m.uri, path=clean_path(m.path)) for m in spec.inputs],
        outputs=[StorageMount(uri=own(m.uri), path=clean_path(m.path)) for m in spec.outputs],
        checkpoint=None if checkpoint is None else msgspec.structs.replace(checkpoint, uri=own(checkpoint.uri)),
    )


def stop_grace(spec: WorkloadSpec, grace_s: float, most_s: float) -> float:
    """The workload's own grace when it set one (bounded by ``most_s``), else the grid's ``grace_s``."""
    return grace_s if spec.stop_grace_s is None else min(spec.stop_grace_s, most_s)


@dataclass(frozen=True)
class Transfer:
    at: float
    what: str  # inputs_fetched | checkpoint_restored | checkpoint_uploaded | outputs_uploaded | upload_failed
    host: str
    bytes: int
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class StorageSummary:
    """What a workload's page says of its data: the last checkpoint (when it was taken, how large it is whole), the
    last restore, the time spent moving data, the last failure, and the latest transfers."""

    checkpoint_at: float | None = None
    checkpoint_bytes: int | None = None
    checkpoint_uploads: int = 0
    restored_at: float | None = None  # the time of the checkpoint the latest run started from
    transfer_s: float = 0.0
    last_error: str = ""
    recent: list[Transfer] = field(default_factory=list)


def summarize(events: Sequence[EventRecord]) -> StorageSummary:
    """``storage.*`` events of one workload, oldest first, as its page shows them."""
    checkpoint_at = checkpoint_bytes = restored_at = None
    uploads, transfer_s, last_error = 0, 0.0, ""
    transfers: list[Transfer] = []
    for e in events:
        what = e.kind.removeprefix(STORAGE_EVENT_PREFIX)
        d = e.data
        taken = float(d.get("taken_at") or e.ts)
        if what == "checkpoint_uploaded":
            uploads += 1
            checkpoint_at, checkpoint_bytes = taken, int(d.get("total_bytes", 0))
        elif what == "checkpoint_restored":
            restored_at = taken
            if checkpoint_at is None:
                checkpoint_at, checkpoint_bytes = taken, int(d.get("total_bytes", 0))
        if what == "upload_failed":
            last_error = str(d.get("error", ""))
        transfer_s += float(d.get("seconds", 0.0))
        transfers.append(
            Transfer(
                e.ts,
                what,
                str(d.get("agent_id", "")),
                int(d.get("bytes", 0)),
                float(d.get("seconds", 0.0)),
                str(d.get("error", "")),
            )
        )
    return StorageSummary(
        checkpoint_at=checkpoint_at,
        checkpoint_bytes=checkpoint_bytes,
        checkpoint_uploads=uploads,
        restored_at=restored_at,
        transfer_s=transfer_s,
        last_error=last_error,
        recent=transfers[-RECENT_TRANSFERS:],
    )
