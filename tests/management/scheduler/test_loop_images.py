"""Images in the scheduling loop (docs/images.md): a start the renter's request made fail is the renter's (the workload
fails with the host's words, the host's reputation is untouched), pull progress is the starting workload's detail,
a host that lacks the image gets longer to start, and registry credentials reach the host but no answer. A real Master
on SQLite, driven through its relay-link handlers as in test_loop.py; no GPU is needed (simulated H100s)."""

from __future__ import annotations

import time

import pytest

from common.containers import RegistryAuth
from common.wire import AgentEvent, AgentEventKind, CommandResult
from management.http.responses import RegistryAuthView
from management.views import command_view, workload_spec_view
from master.records import AgentRecord
from master.reputation import reputation
from tests.management.workloads.test_runner import creates_sent, host, scheduler, spec, started
from tests.master.linked import connect, gpus, relay


async def test_a_start_that_fails_through_the_renters_image_fails_the_workload_and_costs_the_host_nothing(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(restart_policy="on_failure"), time.time())
    await loop.cycle()
    (x,) = (await loop.book.get(wl.id)).assignments
    why = "image not found: 'registry.example/team/app:v9' is not in its registry (manifest unknown)"
    await relay(master, link, "agt-a", CommandResult(id=x.command_id, ok=False, error=why, error_code="image_not_found"))

    await loop.cycle()

    rec = await loop.book.get(wl.id)
    assert (rec.state, rec.restarts, rec.attempts) == ("failed", 0, 1)  # no restart: it would fail the same way
    assert rec.state_reason == f"did not start (image_not_found): {why}"
    assert rec.host_failure == ""  # the market refunds nothing and blames no host
    agent = master.registry.agents["agt-a"]
    assert (agent.containers_failed, agent.commands_failed, agent.containers_refused) == (0, 0, 1)
    unscored = AgentRecord(id="agt-new", provider="prov", state="ready")  # no container evidence at all
    assert reputation(agent).components["container_success"] == reputation(unscored).components["container_success"]
    assert rec.state_reason.startswith(  # what the workload view shows as state_reason
        "did not start (image_not_found): image not found"
    )


async def test_a_start_that_fails_through_the_host_is_still_the_hosts(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    (x,) = (await loop.book.get(wl.id)).assignments
    failure = CommandResult(id=x.command_id, ok=False, error="the host's disk is full", error_code="runtime_failure")
    await relay(master, link, "agt-a", failure)

    await loop.cycle()

    rec = await loop.book.get(wl.id)
    assert rec.state == "failed" and rec.host_failure.startswith("agt-a: container did not start")
    agent = master.registry.agents["agt-a"]
    assert (agent.containers_failed, agent.containers_refused) == (1, 0)


async def test_pull_progress_is_the_starting_workloads_detail_until_it_runs(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    await loop.cycle()
    (x,) = (await loop.book.get(wl.id)).assignments
    progress = "pulling image: 12.0 MB of 45.3 MB, 1 of 3 layers"
    await relay(
        master, link, "agt-a", AgentEvent(kind=AgentEventKind.IMAGE_PULL, ts=time.time(), container=x.container, message=progress)
    )

    await loop.cycle()
    assert (await loop.book.get(wl.id)).detail == progress
    assert (await loop.book.get(wl.id)).detail == progress  # the workload view shows it as detail

    await started(master, link, await loop.book.get(wl.id))
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert (rec.state, rec.detail) == ("running", "")
    assert master.pull_progress("agt-a", x.container) == ""


async def test_pull_progress_for_a_container_no_create_is_making_is_ignored(master, link):
    await host(master, link, "agt-a")
    event = AgentEvent(kind=AgentEventKind.IMAGE_PULL, ts=time.time(), container="someone-elses", message="pulling image: x")
    await relay(master, link, "agt-a", event)
    assert master.pull_progress("agt-a", "someone-elses") == ""


async def test_a_host_that_lacks_the_image_gets_the_pull_allowance_to_start(master, link):
    await connect(
        master, link, "agt-warm", gpus(1, prefix="GPU-warm"), runtime="docker", isolation="container", images=["busybox"]
    )
    loop = scheduler(master)
    await loop.book.load()
    await loop.book.submit("alice", spec(), time.time())  # busybox: the warm host has it
    await loop.cycle()
    (warm,) = creates_sent(link, "agt-warm")
    assert master.registry.agents["agt-warm"].images == ["busybox"]
    assert warm.body.deadline - warm.body.issued_at == pytest.approx(loop.settings.start_timeout_s)

    # The warm host's one GPU is taken: the next workload goes to a host with no images.
    await connect(master, link, "agt-cold", gpus(1, prefix="GPU-cold"), runtime="docker", isolation="container")
    await loop.book.submit("alice", spec(name="cold"), time.time())
    await loop.cycle()
    (cold,) = creates_sent(link, "agt-cold")
    assert cold.body.deadline - cold.body.issued_at == pytest.approx(
        loop.settings.start_timeout_s + loop.settings.pull_allowance_s
    )


async def test_registry_credentials_reach_the_host_and_no_answer_shows_the_password(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    auth = RegistryAuth(username="renter", password="hunter2-registry-token")
    wl = await loop.book.submit("alice", spec(registry_auth=auth), time.time())
    await loop.cycle()
    (create,) = creates_sent(link, "agt-a")
    assert create.body.spec["registry_auth"] == {"username": "renter", "password": "hunter2-registry-token"}

    view = workload_spec_view(await loop.book.get(wl.id))  # the spec as every workload answer shows it
    assert view.registry_auth == RegistryAuthView(username="renter")
    command = await master.command(create.body.id)
    assert "hunter2" not in repr(command_view(command)) and "hunter2" not in repr(view)


async def test_only_a_create_can_fail_through_the_renter_a_delete_claiming_so_is_the_hosts(master, link):
    await host(master, link, "agt-a")
    command = await master.create_command("agt-a", "delete_container", {"name": "gone"})
    claim = CommandResult(id=command.id, ok=False, error="image not found", error_code="image_not_found")
    await relay(master, link, "agt-a", claim)
    agent = master.registry.agents["agt-a"]
    assert (agent.commands_failed, agent.containers_refused) == (1, 0)
