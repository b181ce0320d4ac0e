"""The Master's state is private: its directory 0700 and every file in it 0600, whatever the umask.

The state directory holds the store (``master.db`` and its ``-wal``/``-shm``), the CA's and the signing keys, the
secrets key, the operator's key: everything a backup holds. A Master makes it 0700 and, at every start, takes every
permission but the owner's off what is in it (a directory open to others becomes 0700, a file 0600), so a directory
or a store made by an older Master under umask 022 (0755, 0644) is closed too. The SQLite store makes its own file
0600 before SQLite opens it (master/store/sqlite/database.py); SQLite gives ``-wal`` and ``-shm`` the database
file's mode.

Symbolic links are left alone (never followed); a file the Master cannot change (another owner's) is logged and left.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private(state_dir: Path) -> list[Path]:
    """Create ``state_dir`` (0700) if need be and close it and everything under it; returns the paths tightened."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    tightened = _tighten(state_dir, PRIVATE_DIR)
    for root, dirs, files in os.walk(state_dir):
        here = Path(root)
        tightened += [p for name in dirs for p in _tighten(here / name, PRIVATE_DIR)]
        tightened += [p for name in files for p in _tighten(here / name, PRIVATE_FILE)]
    if tightened:
        log.warning(
            "the Master's state was readable by others; closed %d paths (directories 0700, files 0600)",
            len(tightened),
            extra={"state_dir": str(state_dir), "paths": [str(p) for p in tightened[:20]]},
        )
    return tightened


def _tighten(path: Path, mode: int) -> list[Path]:
    try:
        st = os.lstat(path)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or not stat.S_IMODE(st.st_mode) & 0o077:
            return []  # a link (never followed) or something else; or nothing for others to take away
        os.chmod(path, mode)
    except FileNotFoundError:
        return []  # gone meanwhile (a temporary file)
    except PermissionError as exc:
        log.error("cannot make %s private: %s", path, exc)
        return []
    return [path]
