"""The scheduling loop on a real Master (SQLite in tmp_path), driven through its relay-link handlers without sockets
(tests/master/linked.py): agents say hello, acknowledge and report results, exits and faults as a relay would carry
them; the test runs cycles by hand and asserts what the Master sent and what the workload book recorded.
No GPU is needed: the agents report simulated H100s."""

from __future__ import annotations

import time
from typing import Any

from common.containers import CommandSpec, ContainerSpec, DeleteSpec
from common.wire import AgentEvent, AgentEventKind, Command, CommandResult, Heartbeat
from management.store import workload_repo
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop, SchedulerSettings
from master.accounts import AccountRole
from master.allocations import Hold
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.records import Assignment, ReplicaSpec, WorkloadRecord, WorkloadSpec
from tests.master.linked import connect, gpus, relay, relay_link, to_agent
from tests.support.stored import stored_workload

GRACE_S = 7.0


async def host(master: Master, link: AccessLink, agent_id: str, count: int = 1) -> list[str]:
    """A host with ``count`` simulated H100s in containers (Docker runtime); returns their uuids."""
    gpu_list = gpus(count, prefix=f"GPU-{agent_id}")
    await connect(master, link, agent_id, gpu_list, runtime="docker", isolation="container")
    return [g.uuid for g in gpu_list]


# The storage specs' stand-in endpoint, http://127.0.0.1:9000 (no host here connects to it): private, so a renter may
# name it only because the operator allows it by name (common/egress.py; test_targets.py shows the refusal).
OPERATOR_ALLOWS_TEST_STORE = MasterConfig(egress_allow=["127.0.0.1:9000"]).egress_rule()


def scheduler(master: Master) -> SchedulerLoop:
    book = WorkloadBook(
        master.store,
        master,
        policy=master.policy,
        egress=OPERATOR_ALLOWS_TEST_STORE,
        gang_overlay=bool(master.config.overlay.lighthouses),  # as the composition root builds it
    )
    return SchedulerLoop(master, book, SchedulerSettings(grace_s=GRACE_S, offline_grace_s=5.0, stray_sweep_s=0.0))


def spec(name: str = "train", **fields: Any) -> WorkloadSpec:
    replica = ReplicaSpec(gpus=fields.pop("gpus", 1))
    return WorkloadSpec(name=name, image=fields.pop("image", "busybox"), command=["sleep", "600"], replica=replica, **fields)


def creates_sent(link: AccessLink, agent_id: str) -> list[Command]:
    return [f for f in to_agent(link, agent_id) if isinstance(f, Command) and f.body.kind == "create_container"]


def deletes_sent(link: AccessLink, agent_id: str) -> list[Command]:
    return [f for f in to_agent(link, agent_id) if isinstance(f, Command) and f.body.kind == "delete_container"]


async def started(master: Master, link: AccessLink, rec: WorkloadRecord) -> None:
    """Every replica's host reports its create command succeeded."""
    for a in rec.assignments:
        await relay(master, link, a.agent_id, CommandResult(id=a.command_id, ok=True, result={"id": a.container}))


async def deleted(master: Master, link: AccessLink, agent_id: str) -> None:
    """The host reports every delete it was sent as done."""
    for command in deletes_sent(link, agent_id):
        await relay(master, link, agent_id, CommandResult(id=command.body.id, ok=True))


async def test_a_gang_is_placed_on_two_hosts_at_once_runs_and_succeeds(master, link):
    a, b = await host(master, link, "agt-a"), await host(master, link, "agt-b")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2, network="none", env={"TOKEN": "s3cret"}), time.time())

    report = await loop.cycle()

    rec = await loop.book.get(wl.id)
    assert report.placed == 1 and rec.state == "scheduled"
    assert sorted(x.agent_id for x in rec.assignments) == ["agt-a", "agt-b"]
    assert sorted(u for x in rec.assignments for u in x.units) == sorted(a + b)
    for x in rec.assignments:
        (command,) = creates_sent(link, x.agent_id)
        assert command.body.spec["name"] == x.container == f"{wl.id}-r{x.replica}-a1"
        assert command.body.spec["gpus"] == x.units
        assert command.body.spec["workload_id"] == wl.id and command.body.spec["replica"] == x.replica
        assert command.body.spec["env"] == {"TOKEN": "s3cret"}  # the renter's secret goes to its container
        assert x.command_id == command.body.id

    await started(master, link, rec)
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.state == "running" and all(x.state == "running" for x in rec.assignments)

    for x in rec.assignments:
        await relay(master, link, x.agent_id, Heartbeat(seq=1, ts=time.time(), running=[], exited={x.container: 0}))
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert (rec.state, rec.exit_codes) == ("succeeded", [0, 0])
    assert all(len(deletes_sent(link, agent)) == 1 for agent in ("agt-a", "agt-b"))  # ended containers are removed


