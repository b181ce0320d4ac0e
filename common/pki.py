"""The platform PKI: one ECDSA P-256 CA, role certificates, TLS contexts and Ed25519 command signatures.

A certificate names its holder in a SAN URI ``idlegrid://<role>/<id>``; that URI, not the subject,
is what every daemon trusts, so a CSR can never choose whom it becomes.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import ipaddress
import os
import re
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.errors import PKIError, SignatureError
from common.files import write_atomically, write_temp

URI_SCHEME = "idlegrid"
ORGANIZATION = "idlegrid"
CA_FILE, CA_KEY_FILE = "ca.crt", "ca.key"
# Certificates start a minute in the past so a peer whose clock runs slightly behind accepts them.
CLOCK_SKEW_S = 60.0
# Identities travel in a URI path and a CN (64 characters at most), so they stay plain.
_IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_KEY_ID_HEX = 16


class CertRole(str, Enum):
    MASTER = "master"
    ACCESS = "access"
    AGENT = "agent"
    OPERATOR = "operator"


# Master and Access serve TLS; every role is a client of someone (Access dials the Master).
_SERVER_ROLES = frozenset({CertRole.MASTER, CertRole.ACCESS})


@dataclass(frozen=True)
class Identity:
    """Who a certificate names."""

    role: CertRole
    id: str  # also the subject CN
    serial: str  # certificate serial, lowercase hex without 0x
    not_after: float  # unix time

    @property
    def uri(self) -> str:
        return identity_uri(self.role, self.id)


def identity_uri(role: CertRole, identity: str) -> str:
    return f"{URI_SCHEME}://{role.value}/{identity}"


# ---------------------------------------------------------------- keys and files


def generate_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def write_private_key(path: Path, key_pem: bytes) -> None:
    """Write a private key readable by its owner only, replacing any file at ``path`` atomically."""
    write_atomically(Path(path), key_pem, mode=0o600)


def make_csr(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    """A PEM CSR. The CA ignores the subject asked for; the CN only helps a person reading it."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def load_cert(pem_or_der: bytes) -> x509.Certificate:
    try:
        if pem_or_der.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(pem_or_der)
        return x509.load_der_x509_certificate(pem_or_der)
    except ValueError as exc:
        raise PKIError(f"not a readable X.509 certificate (PEM or DER): {exc}") from None


def certificate_fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


# ---------------------------------------------------------------- reading certificates


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity a certificate names, read from its ``idlegrid://<role>/<id>`` SAN URI."""
    uris = _idlegrid_uris(cert)
    if len(uris) != 1:
        found = "no" if not uris else f"{len(uris)}"
        raise PKIError(f"certificate {_serial(cert)} carries {found} {URI_SCHEME}:// identity URIs; exactly one is required")
    role_text, _, ident = uris[0].removeprefix(f"{URI_SCHEME}://").partition("/")
    try:
        role = CertRole(role_text)
    except ValueError:
        raise PKIError(f"certificate {_serial(cert)} names unknown role {role_text!r} in {uris[0]!r}") from None
    if not _IDENTITY.fullmatch(ident):
        raise PKIError(f"certificate {_serial(cert)} names a malformed identity {ident!r} in {uris[0]!r}")
    return Identity(role=role, id=ident, serial=_serial(cert), not_after=cert.not_valid_after_utc.timestamp())


def _idlegrid_uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(f"{URI_SCHEME}://")]


