"""Certificate renewal on the agent: when it asks, what it trusts in the answer, and how the new pair lands on disk."""

import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from agent.credentials import (
    NEXT_CERT_FILE,
    NEXT_KEY_FILE,
    CertificateRenewer,
    RenewalError,
    describe_expiry,
    install_credentials,
    recover_interrupted_renewal,
    renewal_due_at,
)
from agent.identity import CERT_FILE, KEY_FILE
from common.errors import ConfigError
from common.pki import (
    CertificateAuthority,
    CertRole,
    client_tls_context,
    generate_key,
    identity_of,
    key_to_pem,
    load_cert,
    write_private_key,
)
from common.wire import RenewResponse

AGENT = "agt-0123456789abcdef"


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
def state_dir(tmp_path: Path, ca) -> Path:
    """An enrolled agent's files: its key, a 20 s certificate, the CA."""
    key = generate_key()
    write_private_key(tmp_path / KEY_FILE, key_to_pem(key))
    (tmp_path / CERT_FILE).write_bytes(ca.issue(CertRole.AGENT, AGENT, key.public_key(), valid_s=20).public_bytes(Encoding.PEM))
    (tmp_path / "ca.crt").write_bytes(ca.chain_pem())
    return tmp_path


def answer(ca: CertificateAuthority, csr_pem: str, agent_id: str = AGENT, valid_s: float = 20) -> RenewResponse:
    """What the Master sends back: the CSR signed for the identity the link names."""
    cert = ca.sign_csr(csr_pem.encode(), CertRole.AGENT, agent_id, valid_s=valid_s)
    return RenewResponse(cert_pem=cert.public_bytes(Encoding.PEM).decode())


def test_renewal_is_due_at_the_configured_fraction_of_the_lifetime_not_counting_the_backdating(ca):
    now = time.time()
    cert = ca.issue(CertRole.AGENT, AGENT, generate_key().public_key(), valid_s=30, now=now)
    assert renewal_due_at(cert, 2 / 3) == pytest.approx(now + 20, abs=1)


def test_the_fraction_must_leave_time_before_expiry(state_dir, ca):
    for bad in (0, 1, 1.5):
        with pytest.raises(ConfigError, match="cert_renew_fraction"):
            CertificateRenewer(state_dir, AGENT, ca.cert, fraction=bad)


def public_numbers(key: object) -> ec.EllipticCurvePublicNumbers:
    assert isinstance(key, ec.EllipticCurvePublicKey)  # the agent's keys are EC keys
    return key.public_numbers()


def test_repeated_requests_ask_for_the_same_new_key(state_dir, ca):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    first, second = renewer.request(time.time()), renewer.request(time.time())
    keys = {public_numbers(x509.load_pem_x509_csr(r.csr_pem.encode()).public_key()) for r in (first, second)}
    assert len(keys) == 1
    current = public_numbers(load_cert((state_dir / CERT_FILE).read_bytes()).public_key())
    assert current not in keys  # a fresh key, not the one in use


def test_an_accepted_certificate_and_its_new_key_replace_the_old_pair_privately(state_dir, ca):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    old_serial, old_key = renewer.serial, (state_dir / KEY_FILE).read_bytes()
    identity = renewer.accept(answer(ca, renewer.request(time.time()).csr_pem), time.time())

    assert identity.id == AGENT and identity.serial != old_serial
    assert identity_of(load_cert((state_dir / CERT_FILE).read_bytes())).serial == identity.serial
    assert (state_dir / KEY_FILE).read_bytes() != old_key
    for name in (KEY_FILE, CERT_FILE):
        assert (state_dir / name).stat().st_mode & 0o777 == 0o600
    assert not (state_dir / NEXT_KEY_FILE).exists() and not (state_dir / NEXT_CERT_FILE).exists()
    client_tls_context(state_dir / "ca.crt", state_dir / CERT_FILE, state_dir / KEY_FILE)  # key and cert match
    assert renewer.serial == identity.serial and not renewer.pending
    assert renewer.next_attempt_at() > time.time() + 5  # the next renewal is due from the new certificate


