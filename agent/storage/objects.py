"""The renter's S3-compatible object store, through boto3 (its transfer manager: multipart for large objects, parallel
parts, retries with backoff, checksums): small calls in worker threads, files of a part or more in a pool of processes
of their own (``bulk_pool``), so the agent's event loop keeps serving its control link (bench/HISTORY.md, "Checkpoints").

Every failure is translated once, here, into whose fault it is: the renter's (``StorageUnauthorized``,
``StorageNotFound``, ``StorageUnreachable``, ``StorageTooLarge`` for a full disk or budget, ``EgressRefused`` for an
endpoint that is or resolves to an address the grid does not reach) or the host's (``RuntimeFailure``). Credentials
never appear in a message. Every connection goes through the egress rule (connections.py).
"""

from __future__ import annotations

import asyncio
import errno
import io
import multiprocessing
import os
import stat
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool as BrokenExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import boto3
import msgspec
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from agent.storage.connections import guard
from common.egress import EgressRule
from common.errors import (
    EgressRefused,
    IdlegridError,
    RuntimeFailure,
    StorageNotFound,
    StorageTooLarge,
    StorageUnauthorized,
    StorageUnreachable,
)
from common.storage import ContainerStorage

T = TypeVar("T")

_UNAUTHORIZED = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken", "ExpiredToken", "AllAccessDisabled"}
)
_NOT_FOUND = frozenset({"NoSuchBucket", "NoSuchKey", "404", "NotFound"})


@dataclass(frozen=True)
class TransferLimits:
    """How hard a host's transfers may pull: ``bytes_per_s`` in all (0: unbounded), parts of ``part_bytes``, and at
    most ``concurrency`` parts at once; ``attempts`` per request (boto3's standard retry mode). ``egress``: where its
    connections may go (common/egress.py; the provider's ``egress_allow``)."""

    bytes_per_s: int = 0
    part_bytes: int = 16 * 1024 * 1024
    concurrency: int = 4
    attempts: int = 5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    egress: EgressRule = EgressRule()


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    etag: str  # the store's content tag, quotes stripped: what the input cache is keyed by
    size: int


def _stripped(etag: str) -> str:
    return etag.strip('"')


