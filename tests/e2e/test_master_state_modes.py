"""The Master's state is private whatever the umask (docs/store.md, "Files and modes"): a Master process started under
umask 022 keeps its state directory 0700 and its store (``master.db``, ``-wal``, ``-shm``), keys and tokens 0600;
one started on a directory an older Master left 0755 with a 0644 store closes them; a backup is 0600."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.grid import Grid


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask most systems give a service: 022 (group and others may read what it creates)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def modes(state_dir: Path) -> dict[str, int]:
    """Every directory's and file's permissions under ``state_dir`` (itself as "."), by relative path."""
    found = {".": stat.S_IMODE(state_dir.stat().st_mode)}
    for path in state_dir.rglob("*"):
        if not path.is_symlink():
            found[str(path.relative_to(state_dir))] = stat.S_IMODE(path.stat().st_mode)
    return found


def open_to_others(state_dir: Path) -> dict[str, str]:
    return {path: oct(mode) for path, mode in modes(state_dir).items() if mode & 0o077}


def test_a_master_under_umask_022_keeps_its_state_private_and_closes_what_an_older_one_left_open(
    tmp_path: Path, umask_022: None
) -> None:
    grid = Grid(tmp_path / "grid")  # makes the state directory and its CA in this process, under umask 022
    state_dir = grid.master_dir
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o755  # as a directory made by hand or an older Master would be
    try:
        grid.start_master()
        grid.get("/api/v1/agents")  # the store is open and written: master.db, -wal and -shm are there
        found = modes(state_dir)
        assert {"master.db", "master.db-wal", "master.db-shm", "pki/secrets.key", "operator.token"} <= found.keys()
        assert open_to_others(state_dir) == {}
        assert found["."] == 0o700 and found["master.db"] == found["master.db-wal"] == found["master.db-shm"] == 0o600

        # An older Master's state: the directory 0755, the store and every other file 0644.
        grid.stop()
        os.chmod(state_dir, 0o755)
        for path in state_dir.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        assert open_to_others(state_dir)
        grid.restart_master()
        grid.get("/api/v1/agents")
        assert open_to_others(state_dir) == {}
        assert modes(state_dir)["master.db-wal"] == 0o600

        out = tmp_path / "master.tar.gz"
        made = subprocess.run(
            [sys.executable, "-m", "management.cli", "master", "backup", "--state-dir", str(state_dir), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        assert open_to_others(state_dir) == {}  # the backup's copy of the store was made and removed privately
    finally:
        grid.stop()
