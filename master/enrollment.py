"""Join tokens and enrollment: a one-time, expiring token bound to a provider buys one agent certificate."""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid

from cryptography.hazmat.primitives.serialization import Encoding

from common.errors import EnrollmentError, PKIError
from common.pki import CertificateAuthority, CertRole
from master.records import AgentRecord, TokenRecord
from master.states import AgentState
from master.store.base import Store, TokenOutcome

TOKEN_PREFIX = "igjt_"

_REFUSALS = {
    TokenOutcome.UNKNOWN: ("token_unknown", "join token is not valid: check it was copied whole, or create a new one"),
    TokenOutcome.USED: ("token_used", "join token was already used; each token enrolls one agent: create a new one"),
    TokenOutcome.EXPIRED: ("token_expired", "join token has expired; create a new one"),
}


def hash_secret(secret: str) -> str:
    """Tokens and API keys are high-entropy random strings, so a plain SHA-256 is a sound stored form."""
    return hashlib.sha256(secret.encode()).hexdigest()


class Enrollment:
    def __init__(self, store: Store, ca: CertificateAuthority, *, cert_validity_s: float) -> None:
        self._store = store
        self._ca = ca
        self._cert_validity_s = cert_validity_s

    async def create_token(self, provider: str, ttl_s: float) -> tuple[str, TokenRecord]:
        if not provider:
            raise EnrollmentError("a join token must name the provider account it enrolls hosts for", code="bad_request")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        record = TokenRecord(token_hash=hash_secret(token), provider=provider, created_at=now, expires_at=now + ttl_s)
        await self._store.tokens.put(record)
        return token, record

    async def enroll(self, token: str, csr_pem: str, *, region: str = "") -> tuple[AgentRecord, bytes]:
        """Consume the token and sign the CSR; returns the new agent and its certificate PEM."""
        agent_id = "agt-" + uuid.uuid4().hex[:16]
        # Signed before the token is spent, so a malformed CSR does not burn a valid token; the
        # certificate is thrown away unless the token is good.
        try:
            cert = self._ca.sign_csr(csr_pem.encode(), CertRole.AGENT, agent_id, valid_s=self._cert_validity_s)
        except (PKIError, ValueError) as exc:
            raise EnrollmentError(f"certificate signing request refused: {exc}", code="bad_csr") from None
        outcome, record = await self._store.tokens.consume(hash_secret(token), agent_id=agent_id, now=time.time())
        if outcome is not TokenOutcome.OK or record is None:
            code, message = _REFUSALS[outcome]
            raise EnrollmentError(message, code=code)
        now = time.time()
        agent = AgentRecord(
            id=agent_id,
            provider=record.provider,
            state=AgentState.ENROLLED.value,
            region=region,
            cert_serial=format(cert.serial_number, "x"),
            cert_not_after=cert.not_valid_after_utc.timestamp(),
            enrolled_at=now,
        )
        await self._store.agents.put(agent)
        return agent, cert.public_bytes(Encoding.PEM)
