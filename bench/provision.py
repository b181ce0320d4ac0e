"""Enroll thousands of simulated agents quickly, through the Master's own enrollment code.

Going through a relay's HTTPS endpoint one agent at a time costs a TLS handshake, an HTTP round trip
and a relay-to-Master hop per agent, and the endpoint is rate-limited per address (as it should be).
So, before the Master process starts, this runs what the Master runs on an ``enroll_request``, in
process, on the Master's own state directory: a one-time join token is created and spent, the CSR
is signed by the platform CA, the agent is stored as ``enrolled`` and the ``agent.enrolled`` event
recorded (``Enrollment.enroll`` and ``Registry.add``). Each agent's key is generated here, standing
in for the host, and written 0600 into its state directory with what ``idlegrid agent enroll`` writes.
The Master then starts on that store and knows every agent, exactly as if each had enrolled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agent.identity import CA_FILE, CERT_FILE, KEY_FILE, AgentIdentity
from bench.fleet_agents import agent_dir
from common.pki import generate_key, key_to_pem, make_csr, write_private_key
from master.authority import Authority
from master.config import MasterConfig
from master.enrollment import Enrollment
from master.events import EventLog
from master.registry import Registry
from master.store import open_store
from master.tiers import TierPolicy

PROVIDER = "bench-provider"
TOKEN_TTL_S = 3600.0


@dataclass
class Provisioned:
    agent_ids: list[str]
    seconds: float


async def provision_agents(master_config: MasterConfig, agents_dir: Path, count: int, *, region: str = "") -> Provisioned:
    """Enroll ``count`` agents into the Master's store at ``master_config``; their state goes to ``agents_dir``."""
    started = time.monotonic()
    authority = Authority.open(master_config.state_path)
    store = open_store(master_config.resolved_store_url())
    await store.open()
    try:
        enrollment = Enrollment(store, authority.ca, cert_validity_s=master_config.agent_cert_s)
        registry = Registry(store, EventLog(store), TierPolicy.load(None))
        ca_pem = authority.ca.chain_pem()
        keys = authority.command_keys()
        ids = []
        for index in range(count):
            key = generate_key()
            token, _ = await enrollment.create_token(PROVIDER, TOKEN_TTL_S)
            agent, cert_pem = await enrollment.enroll(token, make_csr(key, "idlegrid-agent").decode(), region=region)
            await registry.add(agent)
            _write_state(agent_dir(agents_dir, index), agent.id, key_to_pem(key), cert_pem, ca_pem, keys)
            ids.append(agent.id)
    finally:
        await store.close()
    return Provisioned(ids, time.monotonic() - started)


def _write_state(
    state_dir: Path, agent_id: str, key_pem: bytes, cert_pem: bytes, ca_pem: bytes, command_keys: dict[str, str]
) -> None:
    """What ``agent.enroll.enroll`` leaves on a host; the fleet names the relays itself."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private_key(state_dir / KEY_FILE, key_pem)
    (state_dir / CERT_FILE).write_bytes(cert_pem)
    (state_dir / CA_FILE).write_bytes(ca_pem)
    AgentIdentity(state_dir=state_dir, agent_id=agent_id, command_keys=command_keys).save()