async def test_a_gang_that_does_not_fit_takes_nothing(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(replicas=2, network="none"), time.time())

    await loop.cycle()

    assert (await loop.book.get(wl.id)).state == "queued"
    assert creates_sent(link, "agt-a") == [] and master.allocations.holds() == {}
    explanation = await loop.explain(wl.id)
    assert not explanation.fits_now and explanation.summary


async def test_a_faulty_gpu_moves_its_workload_to_another_host(master, link):
    await host(master, link, "agt-a")
    await host(master, link, "agt-b")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    await started(master, link, rec)
    await loop.cycle()
    (first,) = (await loop.book.get(wl.id)).assignments
    other = "agt-b" if first.agent_id == "agt-a" else "agt-a"

    fault = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=first.units[0], code=79)
    await relay(master, link, first.agent_id, fault)
    await loop.cycle()  # requeued, its container deleted with the grace period
    await loop.cycle()  # placed elsewhere

    rec = await loop.book.get(wl.id)
    assert rec.state == "scheduled" and rec.attempts == 2
    (second,) = rec.assignments
    assert second.agent_id == other and second.container == f"{wl.id}-r0-a2"
    (delete,) = deletes_sent(link, first.agent_id)
    assert delete.body.spec == {"name": first.container, "timeout_s": GRACE_S}
    reasons = [e.data["reason"] for e in await master.store.events.list(subject=wl.id, kind_prefix="workload.transition")]
    assert any("Xid 79" in reason or "faulty" in reason or "unhealthy" in reason for reason in reasons), reasons


async def test_a_workload_whose_host_died_still_says_when_it_started_until_it_is_placed_again(master, link):
    """Issue 37: a workload whose host died showed "Started: -" (console, ``workload get``): the requeue forgot when
    its run started. It keeps that time while it waits again; placed anew, the new attempt's start replaces it."""
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    await started(master, link, await loop.book.get(wl.id))
    await loop.cycle()
    ran = await loop.book.get(wl.id)
    assert ran.state == "running" and ran.started_at is not None

    await master.revoke("agt-a", "test: the host is gone")
    await loop.cycle()

    waits = await loop.book.get(wl.id)
    assert (waits.state, waits.host_failure) == ("queued", "agt-a: host is gone (retired or quarantined)")
    assert waits.started_at == ran.started_at and waits.assignments == []
    await host(master, link, "agt-b")
    await loop.cycle()
    placed = await loop.book.get(wl.id)
    assert (placed.state, placed.attempts, placed.started_at) == ("scheduled", 2, None)  # this attempt has not started
    await started(master, link, placed)
    await loop.cycle()
    again = await loop.book.get(wl.id)
    assert again.state == "running" and again.started_at is not None and again.started_at >= ran.started_at


