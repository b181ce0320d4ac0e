"""A workload's object storage and secrets from the spec to the host: checked at submit, resolved when the create is
built (never shown back), the workload's own stop grace. A real Master (SQLite) with linked simulated hosts."""

from __future__ import annotations

import time

import msgspec
import pytest

from common.storage import CheckpointSpec, StorageAccess, StorageMount
from management.views.grid import command_view
from management.views.workloads import workload_spec_view
from management.workloads.spec import InvalidWorkloadSpec
from management.workloads.states import WorkloadState
from tests.management.workloads.test_runner import creates_sent, host, scheduler, spec


def storage(**overrides):
    fields = {
        "inputs": [StorageMount(uri="s3://data/sets/mnist/", path="/data")],
        "outputs": [StorageMount(uri="s3://runs/out/", path="/out")],
        "checkpoint": CheckpointSpec(uri="s3://runs/ckpt/", period_s=60),
        "storage": StorageAccess(credentials="s3-keys", endpoint="http://127.0.0.1:9000"),
    }
    return fields | overrides


async def test_submit_names_what_is_wrong_with_storage_before_anything_is_queued(master, link):
    loop = scheduler(master)
    await loop.book.load()
    with pytest.raises(InvalidWorkloadSpec, match="no secret named 's3-keys'"):
        await loop.book.submit("alice", spec(**storage()), time.time())
    await master.secrets.create("alice", "s3-keys", "AKIA:secret")
    with pytest.raises(InvalidWorkloadSpec, match="need 'storage'"):
        await loop.book.submit("alice", spec(**storage(storage=None)), time.time())
    with pytest.raises(InvalidWorkloadSpec, match="outputs\\[0\\]: path /data/x overlaps inputs\\[0\\]"):
        await loop.book.submit("alice", spec(**storage(outputs=[StorageMount(uri="s3://runs/o/", path="/data/x")])), time.time())
    with pytest.raises(InvalidWorkloadSpec, match="not a bucket name"):
        await loop.book.submit("alice", spec(**storage(inputs=[StorageMount(uri="s3://B_ad/x", path="/in")])), time.time())
    with pytest.raises(InvalidWorkloadSpec, match="no secret named 'hf'"):
        await loop.book.submit("alice", spec(env={"HF_TOKEN": "${secret:hf}"}), time.time())
    # another account's secret of that name is not this one's
    with pytest.raises(InvalidWorkloadSpec, match="no secret named 's3-keys'"):
        await loop.book.submit("bob", spec(**storage()), time.time())
    assert loop.book.open_workloads() == []


async def test_secrets_reach_the_host_in_the_create_and_no_answer_shows_them(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    await master.secrets.create("alice", "s3-keys", "AKIAALICE:alice-secret-key")
    await master.secrets.create("alice", "hf", "hf_alice_token")
    wl = await loop.book.submit(
        "alice", spec(env={"HF_TOKEN": "${secret:hf}", "PLAIN": "1"}, stop_grace_s=120, **storage()), time.time()
    )
    await loop.cycle()
    (create,) = creates_sent(link, "agt-a")
    sent = create.body.spec
    assert sent["env"] == {"HF_TOKEN": "hf_alice_token", "PLAIN": "1"}
    assert sent["storage"]["credentials"] == {"access_key_id": "AKIAALICE", "secret_access_key": "alice-secret-key"}
    assert sent["storage"]["endpoint"] == "http://127.0.0.1:9000"
    assert sent["storage"]["checkpoint"] == {"uri": "s3://runs/ckpt/", "period_s": 60.0}
    assert sent["storage"]["inputs"] == [{"uri": "s3://data/sets/mnist/", "path": "/data"}]

    view = msgspec.json.encode(workload_spec_view(await loop.book.get(wl.id))).decode()
    shown = repr(command_view(await master.command(create.body.id)))
    for secret in ("alice-secret-key", "hf_alice_token"):
        assert secret not in view and secret not in shown
    assert '"credentials":"s3-keys"' in view  # the spec shows the secret's name

    # The grid stops it with the workload's own grace (long enough to upload its checkpoint).
    await loop.book.cancel(wl.id, account_scope="alice", now=time.time())
    deletes = [c for c in master.commands.open.values() if c.kind == "delete_container"]
    assert [d.spec["timeout_s"] for d in deletes] == [120]


async def test_a_secret_deleted_after_submit_fails_the_start_naming_it_and_blames_no_host(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    await master.secrets.create("alice", "s3-keys", "AKIA:secret")
    wl = await loop.book.submit("alice", spec(**storage()), time.time())
    await master.secrets.delete("alice", "s3-keys")
    await loop.cycle()
    assert creates_sent(link, "agt-a") == []
    rec = await loop.book.get(wl.id)
    assert rec.state == WorkloadState.FAILED and "secret 's3-keys' no longer exists" in rec.state_reason
    assert rec.host_failure == ""


async def test_each_replica_of_a_gang_gets_its_own_checkpoint_and_outputs_and_a_fetching_create_more_time(master, link):
    await host(master, link, "agt-a")
    await host(master, link, "agt-b")
    loop = scheduler(master)
    await loop.book.load()
    await master.secrets.create("alice", "s3-keys", "AKIA:secret")
    await loop.book.submit("alice", spec(replicas=2, network="none", **storage()), time.time())
    await loop.cycle()
    sent = [c for agent in ("agt-a", "agt-b") for c in creates_sent(link, agent)]
    by_replica = {c.body.spec["replica"]: c for c in sent}
    for n in (0, 1):
        st = by_replica[n].body.spec["storage"]
        assert st["checkpoint"]["uri"] == f"s3://runs/ckpt/replica-{n}/"
        assert st["outputs"] == [{"uri": f"s3://runs/out/replica-{n}/", "path": "/out"}]
        assert st["inputs"] == [{"uri": "s3://data/sets/mnist/", "path": "/data"}]  # inputs are shared
        # inputs and a checkpoint to fetch: the create gets the pull allowance, as a pull does
        body = by_replica[n].body
        assert body.deadline - body.issued_at >= loop.settings.start_timeout_s + loop.settings.pull_allowance_s - 1
