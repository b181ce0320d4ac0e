"""The API shows a GPU's MIG mode and instances, and which container holds each (real Master, SQLite, no GPU: the
host reports a simulated A100 split into instances)."""

from __future__ import annotations

from common.containers import ContainerSpec
from tests.management.hosts import add_agent


async def test_a_split_gpu_shows_its_instances_and_who_holds_each(api):
    await add_agent(api.master, "agt-a", "a100:1:mig=3g.40gb+2g.20gb+1g.10gb*2")
    [gpu] = api.master.registry.gpus_of("agt-a")
    big, _, small, _ = (m.uuid for m in gpu.info.mig_instances)
    await api.master.create_command("agt-a", ContainerSpec(name="job-1", image="none", gpus=[small]))

    [shown] = (await (await api.get("/api/v1/gpus", headers=api.auth)).json())["items"]

    assert shown["mig"]["enabled"] is True and shown["held_by"] is None
    instances = shown["mig"]["instances"]
    assert [i["profile"] for i in instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [i["memory_mib"] for i in instances] == [40960, 20480, 10240, 10240]
    assert {i["uuid"]: i["held_by"] for i in instances}[small] == "job-1"
    assert {i["uuid"]: i["held_by"] for i in instances}[big] is None
    assert [i["held_by"] for i in instances].count(None) == 3
    agent = await (await api.get("/api/v1/agents/agt-a", headers=api.auth)).json()
    assert agent["gpus"][0]["mig"] == shown["mig"]


async def test_a_gpu_without_mig_shows_mig_off_and_its_whole_holder(api):
    await add_agent(api.master, "agt-a", "l4:1")
    await api.master.create_command("agt-a", ContainerSpec(name="job-1", image="none", gpus=["0"]))

    [shown] = (await (await api.get("/api/v1/gpus", headers=api.auth)).json())["items"]

    assert shown["mig"] == {"enabled": False, "instances": []}
    assert shown["held_by"] == "job-1"
