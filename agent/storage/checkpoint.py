"""What a checkpoint upload sends, decided without I/O; and the manifest that makes a checkpoint whole.

A checkpoint lives under the renter's prefix as the files' versions (``data/<generation>/<path>``) and one manifest
(``.idlegrid-checkpoint.json``) naming, for each file, the object that holds its latest version. An upload sends only
the files that changed since the last one (size or modification time), each under the new generation, then writes
the manifest, then deletes the versions no manifest names any more. So the manifest always names objects that are
all there: a host lost in the middle of an upload leaves the previous checkpoint whole, and a restore reads exactly
one checkpoint. Invariants (tests/agent/storage/test_checkpoint.py): a file unchanged since the last upload is never
sent again; every key a manifest names was uploaded before it; a dropped version is one no manifest names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from common.storage import MANIFEST_NAME

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Seen:
    """A file as the last scan saw it: changed when either differs."""

    size: int
    mtime_ns: int


class ManifestFile(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the object holding this version
    size: int
    mtime_ns: int = 0


class Manifest(msgspec.Struct, kw_only=True):
    version: int = MANIFEST_VERSION
    time: float  # when this checkpoint was taken (its upload began)
    generation: int
    files: dict[str, ManifestFile] = {}

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


@dataclass(frozen=True)
class UploadPlan:
    """One upload: the files to send (path -> key), the manifest to write after them, and the keys to drop after."""

    send: dict[str, str]
    manifest: Manifest
    drop: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.send) or bool(self.drop)


def scan(root: Path) -> dict[str, Seen]:
    """Every regular file under ``root`` by its path relative to it ('/'-separated); links are not followed."""
    found: dict[str, Seen] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue  # removed while we looked
            if path.is_symlink() or not path.is_file():
                continue
            found[path.relative_to(root).as_posix()] = Seen(st.st_size, st.st_mtime_ns)
    return found


def version_key(prefix: str, generation: int, rel: str) -> str:
    return f"{prefix}data/{generation:08d}/{rel}"


def manifest_key(prefix: str) -> str:
    return f"{prefix}{MANIFEST_NAME}"


def plan_upload(prefix: str, now: dict[str, Seen], last: Manifest | None, taken_at: float) -> UploadPlan:
    """What to send so the store holds ``now``: the files new or changed since ``last`` under a new generation, the
    manifest of everything, and the versions ``last`` named that the new manifest does not."""
    generation = (last.generation + 1) if last is not None else 1
    before = last.files if last is not None else {}
    send: dict[str, str] = {}
    files: dict[str, ManifestFile] = {}
    for rel, seen in sorted(now.items()):
        old = before.get(rel)
        if old is not None and old.size == seen.size and old.mtime_ns == seen.mtime_ns:
            files[rel] = old
            continue
        key = version_key(prefix, generation, rel)
        send[rel] = key
        files[rel] = ManifestFile(key=key, size=seen.size, mtime_ns=seen.mtime_ns)
    kept = {f.key for f in files.values()}
    drop = sorted({f.key for f in before.values()} - kept)
    return UploadPlan(send=send, manifest=Manifest(time=taken_at, generation=generation, files=files), drop=drop)


def plain_changes(now: dict[str, Seen], sent: dict[str, Seen]) -> list[str]:
    """Outputs: the files new or changed since they were last sent (they are uploaded under their own names)."""
    return [rel for rel, seen in sorted(now.items()) if sent.get(rel) != seen]


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.encode(manifest)


def decode_manifest(data: bytes) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)


def safe_rel(rel: str) -> bool:
    """A manifest's path that stays inside the checkpoint directory (a manifest is the renter's: never trusted)."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts) and "\0" not in rel
