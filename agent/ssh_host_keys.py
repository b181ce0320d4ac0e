"""The SSH host keys of this host's workloads (docs/ssh.md): one Ed25519 key per workload, derived from a seed that
never leaves the host.

The private half is never stored or sent: it is derived again whenever it is needed, from ``<state_dir>/ssh_host_seed``
(32 random bytes, 0600, made at first use) and the workload's id (HKDF-SHA256). The public half travels in the result of
the container's create command, which the Master keeps and publishes (``GET /api/v1/workloads/{id}/ssh``), so a renter's
``ssh`` verifies the host it reaches through a relay it need not trust: a relay carries the SSH bytes but holds no
host key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agent.state import private_file

SEED_FILE = "ssh_host_seed"
SEED_BYTES = 32
_INFO = b"idlegrid ssh host key\0"


class HostKeys:
    """Per-workload SSH host keys from one seed."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_BYTES:
            raise ValueError(f"an SSH host key seed is {SEED_BYTES} bytes, got {len(seed)}")
        self._seed = seed

    @classmethod
    def at(cls, state_dir: Path) -> HostKeys:
        """The host's keys, their seed read from ``state_dir`` (made there, 0600, the first time)."""
        path = state_dir / SEED_FILE
        seed = path.read_bytes() if path.exists() else b""
        if len(seed) != SEED_BYTES:  # new, or cut short by a crash while it was written: a fresh one
            private_file(path)
            seed = secrets.token_bytes(SEED_BYTES)
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, seed)
                os.fsync(fd)
            finally:
                os.close(fd)
        return cls(seed)

    def private_key(self, workload: str) -> Ed25519PrivateKey:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO + workload.encode()).derive(self._seed)
        return Ed25519PrivateKey.from_private_bytes(derived)

    def openssh_private(self, workload: str) -> bytes:
        """The private key in OpenSSH's format (what the SSH library loads)."""
        return self.private_key(workload).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )

    def public_line(self, workload: str) -> str:
        """``ssh-ed25519 AAAA...``: the public half, as known_hosts holds it."""
        public = self.private_key(workload).public_key()
        return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")
