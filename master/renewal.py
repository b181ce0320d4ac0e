"""Certificate renewal over the authenticated link: whom the new certificate names comes from the link, never the CSR."""

from __future__ import annotations

from cryptography.hazmat.primitives.serialization import Encoding

from common.errors import IdlegridError, PKIError
from common.pki import CertificateAuthority, CertRole
from master.records import AgentRecord


class RenewalRefused(IdlegridError):
    code = "renewal_refused"


def renew_certificate(
    ca: CertificateAuthority, agent: AgentRecord, csr_pem: str, now: float, *, min_interval_s: float, valid_s: float
) -> str:
    """Sign the CSR for ``agent`` and record the new serial on it, keeping the old ones for revocation.

    Synchronous on purpose: the record names the new serial before any other task runs, so a
    revocation racing this renewal cannot miss the certificate it issues.
    """
    wait = agent.cert_issued_at + min_interval_s - now
    if wait > 0:
        raise RenewalRefused(f"certificate was renewed moments ago; ask again in {wait:.0f} s", code="renewal_too_soon")
    try:
        cert = ca.sign_csr(csr_pem.encode(), CertRole.AGENT, agent.id, valid_s=valid_s)
    except (PKIError, ValueError) as exc:
        raise RenewalRefused(f"certificate signing request refused: {exc}", code="bad_csr") from None
    still_valid = {serial: until for serial, until in agent.previous_serials.items() if until > now}
    if agent.cert_serial and agent.cert_not_after > now:
        still_valid[agent.cert_serial] = agent.cert_not_after
    agent.previous_serials = still_valid
    agent.cert_serial = format(cert.serial_number, "x")
    agent.cert_not_after = cert.not_valid_after_utc.timestamp()
    agent.cert_issued_at = now
    return cert.public_bytes(Encoding.PEM).decode()
