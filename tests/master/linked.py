"""A real Master (SQLite in tmp_path) driven through its relay-link handlers, without sockets.

What stands in for a relay is only the WebSocket connection: ``RecordingConnection`` keeps what the
Master sends, so a test asserts what a relay (and the agent behind it) would have received. Everything
else is the Master itself: its store, registry, ledger, sessions and allocations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from common.inventory import GpuInfo, HostInfo, ImageSource, Inventory
from common.wire import (
    PROTOCOL_VERSIONS,
    AgentConnected,
    AgentDisconnected,
    Hello,
    MasterFrame,
    Relay,
    decode_link_frame,
    decode_master_frame,
    encode,
)
from master.link import AccessLink
from master.master import Master
from master.records import AgentRecord

HOST = HostInfo(
    hostname="gpu-host",
    cpu_model="EPYC",
    cpu_cores=32,
    ram_mib=256_000,
    disk_total_gib=1000,
    disk_free_gib=900,
    os="linux",
    kernel="6.1",
)


@dataclass
class RecordingConnection:
    sent: list[bytes | str] = field(default_factory=list)
    closed: tuple[int, str] | None = None

    async def send(self, data: bytes | str, text: bool = False) -> None:
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


def relay_link(relay_id: str = "relay-a", region: str = "eu", url: str = "") -> AccessLink:
    return AccessLink(relay_id=relay_id, region=region, connection=RecordingConnection(), public_url=url)  # type: ignore[arg-type]


def to_agent(link: AccessLink, agent_id: str) -> list[MasterFrame]:
    """Every frame the Master sent through ``link`` to ``agent_id``, in order."""
    frames = []
    for data in link.connection.sent:  # type: ignore[attr-defined]
        envelope = decode_link_frame(data)
        if isinstance(envelope, Relay) and envelope.agent_id == agent_id:
            frames.append(decode_master_frame(bytes(envelope.frame)))
    return frames


def gpus(count: int, *, prefix: str = "GPU-h100", name: str = "NVIDIA H100 80GB HBM3") -> list[GpuInfo]:
    return [
        GpuInfo(
            index=i,
            uuid=f"{prefix}-{i}",
            name=name,
            pci_bus_id=f"0000:{i:02x}:00.0",
            memory_total_mib=81_559,
            compute_capability="9.0",
            simulated=True,
        )
        for i in range(count)
    ]


def hello(
    gpu_list: list[GpuInfo],
    *,
    runtime: str = "",
    isolation: str = "",
    host: HostInfo = HOST,
    images: list[str] | None = None,
    image_source: ImageSource | None = None,
) -> Hello:
    inventory = Inventory(
        host=host,
        gpus=gpu_list,
        simulated=True,
        runtime=runtime,
        isolation=isolation,
        images=list(images or []),
        image_source=image_source,
    )
    return Hello(versions=list(PROTOCOL_VERSIONS), agent_version="test", inventory=inventory)


async def enrolled(master: Master, agent_id: str) -> AgentRecord:
    agent = AgentRecord(id=agent_id, provider="prov", state="enrolled", enrolled_at=time.time())
    await master.store.agents.put(agent)
    await master.registry.add(agent)
    return agent


async def relay(master: Master, link: AccessLink, agent_id: str, frame: msgspec.Struct | bytes) -> None:
    """``frame`` from ``agent_id`` arrives through ``link``, as a relay forwards it."""
    data = frame if isinstance(frame, bytes) else encode(frame)
    await master.channel.on_link_frame(link, Relay(agent_id=agent_id, frame=msgspec.Raw(data)))


async def connect(
    master: Master,
    link: AccessLink,
    agent_id: str,
    gpu_list: list[GpuInfo] | None = None,
    *,
    runtime: str = "",
    isolation: str = "",
    host: HostInfo = HOST,
    images: list[str] | None = None,
    image_source: ImageSource | None = None,
) -> None:
    """The agent (enrolled first if the Master does not know it) connects through ``link`` and says hello
    with ``gpu_list`` (two H100s by default) on ``host``, reporting ``runtime``, ``isolation``, the ``images`` it has
    and where it gets more (``image_source``)."""
    if agent_id not in master.registry.agents:
        await enrolled(master, agent_id)
    link.agents.add(agent_id)
    master.hub.links.setdefault(link.relay_id, link)
    await master.channel.on_link_frame(link, AgentConnected(agent_id=agent_id, serial="", cert_not_after=time.time() + 3600))
    gpu_list = gpus(2) if gpu_list is None else gpu_list
    said = hello(gpu_list, runtime=runtime, isolation=isolation, host=host, images=images, image_source=image_source)
    await relay(master, link, agent_id, said)


async def disconnect(master: Master, link: AccessLink, agent_id: str, reason: str = "") -> None:
    await master.channel.on_link_frame(link, AgentDisconnected(agent_id=agent_id, reason=reason))


async def events(master: Master, kind_prefix: str, subject: str | None = None) -> list[Any]:
    return await master.store.events.list(kind_prefix=kind_prefix, subject=subject, limit=10_000)
