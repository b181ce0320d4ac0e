"""The agent's state directory is private: 0700 directories, 0600 files, whatever the umask.

Commands of the process runtime run on this host, so nothing the agent keeps (its key, its database, its records)
may be readable by another user; every writer of the state directory goes through these helpers.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) if needed and make it readable by the agent's user only."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.chmod(path, PRIVATE_DIR_MODE)  # also a directory an older agent created with the umask's mode
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty if missing, 0600 from the start, before a library (SQLite) opens it with its own mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    return path
