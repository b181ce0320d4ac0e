"""The platform PKI: certificates name their holder, only the platform CA's holders get through TLS, commands carry signatures."""

from __future__ import annotations

import asyncio
import socket
import ssl
import stat
import threading
import time
import warnings
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.errors import PKIError, SignatureError
from common.pki import (
    CertificateAuthority,
    CertRole,
    CommandSigner,
    CommandVerifier,
    certificate_fingerprint,
    client_tls_context,
    generate_key,
    identity_of,
    key_to_pem,
    load_cert,
    make_csr,
    peer_identity,
    server_tls_context,
    verify_issued_by,
    write_private_key,
)

HOUR = 3600.0


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    return CertificateAuthority.create(name="someone else's CA")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- the CA on disk


def test_ca_survives_save_and_load(tmp_path: Path, ca: CertificateAuthority):
    ca.save(tmp_path / "pki")
    loaded = CertificateAuthority.load(tmp_path / "pki")
    assert loaded.cert == ca.cert
    assert key_to_pem(loaded.key) == key_to_pem(ca.key)


def test_ca_save_keeps_the_key_private_and_the_directory_closed(tmp_path: Path, ca: CertificateAuthority):
    ca.save(tmp_path / "pki")
    assert mode_of(tmp_path / "pki") == 0o700
    assert mode_of(tmp_path / "pki" / "ca.key") == 0o600
    assert mode_of(tmp_path / "pki" / "ca.crt") == 0o644


def test_ca_load_names_the_missing_files(tmp_path: Path):
    with pytest.raises(PKIError, match=r"ca\.crt, ca\.key missing"):
        CertificateAuthority.load(tmp_path)


def test_ca_certificate_is_a_p256_ca_that_issues_only_leaves(ca: CertificateAuthority):
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    assert isinstance(ca.key.curve, ec.SECP256R1)
    assert ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign


def test_write_private_key_makes_an_existing_readable_file_private(tmp_path: Path):
    path = tmp_path / "agent.key"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private_key(path, key_to_pem(generate_key()))
    assert mode_of(path) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in tmp_path.iterdir()] == ["agent.key"]  # no temporary file left behind


# ---------------------------------------------------------------- certificates


def test_issued_certificate_names_role_and_identity(ca: CertificateAuthority):
    before = time.time()
    cert = ca.issue(CertRole.AGENT, "agt-3f2a", generate_key().public_key(), valid_s=HOUR)
    identity = identity_of(cert)
    assert (identity.role, identity.id) == (CertRole.AGENT, "agt-3f2a")
    assert identity.serial == format(cert.serial_number, "x")
    assert before + HOUR - 1 <= identity.not_after <= time.time() + HOUR
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "agt-3f2a"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "agent"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "idlegrid"
    verify_issued_by(cert, ca.cert)


def test_certificates_start_a_minute_early_for_clock_skew(ca: CertificateAuthority):
    cert = ca.issue(CertRole.AGENT, "agt-1", generate_key().public_key(), valid_s=HOUR, now=1_800_000_000.0)
    assert cert.not_valid_before_utc.timestamp() == 1_800_000_000.0 - 60


@pytest.mark.parametrize(
    ("role", "usages"),
    [
        (CertRole.MASTER, {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}),
        (CertRole.ACCESS, {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}),
        (CertRole.AGENT, {ExtendedKeyUsageOID.CLIENT_AUTH}),
        (CertRole.OPERATOR, {ExtendedKeyUsageOID.CLIENT_AUTH}),
    ],
)
def test_only_master_and_access_certificates_may_serve_tls(ca: CertificateAuthority, role: CertRole, usages: set):
    cert = ca.issue(role, "x-1", generate_key().public_key(), valid_s=HOUR)
    assert set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == usages


def test_server_certificate_carries_the_given_names_next_to_the_identity(ca: CertificateAuthority):
    _, cert_pem = ca.issue_keypair(
        CertRole.ACCESS, "relay-eu-1", valid_s=HOUR, dns_names=["relay.example"], ip_addresses=["127.0.0.1", "::1"]
    )
    san = load_cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["idlegrid://access/relay-eu-1"]
    assert san.get_values_for_type(x509.DNSName) == ["relay.example"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]


def test_issue_keypair_returns_a_key_matching_its_certificate(ca: CertificateAuthority):
    key_pem, cert_pem = ca.issue_keypair(CertRole.MASTER, "master", valid_s=HOUR)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert load_cert(cert_pem).public_key() == key.public_key()


