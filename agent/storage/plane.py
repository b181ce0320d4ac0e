"""``DataPlane``: a container's object storage from its create to its delete.

- ``prepare(spec)`` (before the runtime creates it): the bucket of every location answers with the renter's keys; the
  inputs are fetched into the host's cache (or found there) and linked into place; the checkpoint is restored; the
  output and checkpoint directories are made. It returns the spec with the variables the program reads
  (``IDLEGRID_CHECKPOINT_DIR``, ``IDLEGRID_RESTORED``, ``IDLEGRID_CHECKPOINT_TIME``, ``IDLEGRID_INPUT_DIR``,
  ``IDLEGRID_OUTPUT_DIR``) and the directories to mount. A failure the renter can act on (keys refused, no bucket,
  no input, inputs too large for this host) raises its ``RenterFault``, so the create fails as the renter's.
- while it runs, every ``checkpoint.period_s``: what changed in the checkpoint directory and the outputs is uploaded.
- ``finish(name)`` (at its delete, once the runtime stopped it: SIGTERM, the grace, SIGKILL): a last upload of the
  checkpoint and the outputs, bounded by ``final_upload_s``, then its data is removed from the host.

Each transfer is reported (``StorageActivity``) through ``report``. A host's transfers share ``transfer_slots`` at
``bytes_per_s`` in all, so a checkpoint upload cannot starve the control link or another renter's transfers.

Where the data sits: ``<root>/<container>/mnt/<path in the container>``, with ``<root>``, ``<root>/<container>`` and
its ``mnt`` the agent's and 0700: no other uid has a path to a container's data, whatever modes the program gives
its files. A container reaches its own only through the binds its runtime makes: docker at the path the spec names,
the process runtime (as root) at ``/idlegrid<path>`` in the container's mount namespace (``data_root``), where the
runtime also gives the directories to the container's uid. Only an agent that is not root, whose containers run as
its own user, has the variables name the host paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agent.runtime.base import Mount
from agent.storage.cache import InputCache
from agent.storage.checkpoint import (
    Manifest,
    Seen,
    decode_manifest,
    encode_manifest,
    manifest_key,
    plain_changes,
    plan_upload,
    safe_rel,
    scan,
)
from agent.storage.objects import ObjectStore, TransferLimits, bulk_pool, open_inside
from common.containers import ContainerSpec
from common.egress import EgressRule
from common.errors import IdlegridError, StorageNotFound
from common.files import write_atomically
from common.storage import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_TIME,
    ENV_INPUT_DIR,
    ENV_OUTPUT_DIR,
    ENV_RESTORED,
    ContainerStorage,
    StorageActivity,
    StorageMount,
    split_uri,
)

log = logging.getLogger(__name__)


class StorageSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The host's side of storage (agent/config.py maps its settings here)."""

    root: str
    cache_budget_bytes: int = 50 * 1024**3
    bytes_per_s: int = 0  # every transfer of this host together; 0: unbounded
    transfer_slots: int = 2  # transfers at once (each gets bytes_per_s / transfer_slots)
    part_bytes: int = 16 * 1024 * 1024
    final_upload_s: float = 600.0  # the longest a last upload at a delete may take
    # Files of part_bytes or more move in processes of their own (one per transfer slot), off the agent's interpreter.
    bulk_processes: bool = True
    egress: EgressRule = EgressRule()  # where transfers may connect: public addresses and what the provider allows


@dataclass
class _Placed:
    name: str
    workload_id: str | None
    storage: ContainerStorage
    store: ObjectStore
    data_dir: Path
    checkpoint_dir: Path | None
    outputs: list[tuple[Path, str, str]]  # (host dir, bucket, prefix)
    manifest: Manifest | None = None
    manifest_read: bool = False
    sent: dict[str, dict[str, Seen]] = field(default_factory=dict)  # outputs already uploaded, per output dir
    task: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _Record(msgspec.Struct, kw_only=True):
    """What a restarted agent needs to go on syncing a container's data (0600: it holds the renter's keys)."""

    workload_id: str | None
    storage: ContainerStorage


def _prefix(key: str) -> str:
    return key if not key or key.endswith("/") else key + "/"


def _place(mnt: Path, container_path: str) -> Path:
    return mnt / container_path.lstrip("/")


