"""Backups of a Master's state: its embedded store and the keys agents and relays trust, in one archive.

An archive is a gzipped tar holding ``manifest.json`` first, then the files it lists: ``master.db`` (a consistent
copy of the SQLite store, taken with SQLite's online backup API while the Master runs), everything under ``pki/``
(the CA, the Master's certificate and key, the command-signing keys) and the operator key and console session key
when present. The manifest gives each file's size, SHA-256 and mode, the store's schema version, the idlegrid
version and the time. docs/backup.md says why these files and how the two commands behave.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import shutil
import sqlite3
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

import msgspec

from common.errors import BackupError
from master.store.migrations import LATEST_VERSION

FORMAT = 1  # of the archive; a reader refuses a format it does not know
MANIFEST = "manifest.json"
STORE_FILE = "master.db"
STORE_SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's files beside the store, stale once the store is replaced
PKI_DIR = "pki"
# Secrets the Master keeps beside its PKI: the bootstrap operator's API key (its hash is in the store) and the key
# that signs console session cookies. Without them a restored Master mints new ones: operators sign in again.
STATE_FILES = ("operator.token", "console-session.key")
PRIVATE = 0o600
PUBLIC = 0o644
STORE_BUSY_TIMEOUT_S = 10.0
_CHUNK = 1 << 20


class BackupFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str  # relative to the state directory, "/"-separated
    size: int
    sha256: str
    mode: int  # the permission bits the file had, restored as they were (never more than 0644)


class BackupManifest(msgspec.Struct, kw_only=True):
    format: int
    idlegrid_version: str
    created_at: float  # Unix time the store copy was taken
    store: Literal["sqlite", "none"]  # "none": PKI only (a Master on MongoDB: its store is backed up by mongodump)
    schema_version: int | None  # of the store copied; None without one
    files: list[BackupFile]


# --- backup ---------------------------------------------------------------------------------------------------------


def create_backup(
    state_dir: Path,
    out: Path,
    *,
    store_path: Path | None,
    idlegrid_version: str,
    force: bool = False,
    now: float | None = None,
) -> BackupManifest:
    """Write the archive of ``state_dir`` (and of the SQLite store at ``store_path``; None: PKI only) to ``out``,
    0600. Safe while the Master runs: the store is copied in one read transaction, which writers do not wait on."""
    out = Path(out)
    with _os_errors("back up", state_dir):
        return _create_backup(
            Path(state_dir), out, store_path=store_path, idlegrid_version=idlegrid_version, force=force, now=now
        )


def _create_backup(
    state_dir: Path, out: Path, *, store_path: Path | None, idlegrid_version: str, force: bool, now: float | None
) -> BackupManifest:
    if out.exists() and not force:
        raise BackupError(f"{out} already exists; pass --force to replace it, or choose another --out")
    if not out.parent.is_dir():
        raise BackupError(f"cannot write {out}: the directory {out.parent} does not exist")
    sources = _state_files(state_dir)
    with tempfile.TemporaryDirectory(prefix=".idlegrid-backup-", dir=out.parent) as work:
        os.chmod(work, 0o700)
        schema_version: int | None = None
        if store_path is not None:
            copy = Path(work) / STORE_FILE
            schema_version = copy_store(Path(store_path), copy)
            sources = [(STORE_FILE, copy), *sources]
        created_at = time.time() if now is None else now
        files = [_describe(name, path) for name, path in sources]
        manifest = BackupManifest(
            format=FORMAT,
            idlegrid_version=idlegrid_version,
            created_at=created_at,
            store="sqlite" if store_path is not None else "none",
            schema_version=schema_version,
            files=files,
        )
        partial = Path(work) / "archive.tar.gz"
        _write_archive(partial, manifest, dict(sources))
        _move_into_place(partial, out, force=force)
    return manifest


def copy_store(store_path: Path, copy: Path) -> int:
    """A consistent copy of the SQLite store at ``store_path`` into ``copy`` (0600, journal mode DELETE: one
    self-contained file); returns its schema version."""
    if not store_path.is_file():
        raise BackupError(
            f"no SQLite store at {store_path}: nothing to back up there (a Master on MongoDB: back its store up "
            "with mongodump and this directory's keys with --pki-only)"
        )
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    os.close(fd)
    try:
        # mode=rw: never create a store where there was none. The copy is one step (pages=-1), so one read
        # transaction: the Master's writers go on meanwhile (WAL), and the copy is the store as of one commit.
        with (
            contextlib.closing(
                sqlite3.connect(f"{store_path.resolve().as_uri()}?mode=rw", uri=True, timeout=STORE_BUSY_TIMEOUT_S)
            ) as source,
            contextlib.closing(sqlite3.connect(copy, isolation_level=None)) as target,
        ):
            source.backup(target, pages=-1)
            target.execute("PRAGMA journal_mode = DELETE")
            (checked,) = target.execute("PRAGMA quick_check").fetchone()
            if checked != "ok":
                raise BackupError(f"the copy of {store_path} fails SQLite's check ({checked}); the store may be damaged")
            return _schema_version(target)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot copy the SQLite store at {store_path}: {exc}") from exc


def _schema_version(conn: sqlite3.Connection) -> int:
    try:
        (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    except sqlite3.OperationalError:  # no such table: a store no Master has migrated yet
        return 0
    return int(version)


def _state_files(state_dir: Path) -> list[tuple[str, Path]]:
    """(name in the archive, path) of the Master's keys and secrets in ``state_dir``; the CA must be there."""
    pki = state_dir / PKI_DIR
    if not (pki / "ca.key").is_file() or not (pki / "ca.crt").is_file():
        raise BackupError(f"no CA in {pki} (ca.crt and ca.key): is {state_dir} the Master's state directory?")
    found: list[tuple[str, Path]] = []
    for path in sorted(pki.rglob("*")):
        if path.is_symlink() or not path.is_file() or _is_temporary(path.name):
            continue
        found.append((path.relative_to(state_dir).as_posix(), path))
    found.extend((name, state_dir / name) for name in STATE_FILES if (state_dir / name).is_file())
    return found


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")  # common/files.py's half-written siblings


