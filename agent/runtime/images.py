"""Images for the docker runtime, the pure part: which registry a reference names and whether this host pulls from it,
what a pull's progress stream says, whose fault a failed pull is, and which unused images to evict to stay within the
host's disk budget. The Docker-API calls are docker.py's; the last-use record (a small JSON file) is ``ImageUses``.

Invariants:
- Only images the agent itself pulled are ever evicted, least recently used first, and never one a container (any
  container, idlegrid's or not) uses: what the provider loaded by hand is the provider's.
- A failure the renter's request caused (no such image, credentials refused, too large, registry not allowed, too
  slow) raises a ``RenterFault`` subclass (common/errors.py); anything else is the host's ``RuntimeFailure``.
- What one renter proved, another proves too (``ImageAccess``): an image the agent pulled with credentials runs for a
  create only when that create's own credentials (or none, once an anonymous pull reached it) reached the same image
  id; otherwise the engine pulls again with them. Such an image is never listed for others to see (hello, offers).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.state import PRIVATE_FILE_MODE
from common.containers import RegistryAuth, registry_matches, registry_of
from common.egress import EgressRule
from common.errors import ImageNotFound, ImageTooLarge, ImageUnauthorized, RegistryNotAllowed, RuntimeFailure
from common.files import write_atomically

MB = 1_000_000
GB = 1_000_000_000

# What engines say when the image or its tag does not exist (Docker: "manifest unknown", "not found"; Podman: the
# registry's "manifest unknown" / "name unknown"; Docker Hub for a private repository without rights: "denied").
_NOT_FOUND = ("manifest unknown", "name unknown", "not found", "no such image", "does not exist")
_UNAUTHORIZED = ("unauthorized", "authentication required", "access denied", "denied", "incorrect username or password")


@dataclass(frozen=True)
class ImageLimits:
    """A host's image settings (agent/config.py names each). Zero means no limit."""

    pull: bool = True  # pull images the host lacks; off: only images already on the host run
    registries_allowed: tuple[str, ...] = ()  # empty: every registry not denied
    registries_denied: tuple[str, ...] = ()
    max_image_bytes: int = 0
    pull_timeout_s: float = 1800.0
    disk_budget_bytes: int = 0  # the most the images the agent pulled may take together
    egress: EgressRule = EgressRule()  # which registries' addresses a pull may reach (common/egress.py)


def check_registry(reference: str, limits: ImageLimits) -> None:
    """Raise ``RegistryNotAllowed`` unless this host pulls from the registry ``reference`` names (denied wins)."""
    registry = registry_of(reference)
    if any(registry_matches(registry, p) for p in limits.registries_denied):
        raise RegistryNotAllowed(f"this host does not pull from {registry} (image {reference!r}); choose another host")
    if limits.registries_allowed and not any(registry_matches(registry, p) for p in limits.registries_allowed):
        allowed = ", ".join(limits.registries_allowed)
        raise RegistryNotAllowed(
            f"this host pulls only from {allowed}, not from {registry} (image {reference!r}); choose another host"
        )


def pull_query(reference: str) -> dict[str, str]:
    """``fromImage`` and ``tag`` for ``POST /images/create``: the tag (or digest) split off, ``latest`` if none."""
    if "@" in reference:
        name, digest = reference.split("@", 1)
        return {"fromImage": name, "tag": digest}
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > slash:
        return {"fromImage": reference[:colon], "tag": reference[colon + 1 :]}
    return {"fromImage": reference, "tag": "latest"}


def auth_header(auth: RegistryAuth, reference: str) -> str:
    """The ``X-Registry-Auth`` value: base64url of the credentials as JSON, for the registry ``reference`` names."""
    payload = {"username": auth.username, "password": auth.password, "serveraddress": registry_of(reference)}
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


