"""The command-signing keys this agent trusts: the ones the platform CA endorsed, kept in its identity file.

The Master names its keys in every welcome and in ``config`` frames (agent/session.py ``Welcomed``, ``NewKeys``).
They arrive through relays, so a key is trusted only with the platform CA's endorsement; a retired key is never
trusted again, even if a later frame names it. The identity file is written only when the set changed: the usual
welcome names the same keys, and thousands of reconnecting agents would each fsync for nothing.
"""

from __future__ import annotations

import logging

from cryptography import x509

from agent.identity import AgentIdentity
from common.errors import SignatureError
from common.pki import CommandVerifier, verify_key_endorsement

log = logging.getLogger(__name__)


class CommandKeys:
    def __init__(self, identity: AgentIdentity, ca_cert: x509.Certificate) -> None:
        """The verifier starts with the keys the identity kept, less the retired ones."""
        self.identity = identity
        self.ca_cert = ca_cert
        self.verifier = CommandVerifier(identity.command_keys)
        for key_id in identity.retired_keys:
            self.verifier.retire_key(key_id)

    def update(self, keys: dict[str, str], endorsements: dict[str, str], retired: list[str]) -> None:
        """Trust the endorsed keys of ``keys`` not retired, retire ``retired``, and keep the result if it changed."""
        trusted = self.verifier.keys()
        for key_id, public in keys.items():
            if key_id in retired or trusted.get(key_id) == public:
                continue
            try:
                verify_key_endorsement(self.ca_cert, public, endorsements.get(key_id, ""))
                self.verifier.add_key(key_id, public)
            except SignatureError as exc:
                log.warning("ignored command-signing key %s: %s", key_id, exc)
        for key_id in retired:
            self.verifier.retire_key(key_id)
        keys_now = self.verifier.keys()
        retired_now = sorted(set(self.identity.retired_keys) | set(retired))
        if (keys_now, retired_now) == (self.identity.command_keys, self.identity.retired_keys):
            return  # the usual welcome: nothing new, so no write (and no fsync) on every reconnect
        self.identity.command_keys = keys_now
        self.identity.retired_keys = retired_now
        self.identity.save()
