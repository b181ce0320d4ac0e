"""Nebula's certificate format as common/nebula.py writes it, checked against Debian's ``nebula-cert`` (when
installed) as well as by reading it back."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from common.nebula import (
    NebulaCertError,
    NebulaCertificate,
    ca_key_pem,
    cert_pem,
    decode_cert_pem,
    new_host_key,
    public_key_of_pem,
    sign,
    verify,
)

NOW = 1_800_000_000


def _ca() -> tuple[ed25519.Ed25519PrivateKey, NebulaCertificate]:
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ca = NebulaCertificate(name="grid", public_key=public, not_before=NOW - 60, not_after=NOW + 86400, is_ca=True)
    return key, sign(ca, key, None)


def _host(key: ed25519.Ed25519PrivateKey, ca: NebulaCertificate, **changes: object) -> NebulaCertificate:
    _, public = new_host_key()
    fields: dict = dict(name="wl-1-r0", public_key=public_key_of_pem(public), not_before=NOW, not_after=NOW + 3600)
    fields |= dict(ips=("100.64.0.130/10",), groups=("wl-1",)) | changes
    return sign(NebulaCertificate(**fields), key, ca)


def test_a_signed_certificate_reads_back_and_verifies_against_its_ca() -> None:
    key, ca = _ca()
    cert = _host(key, ca)
    again = decode_cert_pem(cert_pem(cert))
    assert again == cert
    assert again.ips == ("100.64.0.130/10",) and again.groups == ("wl-1",)
    assert verify(again, ca)


def test_another_cas_certificate_or_a_changed_one_does_not_verify() -> None:
    key, ca = _ca()
    other_key, other_ca = _ca()
    assert not verify(_host(other_key, other_ca), ca)
    cert = _host(key, ca)
    forged = NebulaCertificate(**{**cert.__dict__, "groups": ("wl-2",)})
    assert not verify(forged, ca)


def test_a_certificate_cannot_outlive_its_ca() -> None:
    key, ca = _ca()
    with pytest.raises(NebulaCertError):
        _host(key, ca, not_after=ca.not_after + 1)


def test_garbage_is_refused_with_a_clear_error() -> None:
    with pytest.raises(NebulaCertError):
        decode_cert_pem("not a certificate")
    with pytest.raises(NebulaCertError):
        public_key_of_pem("-----BEGIN NEBULA X25519 PUBLIC KEY-----\nAAAA\n-----END NEBULA X25519 PUBLIC KEY-----\n")


@pytest.mark.skipif(shutil.which("nebula-cert") is None, reason="Debian's nebula is not installed (scripts/setup-env)")
def test_nebula_cert_verifies_what_we_sign_and_signs_with_our_ca_key(tmp_path: Path) -> None:
    key, ca = _ca()
    now = int(time.time())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ca = sign(
        NebulaCertificate(name="grid", public_key=public, not_before=now - 60, not_after=now + 86400, is_ca=True), key, None
    )
    cert = _host(key, ca, not_before=now - 60, not_after=now + 3600)
    (tmp_path / "ca.crt").write_text(cert_pem(ca))
    (tmp_path / "host.crt").write_text(cert_pem(cert))
    subprocess.run(["nebula-cert", "verify", "-ca", "ca.crt", "-crt", "host.crt"], cwd=tmp_path, check=True)
    printed = subprocess.run(
        ["nebula-cert", "print", "-json", "-path", "host.crt"], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout
    assert "100.64.0.130/10" in printed and "wl-1" in printed
    # And the other way: nebula-cert signs with the CA key as we write it, for a public key we made.
    (tmp_path / "ca.key").write_text(ca_key_pem(key))
    (tmp_path / "h.pub").write_text(new_host_key()[1])
    subprocess.run(
        [
            "nebula-cert",
            "sign",
            "-ca-crt",
            "ca.crt",
            "-ca-key",
            "ca.key",
            "-name",
            "x",
            "-ip",
            "100.64.0.131/10",
            "-in-pub",
            "h.pub",
            "-out-crt",
            "x.crt",
            "-duration",
            "1h",
        ],
        cwd=tmp_path,
        check=True,
    )
    assert verify(decode_cert_pem((tmp_path / "x.crt").read_text()), ca)
