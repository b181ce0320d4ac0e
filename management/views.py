"""What the API shows of the Master's records: plain JSON-ready dicts, one function per resource."""

from __future__ import annotations

from typing import Any

import msgspec

from common.inventory import GpuSample
from master.keys import SigningKeyInfo
from master.records import AgentRecord, CommandRecord, EventRecord, GpuRecord
from master.reputation import reputation


def gpu_view(gpu: GpuRecord, latest: GpuSample | None = None) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "agent_id": gpu.agent_id,
        "index": gpu.index,
        "name": gpu.info.name,
        "model": gpu.model,
        "tier": gpu.tier,
        "state": gpu.state,
        "flags": gpu.flags,
        "memory_total_mib": gpu.info.memory_total_mib,
        "compute_capability": gpu.info.compute_capability,
        "pcie": {"gen": gpu.info.pcie_gen, "width": gpu.info.pcie_width},
        "nvlinks": sum(1 for link in gpu.info.nvlinks if link.active),
        "simulated": gpu.info.simulated,
        "telemetry": msgspec.to_builtins(latest) if latest is not None else None,
    }


def agent_view(agent: AgentRecord, gpus: list[GpuRecord], latest: dict[str, GpuSample] | None = None) -> dict[str, Any]:
    latest = latest or {}
    return {
        "id": agent.id,
        "provider": agent.provider,
        "state": agent.state,
        "state_reason": agent.state_reason,
        "region": agent.region,
        "relay": agent.relay,
        "simulated": agent.simulated,
        "host": msgspec.to_builtins(agent.host) if agent.host else None,
        "enrolled_at": agent.enrolled_at,
        "last_seen": agent.last_seen or None,
        "connected_since": agent.connected_since,
        "cert_serial": agent.cert_serial,
        "cert_not_after": agent.cert_not_after,
        "drained": agent.drained,
        "containers": sorted(agent.containers),
        "gpus": [gpu_view(g, latest.get(g.uuid)) for g in gpus],
        "reputation": msgspec.to_builtins(reputation(agent)),
    }


def command_view(command: CommandRecord) -> dict[str, Any]:
    return {
        "id": command.id,
        "agent_id": command.agent_id,
        "kind": command.kind,
        "spec": command.spec,
        "state": command.state,
        "created_at": command.created_at,
        "deadline": command.deadline,
        "sent_at": command.sent_at,
        "acked_at": command.acked_at,
        "finished_at": command.finished_at,
        "attempts": command.attempts,
        "key_id": command.key_id,  # the command-signing key its signature is made with
        "result": command.result,
        "error": command.error,
    }


def event_view(event: EventRecord) -> dict[str, Any]:
    return msgspec.to_builtins(event)


def signing_key_view(key: SigningKeyInfo) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "public_key": key.public_key,
        "state": key.state.value,
        "created_at": key.created_at,
        "retired_at": key.retired_at,
    }
