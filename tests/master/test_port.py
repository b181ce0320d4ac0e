"""The published interface: a real Master has everything ``MasterPort`` lists, and management's callers are typed
with it (mypy checks ``Master`` against the protocol in ``master.master.implements_port``)."""

from __future__ import annotations

import inspect

import master.port as port
from master.master import Master, implements_port
from master.port import MasterPort


def _members() -> set[str]:
    declared = set(MasterPort.__annotations__)
    declared |= {name for name, _ in inspect.getmembers(MasterPort) if not name.startswith("_")}
    return declared


async def test_a_running_master_has_every_member_of_the_port(master: Master) -> None:
    seen = implements_port(master)
    missing = sorted(name for name in _members() if not hasattr(seen, name))
    assert missing == []
    assert seen.commands is master.parts.commands  # the command ledger, under its new name
    assert await seen.list_commands() == []


def test_the_port_lists_what_it_re_exports() -> None:
    exported = {name for name in vars(port) if not name.startswith("_")} - {"annotations", "Any", "Protocol"}
    exported -= {"Awaitable", "Callable", "Collection", "Iterable", "Sequence"}  # its signatures' types
    exported -= {"AccessStats", "CommandSpec", "GpuSample", "RelayEntry", "TunnelKind"}
    assert exported <= set(port.__all__)