class DataPlane:
    def __init__(
        self,
        settings: StorageSettings,
        report: Callable[[str, StorageActivity], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``report(container, activity)``: a transfer done (the daemon sends it to the Master as an event)."""
        self.settings = settings
        self.root = Path(settings.root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the agent's: a container reaches its own data through its binds only
        self._records = self.root / ".records"
        self._records.mkdir(mode=0o700, exist_ok=True)
        self.cache = InputCache(self.root / ".cache", settings.cache_budget_bytes, clock)
        self._report = report
        self._clock = clock
        self._slots = asyncio.Semaphore(max(1, settings.transfer_slots))
        self._bulk = bulk_pool(max(1, settings.transfer_slots)) if settings.bulk_processes else None
        self._placed: dict[str, _Placed] = {}

    @property
    def limits(self) -> TransferLimits:
        slots = max(1, self.settings.transfer_slots)
        return TransferLimits(
            bytes_per_s=self.settings.bytes_per_s // slots, part_bytes=self.settings.part_bytes, egress=self.settings.egress
        )

    # --- before the create -------------------------------------------------------------------------------

    async def prepare(self, spec: ContainerSpec, *, host_paths: bool, data_root: str = "") -> tuple[ContainerSpec, list[Mount]]:
        """Make ``spec``'s data ready; the spec to create (its variables added) and what to mount. The variables name
        the host paths (``host_paths``), or where the runtime binds them: ``data_root`` + the spec's path."""
        storage = spec.storage
        if storage is None:
            return spec, []
        placed = self._placed.get(spec.name)
        if placed is None:
            placed = self._open(spec.name, spec.workload_id, storage)
        try:
            env, mounts = await self._fill(placed, host_paths=host_paths, data_root=data_root)
        except BaseException:
            await self._drop(placed)
            raise
        self._start_sync(placed)
        return msgspec.structs.replace(spec, env={**spec.env, **env}), mounts

    def _open(self, name: str, workload_id: str | None, storage: ContainerStorage) -> _Placed:
        data_dir = self.root / name
        mnt = data_dir / "mnt"
        checkpoint_dir = _place(mnt, storage.checkpoint.path) if storage.checkpoint is not None else None
        outputs = []
        for out in storage.outputs:
            bucket, key = split_uri(out.uri)
            outputs.append((_place(mnt, out.path), bucket, _prefix(key)))
        placed = _Placed(
            name, workload_id, storage, ObjectStore(storage, self.limits, self._bulk), data_dir, checkpoint_dir, outputs
        )
        self._placed[name] = placed
        write_atomically(
            self._records / f"{name}.json", msgspec.json.encode(_Record(workload_id=workload_id, storage=storage)), mode=0o600
        )
        return placed

    async def _fill(self, p: _Placed, *, host_paths: bool, data_root: str) -> tuple[dict[str, str], list[Mount]]:
        mnt = p.data_dir / "mnt"
        mnt.mkdir(parents=True, exist_ok=True)
        for d in (p.data_dir, mnt):
            os.chmod(d, 0o700)  # no other uid has a path below: the container gets its directories by binds
        uris = [m.uri for m in [*p.storage.inputs, *p.storage.outputs]]
        uris += [p.storage.checkpoint.uri] if p.storage.checkpoint is not None else []
        for bucket in sorted({split_uri(uri)[0] for uri in uris}):
            await p.store.check_bucket(bucket)
        env: dict[str, str] = {}
        mounts: list[Mount] = []

        def where(container_path: str) -> str:
            return str(_place(mnt, container_path)) if host_paths else data_root + container_path

        for i, mount in enumerate(p.storage.inputs):
            target = _place(mnt, mount.path)
            await self._fetch_inputs(p, mount, target)
            mounts.append(Mount(target, mount.path, writable=False))
            if i == 0:
                env[ENV_INPUT_DIR] = where(mount.path)
        for i, (out_dir, _, _) in enumerate(p.outputs):
            out_dir.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(out_dir, p.storage.outputs[i].path, writable=True))
            if i == 0:
                env[ENV_OUTPUT_DIR] = where(p.storage.outputs[i].path)
        checkpoint = p.storage.checkpoint
        if checkpoint is not None and p.checkpoint_dir is not None:
            p.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            restored = await self._restore(p)
            env[ENV_CHECKPOINT_DIR] = where(checkpoint.path)
            if restored is not None:
                env[ENV_RESTORED] = "1"
                env[ENV_CHECKPOINT_TIME] = f"{restored.time:.3f}"
            mounts.append(Mount(p.checkpoint_dir, checkpoint.path, writable=True))
        return env, mounts

    async def _fetch_inputs(self, p: _Placed, mount: StorageMount, target: Path) -> None:
        bucket, key = split_uri(mount.uri)
        if key and not key.endswith("/"):
            objects = [(await p.store.head(bucket, key), Path(key).name)]
        else:
            listed = await p.store.list(bucket, key)
            objects = [(o, o.key[len(key) :]) for o in listed if not o.key.endswith("/")]
            if not objects:
                raise StorageNotFound(f"input {mount.uri}: no object under that prefix")
        started, moved, cached = self._clock(), 0, 0
        for obj, rel in objects:
            if not safe_rel(rel):
                continue  # a key that would land outside the input directory is not placed
            async with self._slots:
                got = await self.cache.ensure(p.store, bucket, obj, holder=p.name)
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)
            try:
                os.link(got.path, dest)  # the bytes stay on disk once; 0444 and root's: the renter reads, never writes
            except OSError:
                shutil.copyfile(got.path, dest)
            moved += obj.size if got.fetched else 0
            cached += 0 if got.fetched else obj.size
        self._tell(
            p,
            StorageActivity(
                what="inputs_fetched",
                bytes=moved,
                cached=cached,
                files=len(objects),
                seconds=self._clock() - started,
                taken_at=self._clock(),
            ),
        )

    async def _restore(self, p: _Placed) -> Manifest | None:
        """The checkpoint the manifest names, into the checkpoint directory; None when there is none yet."""
        assert p.storage.checkpoint is not None and p.checkpoint_dir is not None
        bucket, key = split_uri(p.storage.checkpoint.uri)
        prefix = _prefix(key)
        started = self._clock()
        raw = await p.store.get_bytes(bucket, manifest_key(prefix))
        p.manifest_read = True
        if raw is None:
            return None
        try:
            manifest = decode_manifest(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("checkpoint manifest unreadable: starting afresh", extra={"container": p.name})
            return None
        moved = 0
        for rel, entry in manifest.files.items():
            if not safe_rel(rel):
                continue
            dest = p.checkpoint_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            async with self._slots:
                await p.store.fetch(bucket, entry.key, dest, size=entry.size)
            if entry.mtime_ns:
                os.utime(dest, ns=(entry.mtime_ns, entry.mtime_ns))  # unchanged files are not sent back
            moved += entry.size
        p.manifest = manifest
        self._tell(
            p,
            StorageActivity(
                what="checkpoint_restored",
                bytes=moved,
                total_bytes=manifest.size,
                files=len(manifest.files),
                seconds=self._clock() - started,
                taken_at=manifest.time,
            ),
        )
        return manifest

    # --- while it runs ----------------------------------------------------------------------------------------

    def _start_sync(self, p: _Placed) -> None:
        period = p.storage.checkpoint.period_s if p.storage.checkpoint is not None else None
        if period is None and not p.outputs:
            return
        if p.task is None or p.task.done():
            p.task = asyncio.create_task(self._every(p, period or 300.0), name=f"storage-sync-{p.name}")

    async def _every(self, p: _Placed, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.sync(p.name)
            except IdlegridError as exc:  # reported; the next period tries again
                self._tell(p, StorageActivity(what="upload_failed", error=str(exc)[:1000], taken_at=self._clock()))

    async def sync(self, name: str) -> None:
        """Upload what changed in ``name``'s checkpoint and outputs now."""
        p = self._placed.get(name)
        if p is None:
            return
        async with p.lock:
            await self._upload_checkpoint(p)
            await self._upload_outputs(p)

    async def _upload_checkpoint(self, p: _Placed) -> None:
        if p.storage.checkpoint is None or p.checkpoint_dir is None or not p.checkpoint_dir.exists():
            return
        bucket, key = split_uri(p.storage.checkpoint.uri)
        prefix = _prefix(key)
        if not p.manifest_read:  # a restarted agent: what the store holds is the last checkpoint
            raw = await p.store.get_bytes(bucket, manifest_key(prefix))
            p.manifest = decode_manifest(raw) if raw is not None else None
            p.manifest_read = True
        started = self._clock()
        plan = plan_upload(prefix, scan(p.checkpoint_dir), p.manifest, taken_at=started)
        if not plan.changed:
            return
        moved = 0
        for rel, object_key in list(plan.send.items()):
            source = open_inside(p.checkpoint_dir, rel)
            if source is None:  # gone since the scan, or not a file of its own: not part of this checkpoint
                plan.send.pop(rel)
                plan.manifest.files.pop(rel, None)
                continue
            async with self._slots:
                with source:
                    sent = await p.store.put(source, bucket, object_key)
            entry = plan.manifest.files[rel]
            if sent != entry.size:  # rewritten since the scan: the manifest says what went up (its mtime differs next scan)
                plan.manifest.files[rel] = msgspec.structs.replace(entry, size=sent)
            moved += sent
        await p.store.put_bytes(encode_manifest(plan.manifest), bucket, manifest_key(prefix))
        p.manifest = plan.manifest
        for old in plan.drop:
            await p.store.delete(bucket, old)
        self._tell(
            p,
            StorageActivity(
                what="checkpoint_uploaded",
                bytes=moved,
                total_bytes=plan.manifest.size,
                files=len(plan.send),
                seconds=self._clock() - started,
                taken_at=plan.manifest.time,
            ),
        )

    async def _upload_outputs(self, p: _Placed) -> None:
        started, moved, files = self._clock(), 0, 0
        for out_dir, bucket, prefix in p.outputs:
            if not out_dir.exists():
                continue
            now = scan(out_dir)
            sent = p.sent.setdefault(str(out_dir), {})
            for rel in plain_changes(now, sent):
                source = open_inside(out_dir, rel)
                if source is None:  # gone since the scan, or not a file of its own
                    continue
                async with self._slots:
                    with source:
                        moved += await p.store.put(source, bucket, prefix + rel)
                sent[rel] = now[rel]
                files += 1
        if files:
            self._tell(p, StorageActivity(what="outputs_uploaded", bytes=moved, files=files, seconds=self._clock() - started))

    # --- at the delete ------------------------------------------------------------------------------------------

    async def finish(self, name: str) -> None:
        """The last upload (the container has stopped), then the container's data leaves the host."""
        p = self._placed.get(name)
        if p is None:
            return
        if p.task is not None:
            p.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await p.task
        try:
            await asyncio.wait_for(self.sync(name), self.settings.final_upload_s)
        except (IdlegridError, TimeoutError) as exc:
            why = str(exc) or f"took longer than {self.settings.final_upload_s:g} s"
            self._tell(p, StorageActivity(what="upload_failed", error=why[:1000], taken_at=self._clock()))
        await self._drop(p)

    async def discard(self, name: str) -> None:
        """Forget ``name``'s data without uploading (its create failed: nothing ran)."""
        p = self._placed.get(name)
        if p is not None:
            await self._drop(p)

    async def _drop(self, p: _Placed) -> None:
        if p.task is not None and not p.task.done():
            p.task.cancel()
        self._placed.pop(p.name, None)
        self.cache.release(p.name)
        p.store.close()
        (self._records / f"{p.name}.json").unlink(missing_ok=True)
        await asyncio.to_thread(shutil.rmtree, p.data_dir, True)

    # --- a restarted agent ------------------------------------------------------------------------------------

    def resume(self, present: set[str]) -> list[str]:
        """Go on syncing the containers a previous agent process prepared that are still on the host; forget the
        data of those that are not (their last upload was lost with that process). Returns the names resumed."""
        resumed = []
        for path in sorted(self._records.glob("*.json")):
            name = path.stem
            try:
                record = msgspec.json.decode(path.read_bytes(), type=_Record)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                path.unlink(missing_ok=True)
                continue
            if name not in present:
                path.unlink(missing_ok=True)
                shutil.rmtree(self.root / name, ignore_errors=True)
                continue
            placed = self._open(name, record.workload_id, record.storage)
            for out_dir, _b, _p in placed.outputs:  # what is there was uploaded or will be at the next period
                placed.sent[str(out_dir)] = {}
            self._start_sync(placed)
            resumed.append(name)
        return resumed

    async def close(self) -> None:
        """Stop syncing (the agent stops; containers outlive it and a restarted agent resumes them)."""
        for p in list(self._placed.values()):
            if p.task is not None:
                p.task.cancel()
            p.store.close()
        self._placed.clear()
        if self._bulk is not None:
            self._bulk.shutdown(wait=False, cancel_futures=True)

    def _tell(self, p: _Placed, activity: StorageActivity) -> None:
        activity = msgspec.structs.replace(activity, workload_id=p.workload_id)
        log.info("storage %s", activity.what, extra={"container": p.name, "bytes": activity.bytes, "seconds": activity.seconds})
        try:
            self._report(p.name, activity)
        except Exception:  # a report that cannot be sent must not stop the data moving
            log.exception("storage report not sent")