async def test_a_higher_class_preempts_a_lower_one_which_goes_back_to_the_queue(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    low = await loop.book.submit("bob", spec("low", priority="low", restart_policy="on_failure"), time.time())
    await loop.cycle()
    await started(master, link, await loop.book.get(low.id))
    await loop.cycle()
    assert (await loop.book.get(low.id)).state == "running"

    high = await loop.book.submit("alice", spec("high", priority="high"), time.time())
    report = await loop.cycle()

    assert report.preempted == 1
    victim = await loop.book.get(low.id)
    assert victim.state == "preempted" and victim.preemptions == 1
    assert (await stored_workload(master.store, low.id)).preempted_for == high.id  # stored: a restarted Master knows it
    (delete,) = deletes_sent(link, "agt-a")
    assert delete.body.spec["timeout_s"] == GRACE_S  # SIGTERM, then this long before SIGKILL
    assert (await loop.book.get(high.id)).state == "queued"  # the victim's GPU is not free until its container is gone
    await loop.cycle()
    assert (await loop.book.get(high.id)).state == "queued" and len(deletes_sent(link, "agt-a")) == 1  # no second victim

    await deleted(master, link, "agt-a")
    await loop.cycle()

    requeued = await loop.book.get(low.id)
    assert (requeued.state, requeued.state_reason, requeued.preempted_for) == (
        "queued",
        f"preempted for {high.id}; back in the queue",
        "",
    )
    assert (await loop.book.get(high.id)).state == "scheduled"


async def test_a_create_the_host_fails_to_start_requeues_the_workload_onto_another_host_without_a_restart(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(restart_policy="on_failure"), time.time())
    await loop.cycle()
    (x,) = (await loop.book.get(wl.id)).assignments
    await host(master, link, "agt-b")  # joins after the first placement: the only other host
    refused = CommandResult(id=x.command_id, ok=False, error="no space left on device", error_code="runtime_failure")
    await relay(master, link, "agt-a", refused)

    await loop.cycle()

    rec = await loop.book.get(wl.id)
    assert (rec.state, rec.restarts, rec.attempts) == ("scheduled", 0, 2)  # back in the queue, and placed again at once
    assert rec.assignments[0].agent_id == "agt-b" and rec.assignments[0].container == f"{wl.id}-r0-a2"
    moves = await master.store.events.list(subject=wl.id, kind_prefix="workload.transition")
    requeue = next(e for e in moves if e.data["event"] == "requeue")
    assert "1 of 1 container(s) did not start on agt-a (failed): no space left on device" in requeue.data["reason"]


async def test_a_restarted_master_adopts_running_containers_and_issues_what_was_missing(tmp_path, link):
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    first = Master(config)
    await first.start()
    await first.accounts.ensure("alice", AccountRole.RENTER)
    await host(first, link, "agt-a", count=2)
    loop = scheduler(first)
    await loop.book.load()
    running = await loop.book.submit("alice", spec("running"), time.time())
    await loop.cycle()
    await started(first, link, await loop.book.get(running.id))
    await loop.cycle()
    assert (await loop.book.get(running.id)).state == "running"
    # A second workload whose placement was stored, but the Master died before it sent the create.
    pending = await loop.book.submit("alice", spec("pending"), time.time())
    free = next(u for u in (g.uuid for g in first.registry.gpus_of("agt-a")) if first.allocations.holder(u) is None)
    placed = [Assignment(replica=0, agent_id="agt-a", units=[free], container=f"{pending.id}-r0-a1")]
    await loop.book.transition(pending.id, "schedule", "placed on agt-a", time.time(), assignments=placed)
    await first.stop()

    second = Master(config)
    await second.start()
    try:
        link2 = relay_link("relay-b")
        await connect(second, link2, "agt-a", gpus(2, prefix="GPU-agt-a"), runtime="docker", isolation="container")
        (container,) = [x.container for x in (await loop.book.get(running.id)).assignments]
        await relay(second, link2, "agt-a", Heartbeat(seq=1, ts=time.time(), running=[container]))
        again = scheduler(second)
        await again.book.load()

        await again.cycle()

        assert (await again.book.get(running.id)).state == "running"
        creates = creates_sent(link2, "agt-a")
        assert [c.body.spec["name"] for c in creates] == [f"{pending.id}-r0-a1"]  # the missing one, not the running one
        holders = second.allocations.holds()
        assert len({(h.agent_id, h.container) for h in holders.values()}) == 2 and len(holders) == 2
    finally:
        await second.stop()


async def test_a_container_created_after_its_delete_is_deleted_again(master, link):
    """A host runs commands concurrently: the delete of a container whose create has not run yet finds nothing, and
    the create then starts it. The loop deletes such a stray again, so the victim does not wait for it forever."""
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    low = await loop.book.submit("bob", spec("low", priority="low", restart_policy="on_failure"), time.time())
    await loop.cycle()
    (placed,) = (await loop.book.get(low.id)).assignments  # its create is under way
    await loop.book.submit("alice", spec("high", priority="high"), time.time())
    await loop.cycle()
    (first_delete,) = deletes_sent(link, "agt-a")
    await relay(master, link, "agt-a", CommandResult(id=first_delete.body.id, ok=True, result={"container": None}))
    await relay(master, link, "agt-a", CommandResult(id=placed.command_id, ok=True, result={"id": placed.container}))
    assert placed.container in master.registry.agents["agt-a"].containers  # the late create: a stray now

    await loop.cycle()

    first, second = deletes_sent(link, "agt-a")
    assert second.body.spec == {"name": placed.container, "timeout_s": GRACE_S}
    assert (await loop.book.get(low.id)).state == "preempted"  # still stopping
    await loop.cycle()
    assert len(deletes_sent(link, "agt-a")) == 2  # not again while that delete is under way
    await relay(master, link, "agt-a", CommandResult(id=second.body.id, ok=True))
    await loop.cycle()
    assert (await loop.book.get(low.id)).state == "queued"


async def test_a_workload_cancelled_while_its_create_is_under_way_leaves_no_container(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    (placed,) = (await loop.book.get(wl.id)).assignments
    await loop.book.cancel(wl.id, "alice", time.time())
    (delete,) = deletes_sent(link, "agt-a")
    await relay(master, link, "agt-a", CommandResult(id=delete.body.id, ok=True, result={"container": None}))
    await relay(master, link, "agt-a", CommandResult(id=placed.command_id, ok=True, result={"id": placed.container}))

    await loop.cycle()

    _, again = deletes_sent(link, "agt-a")
    assert again.body.spec["name"] == placed.container
    await relay(master, link, "agt-a", CommandResult(id=again.body.id, ok=True))
    assert master.allocations.holds() == {} and master.registry.agents["agt-a"].containers == {}


async def test_a_create_made_just_before_the_master_died_is_taken_over_not_issued_again(tmp_path, link):
    """The Master died after it made a replica's create command and before it noted the command's id on the workload:
    the restarted loop finds that command (still open) and waits for it. A second create of the same container, under
    another command id, would be refused by the host as a name clash (and fail the workload) or would take the GPU's
    hold from the first command, which would then run holding nothing."""
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    first = Master(config)
    await first.start()
    await first.accounts.ensure("alice", AccountRole.RENTER)
    (uuid,) = await host(first, link, "agt-a")
    loop = scheduler(first)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    container = f"{wl.id}-r0-a1"
    placed = [Assignment(replica=0, agent_id="agt-a", units=[uuid], container=container)]
    await loop.book.transition(wl.id, "schedule", "placed on agt-a", time.time(), assignments=placed)
    made = await first.create_command(
        "agt-a", ContainerSpec(name=container, image="busybox", command=["sleep", "600"], gpus=[uuid])
    )
    await first.stop()

    second = Master(config)
    await second.start()
    try:
        link2 = relay_link("relay-b")
        await connect(second, link2, "agt-a", gpus(1, prefix="GPU-agt-a"), runtime="docker", isolation="container")
        again = scheduler(second)
        await again.book.load()

        await again.cycle()

        assert {c.body.id for c in creates_sent(link2, "agt-a")} == {made.id}  # resent on reconnect, never a new one
        (a,) = (await again.book.get(wl.id)).assignments
        assert a.command_id == made.id
        await relay(second, link2, "agt-a", CommandResult(id=made.id, ok=True, result={"id": container}))
        await again.cycle()
        assert (await again.book.get(wl.id)).state == "running"
        assert second.allocations.holds() == {uuid: Hold("agt-a", container, made.id, running=True)}
    finally:
        await second.stop()


async def test_a_restarted_master_counts_a_hosts_silence_from_its_own_start_not_from_the_stored_last_seen(tmp_path, link):
    """A host the restarted Master has not heard from yet (its relay redials with backoff) goes offline after one
    heartbeat timeout, with the ``last_seen`` the store holds: written with a state change or a heartbeat flush, so as
    old as the outage plus up to ``heartbeat_flush_s``. Its workloads stay put for the whole offline grace counted from
    the Master's start, since before that the Master, not the host, was silent; only after it are they requeued."""
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    first = Master(config)
    await first.start()
    await first.accounts.ensure("alice", AccountRole.RENTER)
    await host(first, link, "agt-a")
    loop = scheduler(first)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    await started(first, link, await loop.book.get(wl.id))
    await loop.cycle()
    assert (await loop.book.get(wl.id)).state == "running"
    agent = first.registry.get("agt-a")
    agent.last_seen = time.time() - 50.0  # last written to the store 50 s before the Master died
    await first.registry.save(agent)
    await first.stop()

    second = Master(config)
    await second.start()
    try:
        await second.registry.sweep(time.time(), 3.0)  # what the Master's sweep does once its start grace is over
        assert second.registry.get("agt-a").state == "offline"
        again = scheduler(second)  # offline grace: 5 s
        await again.book.load()

        await again.cycle()

        assert (await again.book.get(wl.id)).state == "running"
        assert not [c for c in second.commands.open.values() if c.kind == "delete_container"]
        again._clock = lambda: second.started_at + 6.0  # noqa: SLF001  (the host stays silent past the grace)
        await again.cycle()
        rec = await again.book.get(wl.id)
        assert rec.state == "queued" and "went offline" in rec.state_reason
    finally:
        await second.stop()


async def test_a_stop_is_stored_before_its_deletes_are_sent_so_a_master_killed_between_loses_no_state(master, link, monkeypatch):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    await started(master, link, await loop.book.get(wl.id))
    await loop.cycle()
    stored_when_sent: list[tuple[str, list[str]]] = []
    create_command = master.create_command

    async def recording(agent_id: str, spec: CommandSpec, **kw: Any) -> Any:
        if isinstance(spec, DeleteSpec):
            rec = await workload_repo(master.store).get(wl.id)
            assert rec is not None
            stored_when_sent.append((rec.state, [a.state for a in rec.assignments]))
        return await create_command(agent_id, spec, **kw)

    monkeypatch.setattr(master, "create_command", recording)
    await loop.book.cancel(wl.id, "alice", time.time())

    assert stored_when_sent == [("cancelled", ["deleting"])]


async def test_strays_are_looked_for_once_per_sweep_period_not_on_every_wake_up(master, link):
    """The look for strays is a pass over every host's containers: at 10,000 hosts it is paid once a period."""
    await host(master, link, "agt-a")
    now = [time.time()]
    book = WorkloadBook(master.store, master, policy=master.policy)
    loop = SchedulerLoop(master, book, SchedulerSettings(grace_s=GRACE_S, stray_sweep_s=5.0), clock=lambda: now[0])
    await loop.book.load()
    low = await loop.book.submit("bob", spec("low", priority="low", restart_policy="on_failure"), now[0])
    await loop.cycle()  # the first cycle sweeps (nothing to find), then not for 5 s
    (placed,) = (await loop.book.get(low.id)).assignments
    await loop.book.submit("alice", spec("high", priority="high"), now[0])
    await loop.cycle()
    (first_delete,) = deletes_sent(link, "agt-a")
    await relay(master, link, "agt-a", CommandResult(id=first_delete.body.id, ok=True, result={"container": None}))
    await relay(master, link, "agt-a", CommandResult(id=placed.command_id, ok=True, result={"id": placed.container}))

    now[0] += 1.0
    await loop.cycle()
    assert len(deletes_sent(link, "agt-a")) == 1  # within the period: not looked for yet

    now[0] += 5.0
    await loop.cycle()
    assert [d.body.spec["name"] for d in deletes_sent(link, "agt-a")] == [placed.container, placed.container]


async def test_explanations_reuse_a_snapshot_but_never_miss_a_workload_just_submitted(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    first = await loop.book.submit("alice", spec("first", replicas=2, network="none"), time.time())
    assert (await loop.explain(first.id)).cannot_fit  # one host: a 2-host gang cannot be held
    taken = loop._explain_snapshot  # noqa: SLF001
    assert (await loop.explain(first.id)).cannot_fit and loop._explain_snapshot is taken  # noqa: SLF001  (reused)

    second = await loop.book.submit("alice", spec("second", replicas=2, network="none"), time.time())

    assert (await loop.explain(second.id)).position == 2  # the submission dropped the old snapshot
