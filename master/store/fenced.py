"""The fence: every write of the Master's store goes through a check that this Master still leads (docs/ha.md).

``FencedStore`` wraps a store; each repository's write methods first call ``fence`` (``Leadership.fence``), which
raises ``Fenced`` once the Master no longer holds the leader lease. Reads pass through, and so does the lease
repository itself (the election must reach the store to take or renew the lease). Which methods write is decided
here, by name, once for every repository, so a repository added later is fenced without a change.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from master.store.base import LeaseRepo, Store
from master.store.plugin import AggregatePlugin, Repo

Check = Callable[[], None]

# The write methods of the store's repositories, its own (master/store/base.py) and the plugged ones (management/store/):
# a new verb that writes must be named here.
WRITES = frozenset(
    {
        "put",
        "put_many",
        "add",
        "append",
        "append_many",
        "consume",
        "mark_used",
        "insert",
        "update",
        "delete",
        "delete_before",
        "delete_of",
        "delete_ended",
        "post",
        "write_many",
    }
)
UNFENCED_REPOS = frozenset({"leases"})


def repo_names() -> list[str]:
    """The repositories a Store has: its attributes typed as a ``...Repo``."""
    hints = typing.get_type_hints(Store)
    return [name for name, hint in hints.items() if getattr(hint, "__name__", "").endswith("Repo")]


class FencedRepo:
    """One repository whose write methods check the fence first."""

    def __init__(self, repo: object, fence: Check) -> None:
        self._repo = repo
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._repo, name)
        if name not in WRITES:
            return attr
        fence = self._fence

        async def fenced(*args: Any, **kwargs: Any) -> Any:
            fence()
            return await attr(*args, **kwargs)

        return fenced


class FencedStore:
    """``store`` with every repository fenced but the lease's; anything else is the wrapped store's."""

    def __init__(self, store: Store, fence: Check) -> None:
        self.inner = store
        self._fence = fence
        self.leases: LeaseRepo = store.leases
        self._plugged: dict[str, object] = {}  # each a FencedRepo, cast back to its plugin's Repo
        for name in repo_names():
            if name not in UNFENCED_REPOS:
                setattr(self, name, FencedRepo(getattr(store, name), fence))

    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo:
        """A plugged aggregate's repository (master/store/plugin.py), fenced as the store's own."""
        repo = self.inner.repository(plugin)  # the inner store checks the name is the plugin's alone
        if plugin.name not in self._plugged:
            self._plugged[plugin.name] = FencedRepo(repo, self._fence)
        return typing.cast(Repo, self._plugged[plugin.name])

    def __getattr__(self, name: str) -> Any:  # backend, quarantine, metrics, open, close, schema_version, path...
        return getattr(self.inner, name)


def fenced(store: Store, fence: Check) -> Store:
    return typing.cast(Store, FencedStore(store, fence))
