"""Renewing the agent's certificate over its authenticated link, before the certificate expires.

Certificates are short-lived (a week by default), so an agent renews at a fixed fraction of each
certificate's lifetime (two thirds by default): the remaining third leaves days for retries while a
relay or the Master is away.

Each renewal uses a fresh key. Renewing with the old key would be simpler, but then one leaked key
(an old backup, a disk image) would stay good for as long as the host keeps renewing; with a fresh
key, a copy of the key is worthless once the certificate issued for it has expired.

Key and certificate must change together, and a crash must never leave a key beside a certificate
for another key: the new pair is first written in full, 0600, next to the old one (``*.next``), then
moved over it key first, certificate last. ``recover_interrupted_renewal`` finishes or undoes a
renewal a crash interrupted, before the agent reads its credentials. The running connection keeps
the TLS session it opened with; the new pair is used from the next connection on.

``CertificateRenewer`` decides when to ask and checks the answer; it does no network I/O itself.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from agent.identity import CERT_FILE, KEY_FILE
from common.errors import ConfigError, PKIError
from common.files import fsync_directory
from common.pki import (
    CLOCK_SKEW_S,
    CertRole,
    Identity,
    generate_key,
    identity_of,
    key_to_pem,
    load_cert,
    make_csr,
    verify_issued_by,
    write_private_key,
)
from common.wire import RenewRequest, RenewResponse

NEXT_KEY_FILE, NEXT_CERT_FILE = KEY_FILE + ".next", CERT_FILE + ".next"
DEFAULT_RENEW_FRACTION = 2 / 3
# An unanswered request is asked again after this long (less when the certificate has less time left).
ANSWER_TIMEOUT_S = 30.0
# After a refusal or a bad answer, ask again after a tenth of the time left, within these bounds.
MIN_RETRY_S, MAX_RETRY_S = 1.0, 300.0


class RenewalError(PKIError):
    """The Master refused the renewal, or its answer could not be trusted; the current certificate stays."""

    code = "renewal_failed"


# --- the files ---------------------------------------------------------------------------------


def install_credentials(state_dir: Path, key_pem: bytes, cert_pem: bytes) -> None:
    """Replace the agent's key and certificate with a new pair, crash-safely (see the module docstring)."""
    write_private_key(state_dir / NEXT_KEY_FILE, key_pem)
    # The certificate is written last: its staged copy existing means the staged pair is complete.
    write_private_key(state_dir / NEXT_CERT_FILE, cert_pem)
    _promote_staged(state_dir)


def recover_interrupted_renewal(state_dir: Path) -> bool:
    """Finish a renewal that was written in full but not yet moved in, or drop a half-written one.

    Returns True when a new pair was moved in.
    """
    if (state_dir / NEXT_CERT_FILE).exists():
        _promote_staged(state_dir)
        return True
    (state_dir / NEXT_KEY_FILE).unlink(missing_ok=True)  # its certificate never arrived: the old pair stands
    return False


def _promote_staged(state_dir: Path) -> None:
    if (state_dir / NEXT_KEY_FILE).exists():
        os.replace(state_dir / NEXT_KEY_FILE, state_dir / KEY_FILE)
    os.replace(state_dir / NEXT_CERT_FILE, state_dir / CERT_FILE)
    fsync_directory(state_dir)  # the renames themselves must survive a power cut


# --- deciding and checking ---------------------------------------------------------------------


def renewal_due_at(cert: x509.Certificate, fraction: float) -> float:
    """When ``fraction`` of the certificate's lifetime has passed.

    Certificates are backdated by ``CLOCK_SKEW_S`` for peers with slow clocks; that margin is not
    lifetime, or a short certificate would look due the moment it arrives.
    """
    not_after = cert.not_valid_after_utc.timestamp()
    issued = min(cert.not_valid_before_utc.timestamp() + CLOCK_SKEW_S, not_after)
    return issued + fraction * (not_after - issued)


