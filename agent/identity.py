"""The agent's identity on disk: its key (0600), certificate, the platform CA and the command keys."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from agent.state import PRIVATE_FILE_MODE
from common.errors import ConfigError
from common.files import write_atomically
from common.pki import identity_of, load_cert

KEY_FILE, CERT_FILE, CA_FILE, IDENTITY_FILE = "agent.key", "agent.crt", "ca.crt", "identity.json"


@dataclass
class AgentIdentity:
    state_dir: Path
    agent_id: str
    command_keys: dict[str, str] = field(default_factory=dict)
    retired_keys: list[str] = field(default_factory=list)
    access_urls: list[str] = field(default_factory=list)
    http_url: str = ""

    @property
    def key_file(self) -> Path:
        return self.state_dir / KEY_FILE

    @property
    def cert_file(self) -> Path:
        return self.state_dir / CERT_FILE

    @property
    def ca_file(self) -> Path:
        return self.state_dir / CA_FILE

    @classmethod
    def load(cls, state_dir: Path) -> AgentIdentity:
        path = state_dir / IDENTITY_FILE
        if not path.exists():
            raise ConfigError(
                f"this host is not enrolled yet ({path} is missing): run `idlegrid agent enroll --token TOKEN --access URL`"
            )
        data = json.loads(path.read_text())
        identity = cls(state_dir=state_dir, **data)
        cert = identity_of(load_cert(identity.cert_file.read_bytes()))
        if cert.id != identity.agent_id:
            raise ConfigError(
                f"{identity.cert_file} names {cert.id}, not {identity.agent_id}: the state directory is inconsistent"
            )
        return identity

    def save(self) -> None:
        data = {
            "agent_id": self.agent_id,
            "command_keys": self.command_keys,
            "retired_keys": self.retired_keys,
            "access_urls": self.access_urls,
            "http_url": self.http_url,
        }
        write_atomically(self.state_dir / IDENTITY_FILE, json.dumps(data, indent=2).encode(), mode=PRIVATE_FILE_MODE)