class ObjectStore:
    """One renter's store as one replica reaches it. Blocking boto3 calls run in threads (``asyncio.to_thread``)."""

    def __init__(
        self, storage: ContainerStorage, limits: TransferLimits = TransferLimits(), bulk: Executor | None = None
    ) -> None:
        """``bulk``: a process pool that moves files of ``limits.part_bytes`` or more (None: threads of this process).
        Out of the agent's interpreter, a gigabyte's checksums and signatures do not hold the GIL its control loop
        needs (bench/HISTORY.md measured the round trip of a host's commands during an upload both ways)."""
        self.endpoint = storage.endpoint or "https://s3.amazonaws.com"
        self._storage = storage
        self._limits = limits
        self._bulk = bulk
        self._client = make_client(storage, limits)
        self._transfer = make_transfer(limits)

    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:  # boto3 raises many classes; each is translated once, here
            raise translate(what, exc) from None

    async def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (paged through), by key."""

        def run() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"], _stripped(item["ETag"]), int(item["Size"])))
            return found

        return await self._call(f"listing s3://{bucket}/{prefix}", run)

    async def check_bucket(self, bucket: str) -> None:
        """StorageNotFound or StorageUnauthorized now, rather than at the first upload an hour later."""
        await self._call(f"reaching bucket {bucket}", lambda: self._client.head_bucket(Bucket=bucket))

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        def run() -> ObjectInfo:
            head = self._client.head_object(Bucket=bucket, Key=key)
            return ObjectInfo(key, _stripped(head["ETag"]), int(head["ContentLength"]))

        return await self._call(f"reading s3://{bucket}/{key}", run)

    async def fetch(
        self, bucket: str, key: str, dest: Path, size: int = 0, on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """``key`` into ``dest`` (multipart ranges in parallel for a large object; written beside it, then renamed).
        ``size``: the object's, when known (a large one goes through the bulk pool)."""
        tmp = dest.with_name(f".{dest.name}.part")

        def run() -> None:
            self._client.download_file(bucket, key, str(tmp), Config=self._transfer, Callback=on_bytes)

        what = f"fetching s3://{bucket}/{key}"
        try:
            if self._bulk is not None and size >= self._limits.part_bytes:
                await self._in_bulk(what, BulkJob("get", bucket, key, str(tmp)))
            else:
                await self._call(what, run)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)

    async def put(self, source: BinaryIO, bucket: str, key: str, on_bytes: Callable[[int], None] | None = None) -> int:
        """The open file ``source`` as ``key`` (multipart above the part size), with a checksum the store verifies; the
        bytes sent. A file object, not a path: the caller opened it safely (``open_inside``) and the path may change
        meanwhile (the bulk pool's worker opens the same open file through /proc, never the path).

        The container may rewrite the file in place while it goes up (a shell's ``>`` empties it first). A file below
        the part size is therefore read whole, then sent as those bytes: streamed, a body shorter than the length
        announced for it would hold the request until the store's read timeout (a minute) before a retry. Larger files
        go in parts, each read whole before it is sent."""
        limit = self._limits.part_bytes
        size = os.fstat(source.fileno()).st_size

        def run() -> int:
            if size < limit:
                data = source.read(limit)
                if len(data) < limit:
                    self._client.upload_fileobj(io.BytesIO(data), bucket, key, Config=self._transfer, Callback=on_bytes)
                    return len(data)
                source.seek(0)  # grown to a part or more since it was measured: in parts
            self._client.upload_fileobj(source, bucket, key, Config=self._transfer, Callback=on_bytes)
            return source.tell()

        what = f"uploading to s3://{bucket}/{key}"
        if self._bulk is not None and size >= limit:
            await self._in_bulk(what, BulkJob("put", bucket, key, f"/proc/{os.getpid()}/fd/{source.fileno()}"))
            return size
        return await self._call(what, run)

    async def _in_bulk(self, what: str, job: BulkJob) -> None:
        assert self._bulk is not None
        storage = msgspec.json.encode(self._storage)
        try:
            failure = await asyncio.get_running_loop().run_in_executor(self._bulk, bulk_transfer, storage, self._limits, job)
        except BrokenExecutor as exc:
            raise RuntimeFailure(f"{what}: the transfer process died ({exc})") from None
        if failure is not None:
            code, message = failure
            raise _ERRORS.get(code, RuntimeFailure)(f"{what}: {message}")

    async def put_bytes(self, data: bytes, bucket: str, key: str) -> None:
        await self._call(f"uploading to s3://{bucket}/{key}", lambda: self._client.put_object(Bucket=bucket, Key=key, Body=data))

    async def get_bytes(self, bucket: str, key: str) -> bytes | None:
        """A small object's bytes; None when there is no such key (the bucket must exist)."""

        def run() -> bytes | None:
            try:
                body: Any = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            except ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            with body:
                return bytes(body.read())

        return await self._call(f"reading s3://{bucket}/{key}", run)

    async def delete(self, bucket: str, key: str) -> None:
        await self._call(f"deleting s3://{bucket}/{key}", lambda: self._client.delete_object(Bucket=bucket, Key=key))

    def close(self) -> None:
        self._client.close()


def make_client(storage: ContainerStorage, limits: TransferLimits) -> Any:
    """A boto3 S3 client whose every connection is judged by ``limits.egress`` and which follows no redirect."""
    creds = storage.credentials
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=storage.endpoint,
        region_name=storage.region,
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        aws_session_token=creds.session_token or None,
        config=Config(
            s3={"addressing_style": "path" if storage.path_style else "auto"},
            retries={"max_attempts": limits.attempts, "mode": "standard"},
            connect_timeout=limits.connect_timeout_s,
            read_timeout=limits.read_timeout_s,
            request_checksum_calculation="when_supported",
            response_checksum_validation="when_supported",
        ),
    )
    return guard(client, limits.egress)


