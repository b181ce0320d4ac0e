"""Nebula's certificate and key formats, written with ``cryptography`` (no ``nebula-cert`` needed on the Master).

A Nebula certificate is a protobuf message ``RawNebulaCertificate{Details = 1, Signature = 2}`` whose details are
``Name = 1, Ips = 2 (packed uint32: address, mask, ...), Subnets = 3, Groups = 4, NotBefore = 5, NotAfter = 6 (Unix
seconds), PublicKey = 7, IsCA = 8, Issuer = 9`` (the SHA-256 of the signing CA's encoded certificate). The CA signs
the encoded details with Ed25519; a host's own key is X25519. Nebula checks a signature by encoding the details again
with Go's protobuf encoder, so ``encode_details`` must write exactly what it writes: fields in number order, zero
values left out, repeated integers packed. ``nebula-cert verify`` and ``nebula-cert print`` read what this writes
(tests/common/test_nebula.py).

Pure: no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

__all__ = [
    "CERT_PEM",
    "NebulaCertificate",
    "NebulaCertError",
    "ca_key_pem",
    "decode_cert_pem",
    "fingerprint",
    "new_host_key",
    "public_key_of_pem",
    "sign",
]

CERT_PEM = "NEBULA CERTIFICATE"
ED25519_PRIVATE_PEM = "NEBULA ED25519 PRIVATE KEY"
X25519_PRIVATE_PEM = "NEBULA X25519 PRIVATE KEY"
X25519_PUBLIC_PEM = "NEBULA X25519 PUBLIC KEY"


class NebulaCertError(ValueError):
    """A Nebula certificate or key that does not decode or does not hold."""


@dataclass(frozen=True, kw_only=True)
class NebulaCertificate:
    """The details a CA signs. ``ips`` and ``subnets`` are CIDRs ("100.64.0.2/25"), times Unix seconds."""

    name: str
    public_key: bytes  # 32 bytes: X25519 for a host, Ed25519 for a CA
    not_before: int
    not_after: int
    ips: tuple[str, ...] = ()
    subnets: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    is_ca: bool = False
    issuer: bytes = b""  # the CA's fingerprint (32 bytes); empty for a self-signed CA
    signature: bytes = b""


# --- protobuf, the small part Nebula uses ----------------------------------------------------------------------


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 as Go writes it: two's complement on ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _bytes_field(field: int, value: bytes) -> bytes:
    return _key(field, 2) + _varint(len(value)) + value if value else b""


def _int_field(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value) if value else b""


def _cidr_words(cidrs: tuple[str, ...]) -> list[int]:
    words: list[int] = []
    for cidr in cidrs:
        iface = ipaddress.IPv4Interface(cidr)
        words += [int(iface.ip), int(iface.network.netmask)]
    return words


def encode_details(cert: NebulaCertificate) -> bytes:
    """The details as Go's protobuf encoder writes them: what the CA signs."""
    out = _bytes_field(1, cert.name.encode())
    out += _bytes_field(2, b"".join(_varint(w) for w in _cidr_words(cert.ips)))
    out += _bytes_field(3, b"".join(_varint(w) for w in _cidr_words(cert.subnets)))
    for group in cert.groups:
        out += _key(4, 2) + _varint(len(group.encode())) + group.encode()
    out += _int_field(5, cert.not_before)
    out += _int_field(6, cert.not_after)
    out += _bytes_field(7, cert.public_key)
    out += _int_field(8, int(cert.is_ca))
    out += _bytes_field(9, cert.issuer)
    return out


def encode_cert(cert: NebulaCertificate) -> bytes:
    return _bytes_field(1, encode_details(cert)) + _bytes_field(2, cert.signature)


def fingerprint(cert: NebulaCertificate) -> bytes:
    """SHA-256 of the encoded certificate: what a signed certificate names as its issuer (and Nebula's blocklist)."""
    return hashlib.sha256(encode_cert(cert)).digest()


def _pem(kind: str, body: bytes) -> str:
    b64 = base64.b64encode(body).decode()
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return "\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----", ""])


def _unpem(kind: str, text: str) -> bytes:
    begin, end = f"-----BEGIN {kind}-----", f"-----END {kind}-----"
    start = text.find(begin)
    stop = text.find(end, start + 1)
    if start < 0 or stop < 0:
        raise NebulaCertError(f"no {kind} PEM block")
    try:
        return base64.b64decode("".join(text[start + len(begin) : stop].split()), validate=True)
    except ValueError as exc:
        raise NebulaCertError(f"the {kind} PEM block is not base64: {exc}") from exc


