"""Crash-safe file writes: a reader (or a restart after SIGKILL or power loss) sees the old file or the new one."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_temp(path: Path, data: bytes, mode: int) -> Path:
    """A fully written, fsynced sibling of ``path`` created with ``mode`` from the start.

    Created with its final mode, so a private file is never readable by others, not even between
    open() and chmod().
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return tmp


def write_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    path = Path(path)
    tmp = write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    """Make renames in ``path`` durable: the directory entry must reach the disk too."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
