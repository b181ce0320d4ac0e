"""What an agent reports is kept apart from the Master's own facts, and bounded by a budget."""

from __future__ import annotations

import msgspec

from common.containers import ContainerSpec
from common.wire import AgentEvent, AgentEventKind, Error
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import connect, events, relay, relay_link, to_agent


async def test_an_agent_cannot_write_an_event_under_the_masters_kinds(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    forged = msgspec.json.encode({"type": "event", "kind": "transition", "ts": 0, "message": "revoked by an operator"})
    await relay(master, link, "agt-a", forged)
    assert isinstance(to_agent(link, "agt-a")[-1], Error)  # a schema violation, answered
    for kind in ("agent.", "gpu.", "command."):
        assert all(e.data.get("message") != "revoked by an operator" for e in await events(master, kind))

    await relay(master, link, "agt-a", AgentEvent(kind=AgentEventKind.GPU_XID, ts=1.0, gpu_uuid="GPU-h100-0", code=79))
    [report] = await events(master, "agent_report.")
    assert (report.kind, report.subject, report.data["code"]) == ("agent_report.gpu_xid", "agt-a", 79)


async def test_an_event_flood_is_cut_to_the_budget_and_noted_once(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, report_events_per_window=5, report_window_s=3600)
    master = Master(config)
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a")
        for _ in range(150):
            await relay(master, link, "agt-a", AgentEvent(kind=AgentEventKind.RUNTIME_FAILURE, ts=1.0, message="x" * 500))
        reports = await events(master, "agent_report.")
        assert [e.kind for e in reports].count("agent_report.runtime_failure") == 5
        [note] = [e for e in reports if e.kind == "agent_report.budget_exceeded"]
        assert note.subject == "agt-a" and note.data["dropped"] == 1
        dropped = master.metrics.registry.get_sample_value("idlegrid_agent_reports_dropped_total")
        assert dropped == 145
    finally:
        await master.stop()


async def test_a_storage_report_is_recorded_under_the_workload_only_from_the_host_that_holds_its_container(master):
    from common.storage import StorageActivity

    link = relay_link()
    await connect(master, link, "agt-a")
    await connect(master, link, "agt-b")
    await master.create_command("agt-b", ContainerSpec(name="wl-00aa-r0-a1", image="busybox"))
    upload = StorageActivity(what="checkpoint_uploaded", workload_id="wl-00aa", bytes=5, total_bytes=9, taken_at=2.0)

    def report(container: str, activity: StorageActivity = upload) -> AgentEvent:
        return AgentEvent(kind=AgentEventKind.STORAGE, ts=3.0, container=container, storage=activity)

    await relay(master, link, "agt-a", report("wl-00aa-r0-a1"))  # not agt-a's container
    await relay(master, link, "agt-b", report("wl-00bb-r0-a1"))  # a container of another workload than it names
    assert await events(master, "storage.") == []
    await relay(master, link, "agt-b", report("wl-00aa-r0-a1"))
    [recorded] = await events(master, "storage.")
    assert (recorded.kind, recorded.subject) == ("storage.checkpoint_uploaded", "wl-00aa")
    assert recorded.data == {
        "agent_id": "agt-b", "container": "wl-00aa-r0-a1", "what": "checkpoint_uploaded", "bytes": 5, "total_bytes": 9,
        "taken_at": 2.0,
    }  # fmt: skip
    assert len(await events(master, "agent_report.storage")) == 3  # every report is kept under its host, as any is