@dataclass
class PullProgress:
    """What a pull's JSON-lines stream has said so far: layers seen and done, bytes downloaded of those announced.
    Engines give byte counts only for layers big enough to report on (Docker: "Downloading" with progressDetail;
    Podman: the same, once a second), so ``total_bytes`` grows as layers announce theirs."""

    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (bytes done, bytes in all; 0: unknown)
    done: set[str] = field(default_factory=set)

    def feed(self, event: Mapping[str, Any]) -> None:
        layer = str(event.get("id") or "")
        status = str(event.get("status") or "")
        if not layer or status.startswith(("Pulling from", "Digest:", "Status:")):
            return  # the image's own lines, not a layer's
        detail = event.get("progressDetail") or {}
        current, total = self.layers.get(layer, (0, 0))
        if isinstance(detail, Mapping) and status.startswith("Downloading"):
            current = int(detail.get("current") or current)
            total = int(detail.get("total") or total)
        if status in ("Download complete", "Pull complete", "Already exists"):
            self.done.add(layer)
            current = max(current, total)
        self.layers[layer] = (current, total)

    @property
    def done_bytes(self) -> int:
        return sum(current for current, _ in self.layers.values())

    @property
    def total_bytes(self) -> int:
        return sum(total for _, total in self.layers.values())

    def text(self) -> str:
        """For the renter: "12.3 MB of 45.6 MB, 1 of 3 layers" (bytes only where the engine gave them)."""
        layers = f"{len(self.done)} of {len(self.layers)} layers"
        if self.total_bytes:
            return f"{self.done_bytes / MB:.1f} MB of {self.total_bytes / MB:.1f} MB, {layers}"
        return layers


def pull_failure(reference: str, message: str, engine: str) -> RuntimeFailure:
    """Whose fault a pull's error is, from the engine's words: the renter's (no such image or tag, credentials
    refused) or the host's (anything else: its disk, its network, its engine)."""
    lowered = message.lower()
    if "no space left" in lowered:
        return RuntimeFailure(f"pulling image {reference!r} through {engine} failed: the host's disk is full ({message})")
    if any(words in lowered for words in _UNAUTHORIZED):
        return ImageUnauthorized(
            f"image {reference!r}: the registry refused access ({message}); give the registry's credentials "
            "(registry_auth) or check them"
        )
    if any(words in lowered for words in _NOT_FOUND):
        return ImageNotFound(f"image not found: {reference!r} is not in its registry ({message}); check its name and tag")
    return RuntimeFailure(f"pulling image {reference!r} through {engine} failed: {message}")


def too_large(reference: str, size: int, limits: ImageLimits) -> ImageTooLarge:
    return ImageTooLarge(
        f"image {reference!r} is {size / MB:.1f} MB; this host takes images up to {limits.max_image_bytes / MB:.1f} MB"
    )


@dataclass(frozen=True)
class StoredImage:
    """An image on the engine, as eviction sees it."""

    id: str
    size: int
    in_use: bool  # a container (any) was made from it
    references: tuple[str, ...] = ()


def evictions(images: Iterable[StoredImage], uses: Mapping[str, float], budget_bytes: int) -> list[StoredImage]:
    """The pulled images (those in ``uses``: id -> last use) to remove, least recently used first, until the pulled
    ones fit ``budget_bytes``; images in use are never chosen, so the budget may stay exceeded while they run."""
    pulled = [image for image in images if image.id in uses]
    excess = sum(image.size for image in pulled) - budget_bytes
    if budget_bytes <= 0 or excess <= 0:
        return []
    chosen = []
    for image in sorted((i for i in pulled if not i.in_use), key=lambda i: uses[i.id]):
        if excess <= 0:
            break
        chosen.append(image)
        excess -= image.size
    return chosen