def _describe(name: str, path: Path) -> BackupFile:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    mode = PRIVATE if name == STORE_FILE else _allowed_mode(os.stat(path).st_mode)
    return BackupFile(path=name, size=size, sha256=digest.hexdigest(), mode=mode)


def _allowed_mode(mode: int) -> int:
    """A file readable by others stays so (certificates); anything else is the owner's alone."""
    return PUBLIC if mode & 0o044 else PRIVATE


def _write_archive(path: Path, manifest: BackupManifest, sources: dict[str, Path]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        body = msgspec.json.format(msgspec.json.encode(manifest))
        _add(tar, MANIFEST, io.BytesIO(body), len(body), PRIVATE, manifest.created_at)
        for entry in manifest.files:
            with sources[entry.path].open("rb") as f:
                _add(tar, entry.path, f, entry.size, entry.mode, manifest.created_at)
        raw.flush()
        os.fsync(raw.fileno())


def _add(tar: tarfile.TarFile, name: str, data: IO[bytes], size: int, mode: int, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(mtime)
    tar.addfile(info, data)


def _move_into_place(partial: Path, out: Path, *, force: bool) -> None:
    if force:
        os.replace(partial, out)
        return
    try:
        os.link(partial, out)  # never over a file that appeared since we looked
    except FileExistsError:
        raise BackupError(f"{out} already exists; pass --force to replace it, or choose another --out") from None


@contextlib.contextmanager
def _os_errors(doing: str, state_dir: Path) -> Iterator[None]:
    """A file that cannot be read or written (permissions, a full disk) as one line naming it."""
    try:
        yield
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise BackupError(f"cannot {doing} {state_dir}:{where} {exc.strerror or exc}") from exc


# --- restore --------------------------------------------------------------------------------------------------------


def restore_backup(archive: Path, state_dir: Path, *, force: bool = False) -> BackupManifest:
    """Write the files of ``archive`` into ``state_dir``, each with the mode it had. Refused while a Master uses the
    store there, into a directory that is not empty (unless ``force``: then the store, its WAL, the PKI and the
    secrets there are replaced), and for an archive that is damaged or holds a store newer than this idlegrid."""
    archive, state_dir = Path(archive), Path(state_dir)
    with _os_errors("restore into", state_dir):
        return _restore_backup(archive, state_dir, force=force)


def _restore_backup(archive: Path, state_dir: Path, *, force: bool) -> BackupManifest:
    _check_target(state_dir, force=force)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _open_archive(archive) as tar, tempfile.TemporaryDirectory(prefix=".idlegrid-restore-", dir=state_dir.parent) as work:
        staged = Path(work)
        manifest = _unpack(tar, archive, staged)
        _check_target(state_dir, force=force)  # again: a Master may have started there while we unpacked
        _replace_state(staged, state_dir, manifest)
    return manifest


@contextlib.contextmanager
def _open_archive(archive: Path) -> Iterator[tarfile.TarFile]:
    if not archive.is_file():
        raise BackupError(f"no backup at {archive}")
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            yield tar
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BackupError(f"{archive} is not a readable idlegrid backup (truncated or corrupted: {exc})") from None


def _unpack(tar: tarfile.TarFile, archive: Path, staged: Path) -> BackupManifest:
    """Every file of the archive into ``staged``, each checked against the manifest; returns the manifest."""
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isfile():
        raise BackupError(f"{archive} is not an idlegrid backup: it does not start with {MANIFEST}")
    manifest = _decode_manifest(_read_member(tar, first), archive)
    expected = {entry.path: entry for entry in manifest.files}
    seen: set[str] = set()
    while (member := tar.next()) is not None:
        entry = expected.get(member.name)
        if entry is None or member.name in seen or not member.isfile():
            raise BackupError(f"{archive} holds {member.name!r}, which its manifest does not list: the archive was altered")
        seen.add(member.name)
        if member.size != entry.size:
            raise BackupError(f"{archive}: {entry.path} is not the size its manifest says; the backup is corrupted")
        _stage(tar, member, entry, staged, archive)
    missing = sorted(set(expected) - seen)
    if missing:
        raise BackupError(f"{archive} lacks {', '.join(missing)}, listed in its manifest: the archive is truncated")
    if manifest.store == "sqlite":
        _check_store_copy(staged / STORE_FILE, manifest, archive)
    return manifest


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    assert f is not None  # a regular file
    return f.read()


def _decode_manifest(body: bytes, archive: Path) -> BackupManifest:
    try:
        manifest = msgspec.json.decode(body, type=BackupManifest)
    except msgspec.DecodeError as exc:
        raise BackupError(f"{archive} has an unreadable {MANIFEST}: {exc}") from None
    if manifest.format != FORMAT:
        raise BackupError(
            f"{archive} is a backup of format {manifest.format}; this idlegrid reads format {FORMAT}: "
            f"restore it with the idlegrid that made it ({manifest.idlegrid_version})"
        )
    for entry in manifest.files:
        parts = Path(entry.path).parts
        if not parts or Path(entry.path).is_absolute() or ".." in parts or (entry.path != STORE_FILE and not _known(parts)):
            raise BackupError(f"{archive} lists {entry.path!r}, which is no file of a Master's state directory")
    if manifest.schema_version is not None and manifest.schema_version > LATEST_VERSION:
        raise BackupError(
            f"{archive} holds a store of schema version {manifest.schema_version}, newer than this idlegrid "
            f"understands ({LATEST_VERSION}): restore it with idlegrid {manifest.idlegrid_version} or later"
        )
    return manifest


def _known(parts: tuple[str, ...]) -> bool:
    return (parts[0] == PKI_DIR and len(parts) > 1) or (len(parts) == 1 and parts[0] in STATE_FILES)


def _stage(tar: tarfile.TarFile, member: tarfile.TarInfo, entry: BackupFile, staged: Path, archive: Path) -> None:
    path = staged / entry.path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    source = tar.extractfile(member)
    assert source is not None
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    with os.fdopen(fd, "wb") as f:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise BackupError(f"{archive}: {entry.path} does not match its checksum in the manifest; the backup is corrupted")
    os.chmod(path, entry.mode & PUBLIC)


def _check_store_copy(path: Path, manifest: BackupManifest, archive: Path) -> None:
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            (checked,) = conn.execute("PRAGMA quick_check").fetchone()
            version = _schema_version(conn)
    except sqlite3.Error as exc:
        raise BackupError(f"{archive}: its {STORE_FILE} is not a usable SQLite store ({exc})") from None
    if checked != "ok":
        raise BackupError(f"{archive}: its {STORE_FILE} fails SQLite's check ({checked})")
    if version != manifest.schema_version:
        raise BackupError(
            f"{archive}: its {STORE_FILE} is at schema version {version}, its manifest says {manifest.schema_version}"
        )


def _check_target(state_dir: Path, *, force: bool) -> None:
    if state_dir.exists() and not state_dir.is_dir():
        raise BackupError(f"{state_dir} is not a directory")
    store = state_dir / STORE_FILE
    if store.exists() and store_in_use(store):
        raise BackupError(f"a Master is running on {state_dir} (its store {store} is open); stop it before restoring")
    if not force and state_dir.is_dir() and any(state_dir.iterdir()):
        raise BackupError(
            f"{state_dir} is not empty; restore into a new directory, or pass --force to replace the store and keys there"
        )


def store_in_use(store: Path) -> bool:
    """Whether some connection (a running Master's) has the SQLite store at ``store`` open.

    A connection to a WAL store holds a shared lock on it as long as it is open, so an exclusive lock taken at once
    (no waiting) is refused while any Master, in this process or another, has the store open.
    """
    try:
        with contextlib.closing(sqlite3.connect(f"{store.resolve().as_uri()}?mode=rw", uri=True, timeout=0)) as conn:
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    except sqlite3.DatabaseError:
        return False  # not a database at all: nobody runs on it
    return False


def _replace_state(staged: Path, state_dir: Path, manifest: BackupManifest) -> None:
    """Take what the archive replaces out of ``state_dir``, then move the staged files in: the PKI always; the store
    (and its WAL, which would be replayed over the new one) and the secrets whose hashes it holds when it has a store;
    otherwise (``--pki-only``) only the secrets it brings, and the store there is kept."""
    listed = {entry.path for entry in manifest.files}
    with_store = manifest.store == "sqlite"
    if with_store:
        for suffix in ("", *STORE_SIDECARS):
            (state_dir / f"{STORE_FILE}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(state_dir / PKI_DIR, ignore_errors=True)
    for name in STATE_FILES:
        if with_store or name in listed:
            (state_dir / name).unlink(missing_ok=True)
    for entry in manifest.files:
        target = state_dir / entry.path
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(staged / entry.path, target)
    for directory in {(state_dir / entry.path).parent for entry in manifest.files}:
        if directory != state_dir:
            os.chmod(directory, 0o700)
