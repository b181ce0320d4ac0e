"""The runner's tests share the scheduler tests' fixtures: a real Master (SQLite in tmp_path) and its relay link."""

from tests.management.scheduler.conftest import link, master

__all__ = ["link", "master"]