@pytest.mark.parametrize("problem", ["refused", "other_ca", "other_agent", "other_key", "expired"])
def test_an_untrustworthy_answer_is_refused_and_the_old_pair_kept(state_dir, ca, problem):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    csr = renewer.request(time.time()).csr_pem
    response = {
        "refused": lambda: RenewResponse(error="agent is retired"),
        "other_ca": lambda: answer(CertificateAuthority.create("rogue"), csr),
        "other_agent": lambda: answer(ca, csr, agent_id="agt-someone-else"),
        "other_key": lambda: RenewResponse(
            cert_pem=ca.issue(CertRole.AGENT, AGENT, generate_key().public_key(), valid_s=20).public_bytes(Encoding.PEM).decode()
        ),
        "expired": lambda: RenewResponse(
            cert_pem=ca.sign_csr(csr.encode(), CertRole.AGENT, AGENT, valid_s=1).public_bytes(Encoding.PEM).decode()
        ),
    }[problem]()
    before = {name: (state_dir / name).read_bytes() for name in (KEY_FILE, CERT_FILE)}
    at = time.time() + (100 if problem == "expired" else 0)
    with pytest.raises(RenewalError):
        renewer.accept(response, at)
    assert {name: (state_dir / name).read_bytes() for name in (KEY_FILE, CERT_FILE)} == before
    assert renewer.pending and renewer.next_attempt_at() <= at + 300  # it asks again, with the same key


def test_an_answer_nobody_asked_for_is_ignored(state_dir, ca):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    with pytest.raises(RenewalError, match="no renewal was asked for"):
        renewer.accept(RenewResponse(error="whatever"), time.time())


def test_an_unanswered_request_is_sent_again_before_the_certificate_runs_out(state_dir, ca):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    now = time.time()
    renewer.request(now)
    assert now < renewer.next_attempt_at() < renewer.not_after


def staged_pair(state_dir: Path, ca: CertificateAuthority) -> tuple[bytes, bytes]:
    key = generate_key()
    cert = ca.issue(CertRole.AGENT, AGENT, key.public_key(), valid_s=20).public_bytes(Encoding.PEM)
    return key_to_pem(key), cert


def test_a_renewal_interrupted_after_staging_is_finished_at_startup(state_dir, ca):
    key_pem, cert_pem = staged_pair(state_dir, ca)
    write_private_key(state_dir / NEXT_KEY_FILE, key_pem)
    write_private_key(state_dir / NEXT_CERT_FILE, cert_pem)
    assert recover_interrupted_renewal(state_dir)
    assert (state_dir / KEY_FILE).read_bytes() == key_pem and (state_dir / CERT_FILE).read_bytes() == cert_pem


def test_a_renewal_interrupted_between_the_two_renames_is_finished_at_startup(state_dir, ca):
    key_pem, cert_pem = staged_pair(state_dir, ca)
    write_private_key(state_dir / KEY_FILE, key_pem)  # the key was moved in, the certificate not yet
    write_private_key(state_dir / NEXT_CERT_FILE, cert_pem)
    assert recover_interrupted_renewal(state_dir)
    client_tls_context(state_dir / "ca.crt", state_dir / CERT_FILE, state_dir / KEY_FILE)


def test_a_half_staged_renewal_is_dropped_and_the_old_pair_stands(state_dir, ca):
    before = {name: (state_dir / name).read_bytes() for name in (KEY_FILE, CERT_FILE)}
    write_private_key(state_dir / NEXT_KEY_FILE, staged_pair(state_dir, ca)[0])
    assert not recover_interrupted_renewal(state_dir)
    assert not (state_dir / NEXT_KEY_FILE).exists()
    assert {name: (state_dir / name).read_bytes() for name in (KEY_FILE, CERT_FILE)} == before


def test_install_writes_both_files_and_leaves_nothing_staged(state_dir, ca):
    key_pem, cert_pem = staged_pair(state_dir, ca)
    install_credentials(state_dir, key_pem, cert_pem)
    assert (state_dir / CERT_FILE).read_bytes() == cert_pem
    assert sorted(p.name for p in state_dir.iterdir()) == sorted([KEY_FILE, CERT_FILE, "ca.crt"])


def test_an_expired_certificate_is_reported_with_what_to_do(state_dir, ca):
    renewer = CertificateRenewer(state_dir, AGENT, ca.cert)
    assert describe_expiry(renewer) is None
    expiry = describe_expiry(renewer, renewer.not_after + 1)
    assert expiry is not None and "enroll this host again" in expiry
