import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.grid import Grid


@pytest.fixture
def grid(tmp_path):
    """A fresh Master and one Access relay, as separate processes; everything is stopped afterwards."""
    g = Grid(tmp_path)
    try:
        g.start_master()
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


@pytest.fixture
def drop() -> Iterator[Path]:
    """A directory every sandboxed container may write in (each runs as a uid of its own), outside pytest's root-only
    tree and outside /tmp, /var/tmp and /dev/shm, which each sandboxed container gets fresh and private."""
    path = Path(tempfile.mkdtemp(prefix="idlegrid-e2e-drop-", dir="/run"))
    os.chmod(path, 0o777)  # not sticky: several containers append to one file (fs.protected_regular)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
