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
