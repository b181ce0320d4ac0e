"""Command-signing keys reach agents through relays, so agents trust only keys the platform CA endorsed."""

import pytest

from common.errors import SignatureError
from common.pki import CertificateAuthority, CommandSigner, verify_key_endorsement


def test_a_key_endorsed_by_the_platform_ca_verifies():
    ca, signer = CertificateAuthority.create(), CommandSigner.generate()
    endorsement = ca.endorse_command_key(signer.public_key_b64())
    verify_key_endorsement(ca.cert, signer.public_key_b64(), endorsement)


def test_a_relay_cannot_swap_in_its_own_key_or_reuse_an_endorsement():
    ca, real, rogue = CertificateAuthority.create(), CommandSigner.generate(), CommandSigner.generate()
    endorsement = ca.endorse_command_key(real.public_key_b64())
    with pytest.raises(SignatureError, match="not endorsed"):
        verify_key_endorsement(ca.cert, rogue.public_key_b64(), endorsement)
    other_ca = CertificateAuthority.create("rogue CA")
    with pytest.raises(SignatureError):
        verify_key_endorsement(ca.cert, rogue.public_key_b64(), other_ca.endorse_command_key(rogue.public_key_b64()))
    with pytest.raises(SignatureError):
        verify_key_endorsement(ca.cert, real.public_key_b64(), "not base64!")