def make_transfer(limits: TransferLimits) -> TransferConfig:
    return TransferConfig(
        multipart_threshold=limits.part_bytes,
        multipart_chunksize=limits.part_bytes,
        max_concurrency=limits.concurrency,
        max_bandwidth=limits.bytes_per_s or None,
        use_threads=True,
    )


@dataclass(frozen=True)
class BulkJob:
    op: str  # "put" (``path`` read, a /proc/<agent>/fd/<n> of a file the agent opened safely) | "get" (``path`` written)
    bucket: str
    key: str
    path: str


def bulk_pool(workers: int) -> ProcessPoolExecutor:
    """Processes of their own for large transfers (spawned: nothing of the agent's threads or loop is inherited)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def bulk_transfer(storage_json: bytes, limits: TransferLimits, job: BulkJob) -> tuple[str, str] | None:
    """In a bulk pool's process: one large transfer; None when done, else (error code, message) (exceptions of
    boto3 do not all cross processes; the code does)."""
    storage = msgspec.json.decode(storage_json, type=ContainerStorage)
    try:
        client = make_client(storage, limits)
        if job.op == "put":
            with open(job.path, "rb") as source:
                client.upload_fileobj(source, job.bucket, job.key, Config=make_transfer(limits))
        else:
            client.download_file(job.bucket, job.key, job.path, Config=make_transfer(limits))
        client.close()
    except Exception as exc:
        error = translate(job.op, exc)
        return getattr(error, "code", "runtime_failure"), str(error).removeprefix(f"{job.op}: ")
    return None


def open_inside(root: Path, rel: str) -> BinaryIO | None:
    """``root/rel`` opened for reading only if it is a regular file that really lies under ``root``; None otherwise.

    The directory is the renter's (its container writes there) and the agent reads it with more rights than the
    container has: a symlink (or a directory swapped for one between a scan and the read) must not make the agent
    upload a host file. The last component is opened without following a link, and the opened file's real path is
    checked against ``root``'s; a FIFO or device is refused (non-blocking open, then a regular-file check)."""
    path = root / rel
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        inside = real.startswith(os.path.realpath(root) + os.sep)
        if not inside or not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except OSError:
        os.close(fd)
        return None


_ERRORS: dict[str, type[IdlegridError]] = {
    cls.code: cls
    for cls in (StorageUnauthorized, StorageNotFound, StorageTooLarge, StorageUnreachable, EgressRefused, RuntimeFailure)
}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(what: str, exc: BaseException) -> Exception:
    """An error of boto3 (or the disk) as whose fault it is, saying what was being done."""
    if isinstance(exc, ClientError):
        code = _code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _UNAUTHORIZED or status == 403:
            return StorageUnauthorized(f"{what}: the store refused the credentials ({code or status}); check the secret")
        if code in _NOT_FOUND or status == 404:
            return StorageNotFound(f"{what}: not found ({code or status}); check the bucket and key")
        return RuntimeFailure(f"{what}: the store answered {code or status}")
    if isinstance(exc, EndpointConnectionError):
        return StorageUnreachable(f"{what}: the endpoint does not answer")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageTooLarge(f"{what}: this host's disk is full")
    if isinstance(exc, EgressRefused):
        return EgressRefused(f"{what}: {exc}")
    if isinstance(exc, (StorageTooLarge, StorageNotFound, StorageUnauthorized, StorageUnreachable, RuntimeFailure)):
        return exc
    if isinstance(exc, BotoCoreError):
        return StorageUnreachable(f"{what}: {type(exc).__name__}")
    return RuntimeFailure(f"{what}: {type(exc).__name__}: {exc}")
