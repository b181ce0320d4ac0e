"""The platform's keys on the Master's disk: the CA, the Master's TLS certificate, the command-signing keys."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.pki import CertificateAuthority, CertRole, CommandSigner, write_private_key
from master.keys import SigningKeyRing

_SERVER_CERT_S = 365 * 86400.0


@dataclass
class Authority:
    pki_dir: Path
    ca: CertificateAuthority
    keys: SigningKeyRing

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def cert_file(self) -> Path:
        return self.pki_dir / "master.crt"

    @property
    def key_file(self) -> Path:
        return self.pki_dir / "master.key"

    @classmethod
    def open(cls, state_dir: Path, *, names: Sequence[str] = ("localhost",), ips: Sequence[str] = ("127.0.0.1",)) -> Authority:
        """Load the platform keys under ``state_dir/pki``, creating whatever is missing."""
        pki_dir = state_dir / "pki"
        pki_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (pki_dir / "ca.key").exists():
            ca = CertificateAuthority.load(pki_dir)
        else:
            ca = CertificateAuthority.create()
            ca.save(pki_dir)
        authority = cls(pki_dir, ca, SigningKeyRing.open(pki_dir, ca))
        if not authority.cert_file.exists():
            authority.write_server_identity(pki_dir, CertRole.MASTER, "master", names=names, ips=ips, prefix="master")
        return authority

    @property
    def signer(self) -> CommandSigner:
        """The key that signs new commands; it changes when an operator rotates keys."""
        return self.keys.current

    def command_keys(self) -> dict[str, str]:
        return self.keys.command_keys()

    def key_endorsements(self) -> dict[str, str]:
        return self.keys.key_endorsements()

    def write_server_identity(
        self,
        out_dir: Path,
        role: CertRole,
        identity: str,
        *,
        names: Sequence[str] = ("localhost",),
        ips: Sequence[str] = ("127.0.0.1",),
        prefix: str | None = None,
    ) -> tuple[Path, Path, Path]:
        """Issue a certificate for a server daemon; returns (cert, key, ca) paths in ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        prefix = prefix or identity
        key_pem, cert_pem = self.ca.issue_keypair(role, identity, valid_s=_SERVER_CERT_S, dns_names=names, ip_addresses=ips)
        cert_path, key_path, ca_path = out_dir / f"{prefix}.crt", out_dir / f"{prefix}.key", out_dir / "ca.crt"
        write_private_key(key_path, key_pem)
        cert_path.write_bytes(cert_pem)
        if ca_path.resolve() != self.ca_file.resolve():
            ca_path.write_bytes(self.ca.chain_pem())
        os.chmod(cert_path, 0o644)
        return cert_path, key_path, ca_path