def test_load_cert_reads_pem_and_der_alike(ca: CertificateAuthority):
    der = ca.cert.public_bytes(serialization.Encoding.DER)
    assert load_cert(der) == load_cert(ca.chain_pem()) == ca.cert
    assert certificate_fingerprint(load_cert(der)) == certificate_fingerprint(ca.cert)


def test_load_cert_refuses_garbage():
    with pytest.raises(PKIError, match="not a readable X.509 certificate"):
        load_cert(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")


def test_identity_of_refuses_a_certificate_without_an_idlegrid_uri(ca: CertificateAuthority):
    with pytest.raises(PKIError, match="exactly one is required"):
        identity_of(ca.cert)


@pytest.mark.parametrize("identity", ["", "agt/../master", "agt 1", "-agt", "a" * 65])
def test_issue_refuses_identities_that_would_not_survive_a_uri(ca: CertificateAuthority, identity: str):
    with pytest.raises(PKIError, match="is not allowed"):
        ca.issue(CertRole.AGENT, identity, generate_key().public_key(), valid_s=HOUR)


def test_issue_refuses_a_non_positive_lifetime(ca: CertificateAuthority):
    with pytest.raises(PKIError, match="validity must be positive"):
        ca.issue(CertRole.AGENT, "agt-1", generate_key().public_key(), valid_s=0)


# ---------------------------------------------------------------- CSRs


def test_sign_csr_ignores_the_subject_the_csr_asks_for(ca: CertificateAuthority):
    csr = make_csr(generate_key(), "master")
    identity = identity_of(ca.sign_csr(csr, CertRole.AGENT, "agt-77", valid_s=HOUR))
    assert (identity.role, identity.id) == (CertRole.AGENT, "agt-77")


def test_sign_csr_certifies_the_csr_key(ca: CertificateAuthority):
    key = generate_key()
    cert = ca.sign_csr(make_csr(key, "idlegrid-agent"), CertRole.AGENT, "agt-1", valid_s=HOUR)
    assert cert.public_key() == key.public_key()


def test_sign_csr_refuses_a_tampered_csr(ca: CertificateAuthority):
    der = x509.load_pem_x509_csr(make_csr(generate_key(), "idlegrid-agent")).public_bytes(serialization.Encoding.DER)
    tampered = x509.load_der_x509_csr(der.replace(b"idlegrid-agent", b"idlegrid-admin"))
    with pytest.raises(PKIError, match="CSR signature does not verify"):
        ca.sign_csr(tampered.public_bytes(serialization.Encoding.PEM), CertRole.AGENT, "agt-1", valid_s=HOUR)


def _csr(key, algorithm) -> bytes:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idlegrid-agent")])
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, algorithm)
        .public_bytes(serialization.Encoding.PEM)
    )


@pytest.mark.parametrize(
    ("key", "algorithm"),
    [(ec.generate_private_key(ec.SECP384R1()), hashes.SHA256()), (ed25519.Ed25519PrivateKey.generate(), None)],
    ids=["p384", "ed25519"],
)
def test_sign_csr_refuses_keys_other_than_p256(ca: CertificateAuthority, key, algorithm):
    csr = _csr(key, algorithm)
    with pytest.raises(PKIError, match="only ECDSA P-256"):
        ca.sign_csr(csr, CertRole.AGENT, "agt-1", valid_s=HOUR)


def test_sign_csr_refuses_what_is_not_a_csr(ca: CertificateAuthority):
    with pytest.raises(PKIError, match="not a PEM certificate signing request"):
        ca.sign_csr(ca.chain_pem(), CertRole.AGENT, "agt-1", valid_s=HOUR)


# ---------------------------------------------------------------- verify_issued_by


def test_verify_issued_by_refuses_another_cas_certificate(ca: CertificateAuthority, other_ca: CertificateAuthority):
    cert = other_ca.issue(CertRole.AGENT, "agt-1", generate_key().public_key(), valid_s=HOUR)
    with pytest.raises(PKIError, match="not issued by this CA"):
        verify_issued_by(cert, ca.cert)


def test_verify_issued_by_refuses_an_expired_certificate(ca: CertificateAuthority):
    cert = ca.issue(CertRole.AGENT, "agt-1", generate_key().public_key(), valid_s=HOUR, now=time.time() - 2 * HOUR)
    with pytest.raises(PKIError, match="expired"):
        verify_issued_by(cert, ca.cert)


def test_verify_issued_by_refuses_a_certificate_not_yet_valid(ca: CertificateAuthority):
    cert = ca.issue(CertRole.AGENT, "agt-1", generate_key().public_key(), valid_s=HOUR)
    with pytest.raises(PKIError, match="not yet valid"):
        verify_issued_by(cert, ca.cert, now=time.time() - HOUR)


