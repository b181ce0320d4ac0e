"""Images in the scheduling loop (docs/images.md): a start the renter's request made fail is the renter's (the workload
fails with the host's words, the host's reputation is untouched), pull progress is the starting workload's detail,
a host that lacks the image gets longer to start, and registry credentials reach the host but no answer. A real Master
on SQLite, driven through its relay-link handlers as in test_loop.py; no GPU is needed (simulated H100s)."""

from __future__ import annotations

import time

import pytest

from common.containers import DeleteSpec, RegistryAuth
from common.inventory import ImageSource
from common.wire import AgentEvent, AgentEventKind, CommandResult
from management.views.grid import command_view
from management.views.workloads import RegistryAuthView, workload_spec_view
from management.workloads.book import TRANSITION_EVENT, WorkloadBook
from management.workloads.runner import SchedulerLoop, SchedulerSettings
from master.records import AgentRecord, PlacementConstraints
from master.reputation import reputation
from tests.management.workloads.test_runner import OPERATOR_ALLOWS_TEST_STORE, creates_sent, host, scheduler, spec, started
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


async def test_a_start_that_fails_through_the_host_is_the_hosts_and_is_tried_on_another_host(master, link):
    await host(master, link, "agt-a")
    await host(master, link, "agt-b")
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())  # restart_policy never: a host's fault is no restart
    await loop.cycle()
    (x,) = (await loop.book.get(wl.id)).assignments
    failure = CommandResult(id=x.command_id, ok=False, error="the host's disk is full", error_code="runtime_failure")
    await relay(master, link, x.agent_id, failure)

    await loop.cycle()  # the failure is seen: back to the queue, and placed again in the same cycle

    transitions = await master.store.events.list(kind_prefix=TRANSITION_EVENT, subject=wl.id, limit=100)
    assert [e.data["reason"] for e in transitions if e.data["event"] == "requeue"] == [
        f"1 of 1 container(s) did not start on {x.agent_id} (failed): the host's disk is full; "
        "trying another host (1 of 2 hosts may fail it)"
    ]
    agent = master.registry.agents[x.agent_id]
    assert (agent.containers_failed, agent.containers_refused) == (1, 0)
    rec = await loop.book.get(wl.id)
    (y,) = rec.assignments
    assert (rec.state, rec.attempts, rec.restarts) == ("scheduled", 2, 0)
    assert y.agent_id != x.agent_id and rec.start_failed_on == [x.agent_id]


async def test_a_start_that_fails_through_every_host_it_may_try_fails_the_workload_with_the_last_hosts_words(master, link):
    for name in ("agt-a", "agt-b", "agt-c", "agt-d"):
        await host(master, link, name)
    loop = scheduler(master)
    await loop.book.load()
    wl = await loop.book.submit("alice", spec(), time.time())
    tried = []
    for _ in range(3):  # the first host and 2 others (LifecyclePolicy.start_retries)
        await loop.cycle()
        (x,) = (await loop.book.get(wl.id)).assignments
        tried.append(x.agent_id)
        failure = CommandResult(id=x.command_id, ok=False, error=f"engine on {x.agent_id} crashed", error_code="runtime_failure")
        await relay(master, link, x.agent_id, failure)
        await loop.cycle()

    rec = await loop.book.get(wl.id)
    assert len(set(tried)) == 3 and rec.start_failed_on == tried
    assert rec.state == "failed"
    assert rec.state_reason == f"1 of 1 container(s) did not start on {tried[-1]} (failed): engine on {tried[-1]} crashed"
    assert rec.host_failure == f"{tried[-1]}: container did not start (failed)"


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
    command = await master.create_command("agt-a", DeleteSpec(name="gone"))
    claim = CommandResult(id=command.id, ok=False, error="image not found", error_code="image_not_found")
    await relay(master, link, "agt-a", claim)
    agent = master.registry.agents["agt-a"]
    assert (agent.commands_failed, agent.containers_refused) == (1, 0)


async def test_the_loop_sends_image_none_to_the_process_runtime_host_and_an_image_to_the_container_engine(master, link):
    """The case of issue 37: image "none" went to a Podman host, which tried to pull docker.io/library/none."""
    await connect(master, link, "agt-box", gpus(2, prefix="GPU-box"), runtime="docker", isolation="container")
    await connect(master, link, "agt-proc", gpus(2, prefix="GPU-proc"), runtime="process", isolation="sandbox")
    book = WorkloadBook(master.store, master, policy=master.policy, egress=OPERATOR_ALLOWS_TEST_STORE)
    loop = SchedulerLoop(master, book, SchedulerSettings(grace_s=7.0, allow_process_runtime=True, stray_sweep_s=0.0))
    await loop.book.load()
    allowed = PlacementConstraints(allow_process_runtime=True)
    bare = [await loop.book.submit("alice", spec(f"bare{i}", image="none", constraints=allowed), time.time()) for i in range(3)]
    imaged = [await loop.book.submit("alice", spec(f"img{i}", constraints=allowed), time.time()) for i in range(3)]

    await loop.cycle()

    where = {rec.spec.name: [a.agent_id for a in rec.assignments] for rec in [await loop.book.get(w.id) for w in bare + imaged]}
    assert where == {
        "bare0": ["agt-proc"], "bare1": ["agt-proc"], "bare2": [],
        "img0": ["agt-box"], "img1": ["agt-box"], "img2": [],
    }  # fmt: skip
    assert all(c.body.spec["image"] == "none" for c in creates_sent(link, "agt-proc"))
    assert all(c.body.spec["image"] == "busybox" for c in creates_sent(link, "agt-box"))


async def test_a_hosts_image_source_from_hello_decides_at_submit_what_the_grid_can_never_get(master, link):
    """The demo's container host: its engine pulls nothing (no registry reachable) and has its locally built image."""
    demo_image, hub_image = "localhost/idlegrid-demo:1", "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    no_pulls = ImageSource(pull=False)
    await connect(
        master, link, "agt-demo", gpus(1), runtime="docker", isolation="container", images=[demo_image], image_source=no_pulls
    )
    assert master.registry.agents["agt-demo"].image_source == no_pulls
    loop = scheduler(master)
    await loop.book.load()

    reason = await loop.never_fits("alice", spec(image=hub_image)) or ""

    assert reason.startswith(f"no host of this grid with a container engine can get image {hub_image}"), reason
    assert await loop.never_fits("alice", spec(image=demo_image)) is None
    await connect(master, link, "agt-old", gpus(1), runtime="docker", isolation="container")  # no image_source: older
    loop = scheduler(master)  # a fresh snapshot
    assert await loop.never_fits("alice", spec(image=hub_image)) is None