class ImageUses:
    """The images the agent pulled and when each was last used (image id -> unix time), kept in a 0600 JSON file so a
    restarted agent still knows which images are its own to evict. ``path`` None: in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.uses: dict[str, float] = {}
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text())
            except (OSError, ValueError):
                loaded = {}  # a damaged record: the images stay, the agent only forgets it may evict them
            self.uses = {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}

    def touch(self, image_id: str, now: float, *, pulled: bool = False) -> None:
        """Record a use; only an image the agent pulled (``pulled``, or already recorded) becomes its to evict."""
        if pulled or image_id in self.uses:
            self.uses[image_id] = now
            self._save()

    def forget(self, image_ids: Sequence[str]) -> None:
        for image_id in image_ids:
            self.uses.pop(image_id, None)
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_atomically(self.path, json.dumps(self.uses).encode(), mode=PRIVATE_FILE_MODE)


def warm_first(images: Iterable[tuple[str, float]], limit: int) -> list[str]:
    """Image references, the most recently created or used first, at most ``limit`` (hello's bounded list)."""
    ordered = sorted(images, key=lambda item: -item[1])
    return list(dict.fromkeys(ref for ref, _ in ordered if ref and "<none>" not in ref))[:limit]


# --- who proved access to a private image ------------------------------------------------------------------------

ANONYMOUS = "anonymous"  # the fingerprint of a pull without credentials: once it reached an image, anyone may run it
_KEY_BYTES = 32


def credential_fingerprint(key: bytes, registry: str, auth: RegistryAuth | None) -> str:
    """Who pulled, without the secret: HMAC-SHA256 of the registry, username and password under the host-local ``key``
    (a stolen record cannot be checked against guessed passwords elsewhere); ``ANONYMOUS`` for no credentials."""
    if auth is None:
        return ANONYMOUS
    message = json.dumps([registry, auth.username, auth.password]).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class ImageAccess:
    """The images the agent pulled with credentials and who proved access to each: image id -> fingerprints of the
    credentials whose pull reached that very id (``credential_fingerprint``), in a 0600 JSON file with the host-local
    key. An image not recorded is public (pulled anonymously or loaded by the provider) and runs for anyone.

    Fails closed: a damaged or missing file marks every image in ``pulled_before`` (those the agent pulled, from
    ``ImageUses``) private with no proof, so each is pulled again by its next renter: an agent upgraded from before this
    record cannot tell which of its pulls had credentials."""

    def __init__(self, path: Path | None, pulled_before: Iterable[str] = ()) -> None:
        self.path = path
        self.key = secrets.token_bytes(_KEY_BYTES)
        self.proven: dict[str, set[str]] = {}
        loaded = self._load()
        if loaded is None:
            self.proven = {image_id: set() for image_id in pulled_before}
            if self.proven:
                self._save()
            return
        self.key, self.proven = loaded

    def admits(self, image_id: str, registry: str, auth: RegistryAuth | None) -> bool:
        """Whether a create with ``auth`` may run image ``image_id`` without pulling it again."""
        proven = self.proven.get(image_id)
        if proven is None or ANONYMOUS in proven:
            return True
        return credential_fingerprint(self.key, registry, auth) in proven

    def pulled(self, image_id: str, registry: str, auth: RegistryAuth | None) -> None:
        """A pull with ``auth`` reached ``image_id``: those credentials are proven for it. An anonymous pull of an image
        not recorded records nothing (it is public)."""
        if auth is None and image_id not in self.proven:
            return
        self.proven.setdefault(image_id, set()).add(credential_fingerprint(self.key, registry, auth))
        self._save()

    def private(self, image_id: str) -> bool:
        """Pulled with credentials and never reached without: not to be shown to other renters."""
        proven = self.proven.get(image_id)
        return proven is not None and ANONYMOUS not in proven

    def keep_only(self, image_ids: Iterable[str]) -> None:
        """Forget the images no longer on the engine (evicted, or removed by the provider)."""
        present = set(image_ids)
        gone = [image_id for image_id in self.proven if image_id not in present]
        for image_id in gone:
            del self.proven[image_id]
        if gone:
            self._save()

    def _load(self) -> tuple[bytes, dict[str, set[str]]] | None:
        if self.path is None:
            return self.key, {}
        if not self.path.exists():
            return None  # a first start, or an agent from before this record: what it pulled before is unproven
        try:
            loaded = json.loads(self.path.read_text())
            key = bytes.fromhex(loaded["key"])
            proven = {str(image_id): {str(f) for f in fingerprints} for image_id, fingerprints in loaded["images"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return (key, proven) if len(key) == _KEY_BYTES else None

    def _save(self) -> None:
        if self.path is not None:
            record = {"key": self.key.hex(), "images": {i: sorted(f) for i, f in self.proven.items()}}
            write_atomically(self.path, json.dumps(record).encode(), mode=PRIVATE_FILE_MODE)
