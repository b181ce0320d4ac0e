"""The Master's command-signing keys: one current key signs new commands, earlier keys keep verifying
until an operator retires them.

Rotation is two steps on purpose. ``rotate`` makes a new key current while the old one stays trusted,
so commands already signed and on their way still run; ``retire`` then withdraws the old key, and
agents refuse whatever it signs from then on. Every key is endorsed by the platform CA, because
agents learn keys through relays and trust only what the CA vouches for.

On disk, under the Master's pki directory: each private key in its own 0600 PEM file, and
``signing-keys.json`` saying which key is current and which are retired. The first key is the
``signing.key`` every installation starts with, so an existing Master adopts the ring unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric import ed25519

from common.errors import Conflict, NotFound, PKIError
from common.files import write_atomically
from common.pki import CertificateAuthority, CommandSigner, key_to_pem, write_private_key

RING_FILE = "signing-keys.json"
FIRST_KEY_FILE = "signing.key"
KEY_DIR = "signing-keys"


class KeyState(str, Enum):
    CURRENT = "current"  # signs new commands
    VERIFYING = "verifying"  # rotated out: signs nothing new, still trusted for commands it signed
    RETIRED = "retired"  # trusted by no one


class _KeyEntry(msgspec.Struct, kw_only=True):
    key_id: str
    file: str  # relative to the pki directory
    created_at: float
    retired_at: float | None = None


class _RingFile(msgspec.Struct, kw_only=True):
    current: str
    keys: list[_KeyEntry]


@dataclass(frozen=True)
class SigningKeyInfo:
    """What an operator sees of one key; never the private half."""

    key_id: str
    public_key: str  # raw Ed25519, base64
    state: KeyState
    created_at: float
    retired_at: float | None


class SigningKeyRing:
    """Every command-signing key the Master ever had, loaded from and saved to ``pki_dir``."""

    def __init__(self, pki_dir: Path, ca: CertificateAuthority, ring: _RingFile, signers: dict[str, CommandSigner]) -> None:
        self.pki_dir = pki_dir
        self._ca = ca
        self._ring = ring
        self._signers = signers
        self._endorsements: dict[str, str] = {}  # ECDSA signatures are randomised: make each once

    @classmethod
    def open(cls, pki_dir: Path, ca: CertificateAuthority) -> SigningKeyRing:
        """Load the ring, creating it (around an existing ``signing.key`` if there is one) on first use."""
        pki_dir = Path(pki_dir)
        path = pki_dir / RING_FILE
        if not path.exists():
            first = CommandSigner.load_or_create(pki_dir / FIRST_KEY_FILE)
            entry = _KeyEntry(key_id=first.key_id, file=FIRST_KEY_FILE, created_at=time.time())
            # Another process opening the same directory at the same moment writes the same content.
            _write_ring(path, _RingFile(current=first.key_id, keys=[entry]))
        try:
            ring = msgspec.json.decode(path.read_bytes(), type=_RingFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise PKIError(f"{path} is not a readable signing-key ring: {exc}") from None
        signers = {entry.key_id: _load_signer(pki_dir, entry) for entry in ring.keys}
        if ring.current not in signers:
            raise PKIError(f"{path} names {ring.current!r} as the current key but holds no such key")
        return cls(pki_dir, ca, ring, signers)

    # --- reading -------------------------------------------------------------------------------

    @property
    def current(self) -> CommandSigner:
        return self._signers[self._ring.current]

    def signer(self, key_id: str) -> CommandSigner:
        """The signer for ``key_id``, retired or not (tests and audits use old ones)."""
        try:
            return self._signers[key_id]
        except KeyError:
            raise NotFound(f"no command-signing key {key_id!r}") from None

    def is_retired(self, key_id: str) -> bool:
        entry = self._entry(key_id)
        return entry is not None and entry.retired_at is not None

    def command_keys(self) -> dict[str, str]:
        """Every key agents should trust now: the current one and those rotated out but not retired."""
        return {e.key_id: self._signers[e.key_id].public_key_b64() for e in self._ring.keys if e.retired_at is None}

    def key_endorsements(self) -> dict[str, str]:
        return {key_id: self._endorse(key_id, public) for key_id, public in self.command_keys().items()}

    def retired_keys(self) -> list[str]:
        return sorted(e.key_id for e in self._ring.keys if e.retired_at is not None)

    def describe(self) -> list[SigningKeyInfo]:
        """Every key, newest first."""
        return [self._info(e) for e in sorted(self._ring.keys, key=lambda e: e.created_at, reverse=True)]

    def info(self, key_id: str) -> SigningKeyInfo:
        entry = self._entry(key_id)
        if entry is None:
            raise NotFound(f"no command-signing key {key_id!r}")
        return self._info(entry)

    # --- changing ------------------------------------------------------------------------------

    def rotate(self) -> SigningKeyInfo:
        """Make a new key current; the previous one keeps verifying until it is retired."""
        key = ed25519.Ed25519PrivateKey.generate()
        signer = CommandSigner(key)
        relative = f"{KEY_DIR}/{signer.key_id}.key"
        (self.pki_dir / KEY_DIR).mkdir(mode=0o700, exist_ok=True)
        write_private_key(self.pki_dir / relative, key_to_pem(key))
        # The key file exists before the ring names it: a crash in between leaves an unused file, not a gap.
        entry = _KeyEntry(key_id=signer.key_id, file=relative, created_at=time.time())
        self._save(_RingFile(current=signer.key_id, keys=[*self._ring.keys, entry]))
        self._signers[signer.key_id] = signer
        return self._info(entry)

    def retire(self, key_id: str) -> SigningKeyInfo:
        """Stop trusting ``key_id``. Retiring a retired key changes nothing; the current key cannot be retired."""
        entry = self._entry(key_id)
        if entry is None:
            raise NotFound(f"no command-signing key {key_id!r}")
        if key_id == self._ring.current:
            raise Conflict(f"key {key_id} is the current signing key: rotate to a new key first, then retire this one")
        if entry.retired_at is None:
            keys = [msgspec.structs.replace(e, retired_at=time.time()) if e.key_id == key_id else e for e in self._ring.keys]
            self._save(_RingFile(current=self._ring.current, keys=keys))
        return self.info(key_id)

    # --- internals -----------------------------------------------------------------------------

    def _save(self, ring: _RingFile) -> None:
        _write_ring(self.pki_dir / RING_FILE, ring)
        self._ring = ring  # only once it is on disk, so memory never runs ahead of what a restart loads

    def _entry(self, key_id: str) -> _KeyEntry | None:
        return next((e for e in self._ring.keys if e.key_id == key_id), None)

    def _endorse(self, key_id: str, public: str) -> str:
        if key_id not in self._endorsements:
            self._endorsements[key_id] = self._ca.endorse_command_key(public)
        return self._endorsements[key_id]

    def _info(self, entry: _KeyEntry) -> SigningKeyInfo:
        if entry.retired_at is not None:
            state = KeyState.RETIRED
        else:
            state = KeyState.CURRENT if entry.key_id == self._ring.current else KeyState.VERIFYING
        return SigningKeyInfo(
            key_id=entry.key_id,
            public_key=self._signers[entry.key_id].public_key_b64(),
            state=state,
            created_at=entry.created_at,
            retired_at=entry.retired_at,
        )


def _load_signer(pki_dir: Path, entry: _KeyEntry) -> CommandSigner:
    path = pki_dir / entry.file
    if not path.is_file():
        # Never create a stand-in: a different key under this id would sign what agents refuse.
        raise PKIError(f"command-signing key {entry.key_id} is missing: {path} does not exist; restore it from a backup")
    signer = CommandSigner.load_or_create(path)
    if signer.key_id != entry.key_id:
        raise PKIError(f"{path} holds key {signer.key_id}, but {RING_FILE} expects {entry.key_id} there")
    return signer


def _write_ring(path: Path, ring: _RingFile) -> None:
    """Replace the ring file atomically: a crash leaves the old ring or the new one, never half of one."""
    write_atomically(path, msgspec.json.format(msgspec.json.encode(ring)), mode=0o600)