class CertificateRenewer:
    """When to ask for a new certificate, what to ask with, and whether an answer can be installed."""

    def __init__(
        self, state_dir: Path, agent_id: str, ca_cert: x509.Certificate, *, fraction: float = DEFAULT_RENEW_FRACTION
    ) -> None:
        if not 0 < fraction < 1:
            raise ConfigError(f"cert_renew_fraction must be between 0 and 1 (exclusive), got {fraction}")
        self.state_dir = state_dir
        self.agent_id = agent_id
        self.fraction = fraction
        self._ca_cert = ca_cert
        self._pending: ec.EllipticCurvePrivateKey | None = None  # the key the last request asked to certify
        self._retry_at: float | None = None  # set while a request is unanswered or after a failure
        self._load_current()

    @property
    def not_after(self) -> float:
        return self._cert.not_valid_after_utc.timestamp()

    @property
    def serial(self) -> str:
        return format(self._cert.serial_number, "x")

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def due_at(self) -> float:
        return renewal_due_at(self._cert, self.fraction)

    def next_attempt_at(self) -> float:
        """When to send the next request: the due time, or a retry time once asking has begun."""
        return self._retry_at if self._retry_at is not None else self.due_at()

    def expired(self, now: float) -> bool:
        return now >= self.not_after

    def request(self, now: float) -> RenewRequest:
        """The request to send now. Repeats keep the same key, so a late answer to an earlier one still fits."""
        if self._pending is None:
            self._pending = generate_key()
        self._retry_at = now + min(ANSWER_TIMEOUT_S, max(MIN_RETRY_S, (self.not_after - now) / 4))
        return RenewRequest(csr_pem=make_csr(self._pending, self.agent_id).decode())

    def accept(self, response: RenewResponse, now: float) -> Identity:
        """Check the answer and install the new key and certificate; raises ``RenewalError`` otherwise.

        The answer came through a relay, so it is trusted only if the platform CA issued it, it names
        this agent, and it certifies the key this agent generated.
        """
        if self._pending is None:
            raise RenewalError("received a renewal answer but no renewal was asked for; ignored")
        try:
            cert = self._check(response, now)
        except RenewalError:
            self._retry_at = now + self._retry_delay(now)
            raise
        install_credentials(self.state_dir, key_to_pem(self._pending), cert.public_bytes(Encoding.PEM))
        self._pending, self._retry_at = None, None
        self._cert = cert
        return identity_of(cert)

    def _check(self, response: RenewResponse, now: float) -> x509.Certificate:
        assert self._pending is not None
        if response.error or not response.cert_pem:
            raise RenewalError(f"the Master refused to renew this agent's certificate: {response.error or 'no certificate sent'}")
        try:
            cert = load_cert(response.cert_pem.encode())
            verify_issued_by(cert, self._ca_cert, now=now)
            identity = identity_of(cert)
        except PKIError as exc:
            raise RenewalError(f"renewed certificate refused: {exc}") from None
        if identity.role is not CertRole.AGENT or identity.id != self.agent_id:
            raise RenewalError(f"renewed certificate names {identity.uri}, not this agent ({self.agent_id}); refused")
        if _public_bytes(cert.public_key()) != _public_bytes(self._pending.public_key()):
            raise RenewalError("renewed certificate is for another key than the one this agent generated; refused")
        return cert

    def _retry_delay(self, now: float) -> float:
        return min(MAX_RETRY_S, max(MIN_RETRY_S, (self.not_after - now) / 10))

    def _load_current(self) -> None:
        path = self.state_dir / CERT_FILE
        try:
            self._cert = load_cert(path.read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read this agent's certificate {path}: {exc.strerror}") from None


def _public_bytes(key: object) -> bytes:
    return key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)  # type: ignore[attr-defined]


def describe_expiry(renewer: CertificateRenewer, now: float | None = None) -> str | None:
    """A message for the operator when the certificate can no longer be renewed, else None."""
    at = time.time() if now is None else now
    if not renewer.expired(at):
        return None
    return (
        f"this agent's certificate {renewer.serial} expired {at - renewer.not_after:.0f} s ago; relays refuse it "
        f"and it cannot be renewed over the link: enroll this host again with a new join token"
    )
