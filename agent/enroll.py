"""``idlegrid agent enroll``: generate a key here, send a CSR with a join token, store what comes back."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import msgspec

from agent.directory import save_directory
from agent.identity import CA_FILE, CERT_FILE, KEY_FILE, AgentIdentity
from agent.state import PRIVATE_FILE_MODE, private_dir
from common.errors import EnrollmentError, PKIError, SignatureError
from common.files import write_atomically
from common.pki import (
    generate_key,
    identity_of,
    key_to_pem,
    load_cert,
    make_csr,
    verify_issued_by,
    verify_key_endorsement,
    write_private_key,
)
from common.wire import RelayEntry


async def enroll(
    state_dir: Path,
    *,
    token: str,
    access_http_url: str,
    ca_file: Path,
    region: str = "",
    access_urls: list[str] | None = None,
    timeout_s: float = 30.0,
) -> AgentIdentity:
    """Enroll this host through an Access relay's HTTPS endpoint; the private key never leaves the host."""
    private_dir(state_dir)
    if not ca_file.exists():
        raise EnrollmentError(
            f"CA certificate {ca_file} not found: ask the operator for the platform's ca.crt", code="bad_request"
        )
    key = generate_key()
    csr = make_csr(key, "idlegrid-agent")
    answer = await _post_csr(access_http_url, ca_file, {"token": token, "csr_pem": csr.decode(), "region": region}, timeout_s)
    cert = load_cert(answer["cert_pem"].encode())
    ca_cert = load_cert(ca_file.read_bytes())
    try:
        verify_issued_by(cert, ca_cert)
    except PKIError as exc:
        raise EnrollmentError(
            f"the certificate the relay returned is not the platform's: {exc}", code="bad_certificate"
        ) from None
    agent_id = identity_of(cert).id
    keys = _endorsed_keys(ca_cert, answer.get("command_keys", {}), answer.get("key_endorsements", {}))
    write_private_key(state_dir / KEY_FILE, key_to_pem(key))
    write_atomically(state_dir / CERT_FILE, answer["cert_pem"].encode(), mode=PRIVATE_FILE_MODE)
    if ca_file.resolve() != (state_dir / CA_FILE).resolve():
        write_atomically(state_dir / CA_FILE, ca_file.read_bytes(), mode=PRIVATE_FILE_MODE)
    urls = list(access_urls or [])
    if not urls and answer.get("agent_url"):
        urls = [answer["agent_url"]]
    identity = AgentIdentity(
        state_dir=state_dir,
        agent_id=agent_id,
        command_keys=keys,
        access_urls=urls,
        http_url=access_http_url,
    )
    identity.save()
    save_directory(state_dir, _relay_directory(answer.get("relays")))
    return identity


async def _post_csr(base_url: str, ca_file: Path, payload: dict, timeout_s: float) -> dict:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    url = base_url.rstrip("/") + "/enroll"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.post(url, json=payload, ssl=context) as response:
                body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise EnrollmentError(f"could not reach the enrollment endpoint {url}: {exc}", code="unreachable") from None
    if response.status != 200:
        error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        raise EnrollmentError(
            f"enrollment refused ({response.status}): {error.get('message', body)}", code=error.get("code", "enrollment_refused")
        )
    return body


def _relay_directory(listed: object) -> list[RelayEntry]:
    """The relays the enrollment answer names (the relay passes on the Master's directory), if it names any.
    A malformed list is dropped: the Master sends the directory again at the first welcome."""
    if not listed:
        return []
    try:
        return msgspec.convert(listed, list[RelayEntry])
    except msgspec.ValidationError:
        return []


def _endorsed_keys(ca_cert, keys: dict[str, str], endorsements: dict[str, str]) -> dict[str, str]:
    """Only command-signing keys the platform CA endorsed are kept: the answer came through a relay."""
    trusted = {}
    for key_id, public in keys.items():
        try:
            verify_key_endorsement(ca_cert, public, endorsements.get(key_id, ""))
        except SignatureError as exc:
            raise EnrollmentError(f"command-signing key {key_id} refused: {exc}", code="bad_key") from None
        trusted[key_id] = public
    if not trusted:
        raise EnrollmentError("the enrollment answer carried no endorsed command-signing key", code="bad_key")
    return trusted