def cert_pem(cert: NebulaCertificate) -> str:
    return _pem(CERT_PEM, encode_cert(cert))


def sign(cert: NebulaCertificate, ca_key: ed25519.Ed25519PrivateKey, ca: NebulaCertificate | None) -> NebulaCertificate:
    """``cert`` signed by ``ca_key``: self-signed when ``ca`` is None (a CA), else issued by ``ca``.

    Nebula refuses a certificate that outlives its CA, so that is refused here too."""
    issuer = b""
    if ca is not None:
        if cert.not_after > ca.not_after or cert.not_before < ca.not_before:
            raise NebulaCertError("a certificate cannot be valid outside its CA's validity")
        issuer = fingerprint(ca)
    unsigned = NebulaCertificate(**{**cert.__dict__, "issuer": issuer, "signature": b""})
    signature = ca_key.sign(encode_details(unsigned))
    return NebulaCertificate(**{**unsigned.__dict__, "signature": signature})


def ca_key_pem(key: ed25519.Ed25519PrivateKey) -> str:
    """The CA's key as ``nebula-cert`` writes it (seed and public key, 64 bytes)."""
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _pem(ED25519_PRIVATE_PEM, seed + public)


def new_host_key() -> tuple[str, str]:
    """A fresh X25519 key pair for a Nebula host, as (private PEM, public PEM) in Nebula's own PEM kinds."""
    key = x25519.X25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _pem(X25519_PRIVATE_PEM, private), _pem(X25519_PUBLIC_PEM, public)


def public_key_of_pem(text: str) -> bytes:
    """The 32 raw bytes of a ``NEBULA X25519 PUBLIC KEY`` PEM; NebulaCertError if it is not one."""
    raw = _unpem(X25519_PUBLIC_PEM, text)
    if len(raw) != 32:
        raise NebulaCertError(f"a Nebula X25519 public key has 32 bytes, not {len(raw)}")
    return raw


# --- decoding (to read a certificate back: tests, the agent's checks) --------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise NebulaCertError("a truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(buf, pos)
            out.append((field, value))
        elif wire_type == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise NebulaCertError("a truncated field")
            out.append((field, buf[pos : pos + size]))
            pos += size
        else:
            raise NebulaCertError(f"wire type {wire_type} is not used by Nebula certificates")
    return out


def _cidrs(packed: bytes) -> tuple[str, ...]:
    words, pos = [], 0
    while pos < len(packed):
        word, pos = _read_varint(packed, pos)
        words.append(word)
    if len(words) % 2:
        raise NebulaCertError("an address without its mask")
    return tuple(
        str(ipaddress.IPv4Interface((ipaddress.IPv4Address(a), str(ipaddress.IPv4Address(m)))))
        for a, m in zip(words[::2], words[1::2], strict=True)
    )


def decode_cert_pem(text: str) -> NebulaCertificate:
    """A certificate read back from its PEM; NebulaCertError if it does not decode."""
    details, signature = b"", b""
    for field, value in _fields(_unpem(CERT_PEM, text)):
        if field == 1 and isinstance(value, bytes):
            details = value
        elif field == 2 and isinstance(value, bytes):
            signature = value
    parts: dict[str, object] = {"groups": (), "ips": (), "subnets": (), "name": "", "public_key": b""}
    parts |= {"not_before": 0, "not_after": 0, "is_ca": False, "issuer": b"", "signature": signature}
    groups: list[str] = []
    for field, value in _fields(details):
        match field, value:
            case 1, bytes():
                parts["name"] = value.decode()
            case 2, bytes():
                parts["ips"] = _cidrs(value)
            case 3, bytes():
                parts["subnets"] = _cidrs(value)
            case 4, bytes():
                groups.append(value.decode())
            case 5, int():
                parts["not_before"] = value
            case 6, int():
                parts["not_after"] = value
            case 7, bytes():
                parts["public_key"] = value
            case 8, int():
                parts["is_ca"] = bool(value)
            case 9, bytes():
                parts["issuer"] = value
    parts["groups"] = tuple(groups)
    return NebulaCertificate(**parts)  # type: ignore[arg-type]


def verify(cert: NebulaCertificate, ca: NebulaCertificate) -> bool:
    """Whether ``ca`` signed ``cert`` (the signature over its details, and the issuer it names)."""
    if cert.issuer != fingerprint(ca):
        return False
    unsigned = NebulaCertificate(**{**cert.__dict__, "signature": b""})
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(ca.public_key).verify(cert.signature, encode_details(unsigned))
    except Exception:  # noqa: BLE001 - cryptography's InvalidSignature, or a malformed key: not signed by it
        return False
    return True
