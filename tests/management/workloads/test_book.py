"""The workload book on a real Master and a real store, each backend in turn (SQLite, and MongoDB on nx-27017):
it writes every change through the store with a version check, records each transition as an event, deletes a
cancelled workload's containers through the Master's command ledger, and after a restart has every open workload
back in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from common.errors import InvalidTransition, NotFound
from management.store import output_repo, workload_repo
from management.store.outputs import output_key
from management.store.workloads import StaleWorkload
from management.workloads.book import WorkloadBook
from management.workloads.spec import InvalidWorkloadSpec, container_name
from master.config import MasterConfig
from master.master import Master
from master.records import Assignment, RentalTerms, ReplicaSpec, WorkloadSpec
from master.store import open_store
from tests.management.hosts import add_agent
from tests.master.conftest import nx27017_uri, store_url  # noqa: F401  (fixtures: each backend in turn)
from tests.support.stored import stored_workload

NOW = 1_700_000_000.0
SPEC = WorkloadSpec(
    name="train", image="busybox", env={"TOKEN": "s3cret"}, replicas=2, network="none", replica=ReplicaSpec(gpus=1)
)

StartMaster = Callable[[], Awaitable[Master]]


@pytest.fixture
async def start_master(store_url: str, tmp_path: Path) -> AsyncIterator[StartMaster]:  # noqa: F811
    """Starts Masters on the same store (one after another, as a restart would; or side by side); stops them all."""
    started: list[Master] = []

    async def start() -> Master:
        master = Master(
            MasterConfig(state_dir=str(tmp_path / f"master-{len(started)}"), link_port=0), store=open_store(store_url)
        )
        await master.start()
        started.append(master)
        return master

    yield start
    for master in started:
        await master.stop()


def book_of(master: Master) -> WorkloadBook:
    return WorkloadBook(master.store, master, policy=master.policy, delete_grace_s=12.0)


async def transitions(master: Master, workload_id: str) -> list[tuple[str, str, str]]:
    events = await master.store.events.list(subject=workload_id, kind_prefix="workload.transition")
    return [(e.data["from"], e.data["event"], e.data["to"]) for e in events]


async def test_a_workload_goes_from_submission_to_success_each_step_stored_and_recorded(start_master):
    master = await start_master()
    book = book_of(master)
    await book.load()
    wl = await book.submit("alice", SPEC, NOW)
    assert (wl.state, wl.queued_at, wl.version, wl.attempts) == ("queued", NOW, 1, 0)
    assert book.wakeup.is_set()
    assert [w.id for w in book.open_workloads(state="queued")] == [wl.id]

    placed = [Assignment(replica=0, agent_id="agt-1", units=["GPU-a"], container=container_name(wl.id, 0, 1))]
    await book.transition(wl.id, "schedule", "placed on agt-1", NOW + 1, assignments=placed)
    await book.transition(wl.id, "start", "create commands acknowledged", NOW + 2)
    running = await book.transition(wl.id, "run", "containers started", NOW + 3)
    assert (running.scheduled_at, running.started_at, running.attempts, running.version) == (NOW + 1, NOW + 3, 1, 4)
    done = await book.transition(wl.id, "succeed", "every replica exited 0", NOW + 9, exit_codes=[0, 0])

    assert (done.state, done.finished_at, done.exit_codes) == ("succeeded", NOW + 9, [0, 0])
    assert await workload_repo(master.store).get(wl.id) == done
    assert book.open_workloads() == [] and await book.get(wl.id) == done  # final: read from the store
    assert await transitions(master, wl.id) == [
        ("", "submit", "queued"),
        ("queued", "schedule", "scheduled"),
        ("scheduled", "start", "starting"),
        ("starting", "run", "running"),
        ("running", "succeed", "succeeded"),
    ]
    with pytest.raises(InvalidTransition, match="final"):
        await book.transition(wl.id, "requeue", "no", NOW + 10)


async def test_a_refused_move_changes_nothing(start_master):
    master = await start_master()
    book = book_of(master)
    wl = await book.submit("alice", SPEC, NOW)
    with pytest.raises(InvalidTransition):
        await book.transition(wl.id, "run", "skipping ahead", NOW + 1)
    with pytest.raises(ValueError, match="account"):
        # account is no change a move may make: the type says so, and the book refuses it at run time too
        await book.transition(wl.id, "schedule", "and steal it", NOW + 1, account="mallory")  # type: ignore[call-arg]
    with pytest.raises(NotFound):
        await book.transition("wl-missing", "schedule", "", NOW + 1)
    assert await workload_repo(master.store).get(wl.id) == wl
    with pytest.raises(InvalidWorkloadSpec, match="priority"):
        await book.submit("alice", WorkloadSpec(name="x", image="busybox", priority="urgent"), NOW)


async def test_a_requeued_workload_keeps_its_place_in_the_queue(start_master):
    master = await start_master()
    book = book_of(master)
    first = await book.submit("alice", SPEC, NOW)
    second = await book.submit("bob", SPEC, NOW + 1)
    await book.transition(first.id, "schedule", "placed", NOW + 2)
    await book.transition(first.id, "start", "acknowledged", NOW + 3)
    back = await book.transition(first.id, "requeue", "its host went offline", NOW + 4)
    assert (back.state, back.queued_at, back.attempts, back.assignments, back.scheduled_at) == ("queued", NOW, 1, [], None)
    assert [w.id for w in book.open_workloads(state="queued")] == [first.id, second.id]
    assert [w.id for w in book.open_workloads(account="bob")] == [second.id]


async def test_cancelling_a_running_workload_deletes_its_containers_through_the_master(start_master):
    master = await start_master()
    await add_agent(master, "agt-1", "h100:2")
    book = book_of(master)
    wl = await book.submit("alice", SPEC, NOW)
    names = [container_name(wl.id, r, 1) for r in (0, 1)]
    placed = [Assignment(replica=r, agent_id="agt-1", units=[f"GPU-{r}"], container=names[r], state="running") for r in (0, 1)]
    await book.transition(wl.id, "schedule", "placed", NOW + 1, assignments=placed)
    await book.transition(wl.id, "start", "acknowledged", NOW + 2)
    await book.transition(wl.id, "run", "started", NOW + 3)
    book.wakeup.clear()
    heard: list[tuple[str, str]] = []
    book.subscribe(lambda what, rec: heard.append((what, rec.state)))

    with pytest.raises(NotFound):  # another account's workload is as missing
        await book.cancel(wl.id, "bob", NOW + 4)
    cancelled = await book.cancel(wl.id, "alice", NOW + 5)

    assert (cancelled.state, cancelled.state_reason, cancelled.finished_at) == ("cancelled", "cancelled by its owner", NOW + 5)
    assert [a.state for a in cancelled.assignments] == ["deleting", "deleting"]
    deletes = await master.store.commands.list(agent_id="agt-1")
    assert sorted((c.kind, c.spec["name"], c.spec["timeout_s"]) for c in deletes) == [
        ("delete_container", names[0], 12.0),
        ("delete_container", names[1], 12.0),
    ]
    assert book.wakeup.is_set() and heard == [("cancelled", "cancelled")]
    with pytest.raises(InvalidTransition, match="already cancelled"):
        await book.cancel(wl.id, None, NOW + 6)


async def test_a_cancelled_workloads_replicas_await_their_output_then_settle_deleted_across_a_restart(start_master):
    master = await start_master()
    await add_agent(master, "agt-1", "h100:2")
    book = book_of(master)
    wl = await book.submit("alice", SPEC, NOW)
    names = [container_name(wl.id, r, 1) for r in (0, 1)]
    placed = [Assignment(replica=r, agent_id="agt-1", units=[f"GPU-{r}"], container=names[r], state="running") for r in (0, 1)]
    await book.transition(wl.id, "schedule", "placed", NOW + 1, assignments=placed)
    await book.cancel(wl.id, "alice", NOW + 2)

    awaited = await output_repo(master.store).list(state="pending")  # stored with the transition, before the deletes were sent
    assert [(k.id, k.account, k.container, k.state, k.ended_at) for k in awaited] == [
        (output_key(wl.id, r, 1), "alice", names[r], "pending", NOW + 2) for r in (0, 1)
    ]
    settled = await book.settle(wl.id, names[0], note="; replica 0 said goodbye")
    assert settled is not None and [a.state for a in settled.assignments] == ["deleted", "deleting"]
    assert settled.state_reason == "cancelled by its owner; replica 0 said goodbye"
    assert await book.settle(wl.id, names[0]) is None  # already deleted: nothing to do

    restarted = book_of(await start_master())  # a final workload is settled from the store, as it is there
    await restarted.load()
    done = await restarted.settle(wl.id, names[1])
    assert done is not None and [a.state for a in (await restarted.get(wl.id)).assignments] == ["deleted", "deleted"]


async def test_a_delete_the_master_refuses_is_reported_and_the_workload_still_cancelled(start_master):
    master = await start_master()
    book = book_of(master)
    wl = await book.submit("alice", SPEC, NOW)
    gone = [Assignment(replica=0, agent_id="agt-gone", units=["GPU-x"], container=container_name(wl.id, 0, 1))]
    await book.transition(wl.id, "schedule", "placed", NOW + 1, assignments=gone)
    cancelled = await book.cancel(wl.id, None, NOW + 2)
    assert cancelled.state == "cancelled"
    assert "cancelled by an operator; 1 container(s) could not be deleted now" in cancelled.state_reason
    refused = await master.store.events.list(subject=wl.id, kind_prefix="workload.delete_refused")
    assert [e.data["agent_id"] for e in refused] == ["agt-gone"]


async def test_after_a_restart_every_open_workload_is_back_and_final_ones_are_still_readable(start_master):
    master = await start_master()
    book = book_of(master)
    queued = await book.submit("alice", SPEC, NOW)
    running = await book.submit("bob", SPEC, NOW + 1)
    for event in ("schedule", "start", "run"):
        running = await book.transition(running.id, event, event, NOW + 2)
    cancelled = await book.cancel((await book.submit("alice", SPEC, NOW + 3)).id, "alice", NOW + 4)
    await master.stop()

    restarted = await start_master()
    reloaded = book_of(restarted)
    assert await reloaded.load() == 2
    assert reloaded.open_workloads() == [queued, running]
    assert reloaded.counts() == {"queued": 1, "running": 1}
    assert reloaded.wakeup.is_set()  # the loop has queued work waiting
    assert await reloaded.get(cancelled.id) == cancelled
    assert (await reloaded.get(queued.id)).spec.env == {"TOKEN": "s3cret"}
    assert [w.id for w in await reloaded.list(account="alice")] == [cancelled.id, queued.id]


async def test_a_second_master_that_writes_first_makes_this_books_write_fail_stale(start_master):
    one, two = await start_master(), await start_master()
    book_one, book_two = book_of(one), book_of(two)
    wl = await book_one.submit("alice", SPEC, NOW)
    await book_two.load()
    await book_two.transition(wl.id, "schedule", "placed by the other Master", NOW + 1)
    with pytest.raises(StaleWorkload):
        await book_one.transition(wl.id, "reject", "can never fit", NOW + 1)
    assert (await stored_workload(one.store, wl.id)).state == "scheduled"


async def test_submit_stores_the_restart_policy_in_force_so_answers_show_it(start_master):
    master = await start_master()
    book = book_of(master)
    await book.load()
    bid = RentalTerms(kind="interruptible", bid="0.50")
    plain = await book.submit("alice", SPEC, NOW)
    interruptible = await book.submit("alice", msgspec.structs.replace(SPEC, rental=bid), NOW)
    told = await book.submit("alice", msgspec.structs.replace(SPEC, rental=bid, restart_policy="never"), NOW)
    assert [w.spec.restart_policy for w in (plain, interruptible, told)] == ["never", "on_failure", "never"]
    assert (await stored_workload(master.store, interruptible.id)).spec.restart_policy == "on_failure"