def _serial(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def verify_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate, *, now: float | None = None) -> None:
    """Raise PKIError unless ``ca_cert`` signed ``cert`` and ``cert`` is valid at ``now`` (default: the current time)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        raise PKIError(
            f"certificate {_serial(cert)} ({cert.subject.rfc4514_string()}) is not issued by this CA "
            f"({ca_cert.subject.rfc4514_string()})"
        ) from None
    at = time.time() if now is None else now
    if at < cert.not_valid_before_utc.timestamp():
        raise PKIError(
            f"certificate {_serial(cert)} is not yet valid: valid from {cert.not_valid_before_utc.isoformat()}; "
            "check this host's clock"
        )
    if at > cert.not_valid_after_utc.timestamp():
        raise PKIError(f"certificate {_serial(cert)} expired at {cert.not_valid_after_utc.isoformat()}; renew it")


def peer_identity(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Identity:
    """The identity in the certificate the TLS peer presented (the handshake already checked it against the CA)."""
    if ssl_object is None:
        raise PKIError("connection is not TLS, so the peer has no certificate identity")
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise PKIError("peer presented no certificate; a client certificate issued by the platform CA is required")
    return identity_of(load_cert(der))


# ---------------------------------------------------------------- the CA


def _utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def _check_identity(identity: str) -> None:
    if not _IDENTITY.fullmatch(identity):
        raise PKIError(
            f"identity {identity!r} is not allowed: use 1-64 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )


def _alt_names(role: CertRole, identity: str, dns_names: Sequence[str], ip_addresses: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, identity))]
    names += [x509.DNSName(n) for n in dns_names]
    try:
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    except ValueError as exc:
        raise PKIError(f"cannot put an IP address in a certificate: {exc}") from None
    return names


def _leaf_extensions(role: CertRole) -> list[tuple[x509.ExtensionType, bool]]:
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in _SERVER_ROLES:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    key_usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    return [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (key_usage, True),
        (x509.ExtendedKeyUsage(usages), False),
    ]


class CertificateAuthority:
    """The platform CA: issues every daemon's and agent's certificate."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, name: str = "idlegrid platform CA", valid_days: int = 3650) -> CertificateAuthority:
        key = generate_key()
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                x509.NameAttribute(NameOID.COMMON_NAME, name),
            ]
        )
        now = time.time()
        key_usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(now - CLOCK_SKEW_S))
            .not_valid_after(_utc(now + valid_days * 86400.0))
            # path_length=0: the CA issues leaves only, never another CA.
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(key_usage, critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        directory = Path(directory)
        missing = [n for n in (CA_FILE, CA_KEY_FILE) if not (directory / n).is_file()]
        if missing:
            raise PKIError(
                f"platform CA not found in {directory}: {', '.join(missing)} missing; create it with `idlegrid ca init`"
            )
        cert = load_cert((directory / CA_FILE).read_bytes())
        try:
            key = serialization.load_pem_private_key((directory / CA_KEY_FILE).read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise PKIError(f"{directory / CA_KEY_FILE} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise PKIError(f"{directory / CA_KEY_FILE} is not the private key of {directory / CA_FILE}")
        return cls(cert, key)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private_key(directory / CA_KEY_FILE, key_to_pem(self.key))
        write_atomically(directory / CA_FILE, self.chain_pem(), mode=0o644)

    def chain_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def endorse_command_key(self, public_key_b64: str) -> str:
        """The CA's signature over a command-signing key, so agents can learn new keys through relays."""
        signature = self.key.sign(_endorsement_bytes(public_key_b64), ec.ECDSA(hashes.SHA256()))
        return base64.b64encode(signature).decode("ascii")

    def issue(
        self,
        role: CertRole,
        identity: str,
        public_key: CertificatePublicKeyTypes,
        *,
        valid_s: float,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        now: float | None = None,
    ) -> x509.Certificate:
        """Issue a certificate naming ``role``/``identity`` for ``public_key``, valid ``valid_s`` seconds from ``now``.

        ``now`` defaults to the current time; tests pass another to make certificates that are
        already expired or not yet valid.
        """
        role = CertRole(role)
        _check_identity(identity)
        _check_public_key(public_key)
        if valid_s <= 0:
            raise PKIError(f"certificate validity must be positive, got {valid_s} s")
        at = time.time() if now is None else now
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role.value),
                x509.NameAttribute(NameOID.COMMON_NAME, identity),
            ]
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(at - CLOCK_SKEW_S))
            .not_valid_after(_utc(at + valid_s))
            .add_extension(x509.SubjectAlternativeName(_alt_names(role, identity, dns_names, ip_addresses)), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        for extension, critical in _leaf_extensions(role):
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(self.key, hashes.SHA256())

    def sign_csr(self, csr_pem: bytes, role: CertRole, identity: str, *, valid_s: float) -> x509.Certificate:
        """Certify the CSR's key as ``role``/``identity``; whatever subject the CSR asks for is ignored."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise PKIError(f"not a PEM certificate signing request: {exc}") from None
        # Proof that the requester holds the private key; without it anyone could certify a stolen public key.
        if not csr.is_signature_valid:
            raise PKIError("CSR signature does not verify: the request was altered or not signed by its own key")
        return self.issue(role, identity, csr.public_key(), valid_s=valid_s)

    def issue_keypair(
        self,
        role: CertRole,
        identity: str,
        *,
        valid_s: float,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> tuple[bytes, bytes]:
        """A fresh key and its certificate, ``(key_pem, cert_pem)``, for a server the operator sets up."""
        key = generate_key()
        cert = self.issue(role, identity, key.public_key(), valid_s=valid_s, dns_names=dns_names, ip_addresses=ip_addresses)
        return key_to_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def _check_public_key(public_key: object) -> None:
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(public_key.curve, ec.SECP256R1):
        kind = getattr(getattr(public_key, "curve", None), "name", None) or type(public_key).__name__
        raise PKIError(
            f"only ECDSA P-256 (secp256r1) keys are certified, got {kind}; generate the key with common.pki.generate_key()"
        )


# ---------------------------------------------------------------- TLS


def server_tls_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    ca_file: str | os.PathLike[str],
    *,
    require_client_cert: bool,
) -> ssl.SSLContext:
    """TLS 1.2+ server context; with ``require_client_cert`` only peers holding a platform certificate get in."""
    context = _default_context(ssl.Purpose.CLIENT_AUTH, ca_file)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    _load_chain(context, cert_file, key_file)
    return context


def client_tls_context(
    ca_file: str | os.PathLike[str],
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """TLS 1.2+ client context trusting only the platform CA, checking the server's host name."""
    if (cert_file is None) != (key_file is None):
        raise PKIError("a client certificate needs both cert_file and key_file")
    context = _default_context(ssl.Purpose.SERVER_AUTH, ca_file)
    if cert_file is not None and key_file is not None:
        _load_chain(context, cert_file, key_file)
    return context


def _default_context(purpose: ssl.Purpose, ca_file: str | os.PathLike[str]) -> ssl.SSLContext:
    try:
        # Given a cafile, the default context trusts that CA only, not the system store.
        context = ssl.create_default_context(purpose, cafile=os.fspath(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise PKIError(f"cannot load the CA certificate {ca_file}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_chain(context: ssl.SSLContext, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> None:
    try:
        context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise PKIError(f"cannot load certificate {cert_file} with key {key_file}: {exc}") from None


# ---------------------------------------------------------------- command signatures


def _key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:_KEY_ID_HEX]


def _raw_public(key: ed25519.Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class CommandSigner:
    """The Master's Ed25519 key for signing commands, so a relay can pass them on but never forge one."""

    def __init__(self, key: ed25519.Ed25519PrivateKey) -> None:
        self._key = key
        self.key_id = _key_id(_raw_public(key.public_key()))

    @classmethod
    def generate(cls) -> CommandSigner:
        return cls(ed25519.Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> CommandSigner:
        """The signing key at ``path`` (PEM, 0600), created on first use."""
        path = Path(path)
        if not path.exists():
            signer = cls.generate()
            if _publish_new(path, key_to_pem(signer._key)):
                return signer
            # Another process created it meanwhile: theirs is the key agents will learn, so use it.
        return cls(_load_ed25519(path))

    def sign(self, body: bytes) -> str:
        return base64.b64encode(self._key.sign(body)).decode("ascii")

    def public_key_b64(self) -> str:
        return base64.b64encode(_raw_public(self._key.public_key())).decode("ascii")


def _publish_new(path: Path, key_pem: bytes) -> bool:
    """Create ``path`` holding ``key_pem`` unless it exists already; True if this call created it."""
    tmp = write_temp(path, key_pem, 0o600)
    try:
        os.link(tmp, path)  # unlike rename, link refuses to replace an existing key
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _load_ed25519(path: Path) -> ed25519.Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise PKIError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise PKIError(f"{path} holds a {type(key).__name__}, not the Ed25519 command-signing key")
    return key


def _endorsement_bytes(public_key_b64: str) -> bytes:
    return b"idlegrid command-signing key\0" + public_key_b64.encode("ascii")


def verify_key_endorsement(ca_cert: x509.Certificate, public_key_b64: str, endorsement_b64: str) -> None:
    """Raise ``SignatureError`` unless the platform CA endorsed this command-signing key."""
    try:
        signature = base64.b64decode(endorsement_b64, validate=True)
        ca_key = ca_cert.public_key()
        if not isinstance(ca_key, ec.EllipticCurvePublicKey):
            raise SignatureError("the platform CA's key is not ECDSA; it cannot have endorsed a command-signing key")
        ca_key.verify(signature, _endorsement_bytes(public_key_b64), ec.ECDSA(hashes.SHA256()))
    except (binascii.Error, ValueError, InvalidSignature):
        raise SignatureError("command-signing key is not endorsed by the platform CA; refusing to trust it") from None


class CommandVerifier:
    """The agent's set of trusted command-signing keys, by key id; retiring a key stops trusting it."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self._keys: dict[str, ed25519.Ed25519PublicKey] = {}
        self._b64: dict[str, str] = {}
        self._retired: set[str] = set()  # only to say "retired" rather than "never seen" when refusing
        for key_id, public_b64 in (keys or {}).items():
            self.add_key(key_id, public_b64)

    def add_key(self, key_id: str, public_key_b64: str) -> None:
        try:
            raw = base64.b64decode(public_key_b64, validate=True)
            key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError) as exc:
            raise SignatureError(f"command-signing key {key_id!r} is not a base64 raw Ed25519 public key: {exc}") from None
        # The id is derived from the key, so a relay cannot announce its own key under a trusted id.
        if _key_id(raw) != key_id:
            raise SignatureError(f"command-signing key id {key_id!r} does not match its key (expected {_key_id(raw)!r})")
        self._keys[key_id] = key
        self._b64[key_id] = public_key_b64
        self._retired.discard(key_id)

    def retire_key(self, key_id: str) -> None:
        self._keys.pop(key_id, None)
        self._b64.pop(key_id, None)
        self._retired.add(key_id)

    def verify(self, key_id: str, body: bytes, signature_b64: str) -> None:
        key = self._keys.get(key_id)
        if key is None:
            why = "it was retired" if key_id in self._retired else f"not among the {len(self._keys)} keys this agent trusts"
            raise SignatureError(f"unknown signing key {key_id!r}: {why}")
        try:
            signature = base64.b64decode(signature_b64, validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError("malformed signature: not standard base64") from None
        if len(signature) != 64:
            raise SignatureError(f"malformed signature: an Ed25519 signature is 64 bytes, got {len(signature)}")
        try:
            key.verify(signature, body)
        except InvalidSignature:
            raise SignatureError(
                f"signature does not verify with key {key_id!r}: the command was altered or signed by another key"
            ) from None

    def keys(self) -> dict[str, str]:
        return dict(self._b64)
