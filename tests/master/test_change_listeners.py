"""The synchronous listeners of the change feed that management code (the offer feed) follows: the allocation ledger
tells of each host whose holds changed (``HoldsChanged``), the registry of each agent record it writes
(``AgentWritten``)."""

from __future__ import annotations

from master.allocations import GpuAllocations
from master.changes import AgentWritten, Change, ChangeFeed, HoldsChanged
from master.records import AgentRecord, CommandRecord
from tests.master.linked import connect, relay_link


def test_the_ledger_tells_its_listeners_of_each_host_whose_holds_changed_and_only_then():
    feed = ChangeFeed()
    ledger = GpuAllocations(feed)
    heard: list[str | None] = []
    stop = feed.listen(lambda change: heard.append(_host(change)), [HoldsChanged])
    ledger.claim("h1", "c1", "cmd-1", ["GPU-a", "GPU-b"])
    ledger.claim("h2", "c2", "cmd-2", ["GPU-c"])
    ledger.confirm("cmd-1")
    ledger.abandon("cmd-2")
    ledger.release("h1", "c1")
    assert heard == ["h1", "h2", "h1", "h2", "h1"]
    ledger.release("h1", "c1")  # nothing of it held any more: nothing changed, nobody told
    ledger.abandon("cmd-9")
    ledger.release_host("h3")
    assert heard == ["h1", "h2", "h1", "h2", "h1"]
    ledger.claim("h3", "c3", "cmd-3", ["GPU-d"])
    ledger.release_host("h3")
    assert heard[-2:] == ["h3", "h3"]
    stop()
    ledger.claim("h1", "c1", "cmd-4", ["GPU-a"])
    assert len(heard) == 7


def test_a_rebuild_tells_its_listeners_that_every_host_may_have_changed():
    feed = ChangeFeed()
    ledger = GpuAllocations(feed)
    heard: list[str | None] = []
    feed.listen(lambda change: heard.append(_host(change)), [HoldsChanged])
    agent = AgentRecord(id="h1", provider="p", state="busy", containers={"c1": ["GPU-a"]})
    create = CommandRecord(
        id="cmd-1", agent_id="h1", kind="create_container", spec={"name": "c2"}, state="sent", created_at=1.0, deadline=9.0
    )
    ledger.rebuild([agent], [(create, ["GPU-b"])], {"GPU-a": "h1", "GPU-b": "h1"})
    assert heard == [None] and len(ledger) == 2


async def test_the_registry_tells_its_listeners_of_every_agent_record_it_writes(master):
    heard: list[str | None] = []
    stop = master.changes.listen(lambda change: heard.append(_host(change)), [AgentWritten])
    link = relay_link()
    await connect(master, link, "h1", runtime="docker", isolation="container")
    assert "h1" in heard
    heard.clear()
    await master.drain("h1")
    assert heard == ["h1"]
    stop()
    await master.undrain("h1")
    assert heard == ["h1"]


def _host(change: Change) -> str | None:
    assert isinstance(change, (HoldsChanged, AgentWritten))
    return change.agent_id