# ---------------------------------------------------------------- real TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory, ca: CertificateAuthority, other_ca: CertificateAuthority) -> Path:
    """A master server certificate for localhost, and agent certificates: good, expired, from a stranger CA."""
    d = tmp_path_factory.mktemp("tls")
    (d / "ca.crt").write_bytes(ca.chain_pem())
    (d / "other-ca.crt").write_bytes(other_ca.chain_pem())
    _write_pair(
        d,
        "master",
        ca.issue_keypair(CertRole.MASTER, "master", valid_s=HOUR, dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
    )
    _write_pair(d, "agent", ca.issue_keypair(CertRole.AGENT, "agt-good", valid_s=HOUR))
    _write_pair(d, "stranger", other_ca.issue_keypair(CertRole.AGENT, "agt-impostor", valid_s=HOUR))
    key = generate_key()
    expired = ca.issue(CertRole.AGENT, "agt-old", key.public_key(), valid_s=HOUR, now=time.time() - 2 * HOUR)
    _write_pair(d, "expired", (key_to_pem(key), expired.public_bytes(serialization.Encoding.PEM)))
    return d


def _write_pair(d: Path, name: str, pair: tuple[bytes, bytes]) -> None:
    write_private_key(d / f"{name}.key", pair[0])
    (d / f"{name}.crt").write_bytes(pair[1])


async def greet(server: ssl.SSLContext, client: ssl.SSLContext, served: list[bool] | None = None) -> bytes:
    """Run a TLS server that answers with its peer's identity URI; return what the client reads.

    ``served`` gets an entry for every connection that got past the server's handshake.
    """

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if served is not None:
            served.append(True)
        try:
            writer.write(peer_identity(writer.get_extra_info("ssl_object")).uri.encode() + b"\n")
        except PKIError as exc:
            writer.write(f"refused: {exc}\n".encode())
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost"), 2
        )
        try:
            return await asyncio.wait_for(reader.readline(), 2)
        finally:
            writer.close()
    finally:
        srv.close()
        await srv.wait_closed()


def mutual_server(d: Path) -> ssl.SSLContext:
    return server_tls_context(d / "master.crt", d / "master.key", d / "ca.crt", require_client_cert=True)


async def test_mutual_tls_tells_the_server_who_the_client_is(tls_files: Path):
    client = client_tls_context(tls_files / "ca.crt", tls_files / "agent.crt", tls_files / "agent.key")
    assert await greet(mutual_server(tls_files), client) == b"idlegrid://agent/agt-good\n"


async def refused_by_server(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    # Under TLS 1.3 the client finishes its handshake before the server checks the client's
    # certificate, so the refusal shows up on the client's first read: an alert, a reset, or EOF.
    served: list[bool] = []
    try:
        answer = await greet(server, client, served)
    except (ssl.SSLError, ConnectionError):
        answer = b""
    return answer == b"" and not served


async def test_mutual_tls_refuses_a_client_without_a_certificate(tls_files: Path):
    assert await refused_by_server(mutual_server(tls_files), client_tls_context(tls_files / "ca.crt"))


async def test_mutual_tls_refuses_a_client_certificate_from_another_ca(tls_files: Path):
    client = client_tls_context(tls_files / "ca.crt", tls_files / "stranger.crt", tls_files / "stranger.key")
    assert await refused_by_server(mutual_server(tls_files), client)


async def test_mutual_tls_refuses_an_expired_client_certificate(tls_files: Path):
    client = client_tls_context(tls_files / "ca.crt", tls_files / "expired.crt", tls_files / "expired.key")
    assert await refused_by_server(mutual_server(tls_files), client)


async def test_client_refuses_a_server_from_another_ca(tls_files: Path):
    client = client_tls_context(tls_files / "other-ca.crt", tls_files / "agent.crt", tls_files / "agent.key")
    with pytest.raises(ssl.SSLCertVerificationError):
        await greet(mutual_server(tls_files), client)


async def test_peer_identity_says_when_the_peer_sent_no_certificate(tls_files: Path):
    server = server_tls_context(
        tls_files / "master.crt", tls_files / "master.key", tls_files / "ca.crt", require_client_cert=False
    )
    answer = await greet(server, client_tls_context(tls_files / "ca.crt"))
    assert answer.startswith(b"refused: peer presented no certificate")


def test_peer_identity_refuses_a_plain_connection():
    with pytest.raises(PKIError, match="not TLS"):
        peer_identity(None)


def test_tls_contexts_require_tls_1_2_at_least(tls_files: Path):
    assert mutual_server(tls_files).minimum_version == ssl.TLSVersion.TLSv1_2
    client = client_tls_context(tls_files / "ca.crt")
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED


def test_server_refuses_a_tls_1_1_client(tls_files: Path):
    client = client_tls_context(tls_files / "ca.crt", tls_files / "agent.crt", tls_files / "agent.key")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1_1 itself is deprecated, which is the point
        client.minimum_version = client.maximum_version = ssl.TLSVersion.TLSv1_1
    client.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this OpenSSL offer TLS 1.1 at all
    # Blocking sockets here, because asyncio hides the server's handshake error, the one thing to check.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server_error: list[BaseException] = []
        thread = threading.Thread(target=_accept_one, args=(listener, mutual_server(tls_files), server_error))
        thread.start()
        with socket.create_connection(listener.getsockname(), timeout=2) as raw, pytest.raises(ssl.SSLError):
            client.wrap_socket(raw, server_hostname="localhost")
        thread.join(2)
    assert "UNSUPPORTED_PROTOCOL" in str(server_error[0])


def _accept_one(listener: socket.socket, context: ssl.SSLContext, errors: list[BaseException]) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(2)
        try:
            context.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)


