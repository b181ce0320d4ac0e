"""Hosts and API keys put into a real Master the way it would have them: records, a hello, hashed keys."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from agent.simulate import SimulatedCollector
from common.inventory import GpuReach, HostInfo, Inventory, UnofferedGpu
from master.accounts import AccountRole
from master.enrollment import hash_secret
from master.master import Master
from master.records import AgentRecord, ApiKeyRecord

HOST = HostInfo(
    hostname="h1",
    cpu_model="EPYC",
    cpu_cores=64,
    ram_mib=512000,
    disk_total_gib=2000,
    disk_free_gib=1500,
    os="Debian 12",
    kernel="6.1",
)
# What an agent's self-test says of a GPU that did not reach its container (agent/runtime/docker.py words it so).
UNREACHABLE_DETAIL = "the engine at unix:///var/run/docker.sock dropped the request for GPUs"
UNREACHABLE_FIX = "install the NVIDIA Container Toolkit and set Docker up for it"


async def add_agent(
    master: Master,
    agent_id: str,
    simulate: str,
    *,
    provider: str = "prov",
    runtime: str = "",
    isolation: str = "",
    region: str = "eu-west",
    unreachable: Sequence[int] = (),
    unoffered: Sequence[UnofferedGpu] = (),
) -> None:
    """An enrolled agent that said hello through relay-1 with the simulated GPUs ``simulate`` describes.
    ``unreachable``: indexes of GPUs its self-test reports not reaching a container (the others reached one).
    ``unoffered``: cards its hello reports seen on the bus and not offered (agent/detect.py)."""
    agent = AgentRecord(id=agent_id, provider=provider, state="enrolled", enrolled_at=time.time())
    await master.store.agents.put(agent)
    await master.registry.add(agent)
    gpus = SimulatedCollector(simulate, host_key=agent_id).inventory()
    reach = [
        GpuReach(uuid=g.uuid, reachable=False, detail=UNREACHABLE_DETAIL, fix=UNREACHABLE_FIX)
        if g.index in unreachable
        else GpuReach(uuid=g.uuid, reachable=True, detail="seen in a docker container")
        for g in gpus
    ]
    inventory = Inventory(
        host=HOST,
        gpus=gpus,
        simulated=True,
        runtime=runtime,
        isolation=isolation,
        gpu_reach=reach if unreachable else [],
        unoffered=list(unoffered),
    )
    await master.registry.on_hello(agent, inventory, relay="relay-1", region=region, now=time.time())


async def api_key(master: Master, role: str, subject: str = "") -> dict[str, str]:
    """The Authorization header of a new key for account ``subject`` (created with ``role`` if it does not exist),
    as the Master issues them; with no ``subject``, a legacy key naming no account, written into the store by hand."""
    if subject:
        await master.accounts.ensure(subject, AccountRole(role))
        issued = await master.accounts.create_key(subject, f"{role} {subject}")
        return {"Authorization": f"Bearer {issued.key}"}
    key = "igak_" + secrets.token_urlsafe(16)
    record = ApiKeyRecord(key_hash=hash_secret(key), name=f"{role} key", role=role, created_at=time.time())
    await master.store.api_keys.put(record)
    return {"Authorization": f"Bearer {key}"}
