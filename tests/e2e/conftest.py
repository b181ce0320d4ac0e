import os
import pwd
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
    """A directory only ``nobody`` (and root, the test) may use, outside pytest's root-only tree."""
    path = Path(tempfile.mkdtemp(prefix="idlegrid-e2e-drop-"))
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