def test_tls_context_names_a_missing_certificate_file(tmp_path: Path, tls_files: Path):
    with pytest.raises(PKIError, match="cannot load certificate"):
        server_tls_context(tmp_path / "none.crt", tmp_path / "none.key", tls_files / "ca.crt", require_client_cert=True)


# ---------------------------------------------------------------- command signatures


@pytest.fixture
def signer() -> CommandSigner:
    return CommandSigner.generate()


@pytest.fixture
def verifier(signer: CommandSigner) -> CommandVerifier:
    return CommandVerifier({signer.key_id: signer.public_key_b64()})


def test_signed_command_verifies(signer: CommandSigner, verifier: CommandVerifier):
    verifier.verify(signer.key_id, b'{"id":"c1"}', signer.sign(b'{"id":"c1"}'))


def test_key_id_is_16_hex_characters_stable_for_the_key(signer: CommandSigner):
    assert len(signer.key_id) == 16 and int(signer.key_id, 16) >= 0
    assert CommandVerifier({signer.key_id: signer.public_key_b64()}).keys() == {signer.key_id: signer.public_key_b64()}


def test_tampered_command_is_refused(signer: CommandSigner, verifier: CommandVerifier):
    with pytest.raises(SignatureError, match="signature does not verify"):
        verifier.verify(signer.key_id, b'{"id":"c2"}', signer.sign(b'{"id":"c1"}'))


def test_command_signed_by_an_unknown_key_is_refused(verifier: CommandVerifier):
    stranger = CommandSigner.generate()
    with pytest.raises(SignatureError, match="unknown signing key"):
        verifier.verify(stranger.key_id, b"x", stranger.sign(b"x"))


def test_command_signed_by_a_retired_key_is_refused(signer: CommandSigner, verifier: CommandVerifier):
    verifier.retire_key(signer.key_id)
    with pytest.raises(SignatureError, match="unknown signing key .*retired"):
        verifier.verify(signer.key_id, b"x", signer.sign(b"x"))
    assert verifier.keys() == {}


@pytest.mark.parametrize("signature", ["not base64!", "c2hvcnQ="])
def test_malformed_signature_is_refused(signer: CommandSigner, verifier: CommandVerifier, signature: str):
    with pytest.raises(SignatureError, match="malformed signature"):
        verifier.verify(signer.key_id, b"x", signature)


def test_verifier_refuses_a_key_announced_under_another_keys_id(signer: CommandSigner):
    with pytest.raises(SignatureError, match="does not match its key"):
        CommandVerifier().add_key(signer.key_id, CommandSigner.generate().public_key_b64())


def test_signing_key_is_created_once_private_and_loaded_after(tmp_path: Path):
    path = tmp_path / "signing.key"
    first = CommandSigner.load_or_create(path)
    again = CommandSigner.load_or_create(path)
    assert again.key_id == first.key_id
    assert mode_of(path) == 0o600
    CommandVerifier({first.key_id: first.public_key_b64()}).verify(first.key_id, b"x", again.sign(b"x"))


def test_signing_key_file_holding_another_kind_of_key_is_refused(tmp_path: Path):
    write_private_key(tmp_path / "signing.key", key_to_pem(generate_key()))
    with pytest.raises(PKIError, match="not the Ed25519 command-signing key"):
        CommandSigner.load_or_create(tmp_path / "signing.key")
