"""The Master as the authority of every gang's private network (docs/overlay.md).

One Nebula CA for the grid (Ed25519, kept 0600 in the Master's state directory beside its other keys). Each
multi-replica workload gets a block of the grid's overlay range (``allocate_network``: the lowest block no open
workload holds) and a group named after it. Each replica gets a short-lived certificate for the key its host sent in
``hello`` (the private half never leaves the host), naming the replica's address (``replica_address``: the block's
first hosts, by rank, so a restart or a move keeps it) and the workload's group: every replica's Nebula firewall
admits only that group, so one workload's replicas cannot reach another's. The first block of the range is the
lighthouses' (the discovery and relay points, ``lighthouse_certificate``).

Invariants: no two open workloads hold the same block; a replica's address depends only on its workload's block and
its rank; a certificate never outlives the CA (Nebula refuses it) nor ``cert_ttl_s``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated

import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from common.errors import IdlegridError
from common.nebula import NebulaCertificate, cert_pem, decode_cert_pem, new_host_key, public_key_of_pem, sign
from common.overlay import (
    DEFAULT_MASTER_PORT,
    MAX_BLOCKLIST,
    Lighthouse,
    OverlaySpec,
    lighthouse_config,
    relay_limit_rules,
    replica_address,
)

__all__ = [
    "LighthouseSetting",
    "NoNetworkLeft",
    "OverlayAuthority",
    "OverlaySettings",
    "allocate_network",
    "replica_address",
    "write_lighthouse",
]

CA_KEY_FILE = "overlay-ca.key"
CA_CERT_FILE = "overlay-ca.crt"
CA_LIFETIME_S = 10 * 365 * 86400  # the grid's overlay CA; host certificates are hours long
CLOCK_SKEW_S = 300  # a certificate is valid from this long before it is issued: hosts' clocks drift


class NoNetworkLeft(IdlegridError):
    """Every block of the overlay range is held by an open workload."""

    code = "no_overlay_network"


class LighthouseSetting(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A discovery and relay point: its overlay address (in the range's first block) and its UDP endpoints."""

    address: str
    endpoints: list[str]


class OverlaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[overlay]`` of the Master's configuration. Without lighthouses no network is made (replicas get none)."""

    range: str = "100.64.0.0/10"  # RFC 6598 shared space: what a container's own networks rarely use
    block_prefix: Annotated[int, msgspec.Meta(ge=16, le=29)] = 25  # 126 addresses: 64 replicas and room to spare
    # A replica's certificate lasts this long, or its workload's max_duration_s and an hour if that is longer, up to
    # max_cert_s (certificates are not renewed yet: docs/overlay.md, "What is left").
    cert_ttl_s: Annotated[float, msgspec.Meta(ge=600, le=30 * 86400)] = 24 * 3600.0
    max_cert_s: Annotated[float, msgspec.Meta(ge=600, le=366 * 86400)] = 30 * 86400.0
    lighthouse_cert_s: Annotated[float, msgspec.Meta(ge=86400, le=5 * 366 * 86400)] = 365 * 86400.0
    master_port: Annotated[int, msgspec.Meta(ge=1024, le=65535)] = DEFAULT_MASTER_PORT
    lighthouses: list[LighthouseSetting] = []


def _blocks(settings: OverlaySettings) -> Iterable[ipaddress.IPv4Network]:
    return ipaddress.IPv4Network(settings.range).subnets(new_prefix=settings.block_prefix)


def allocate_network(held: Iterable[str], settings: OverlaySettings) -> str:
    """The lowest block of the range that no open workload holds; the first block is the lighthouses'."""
    taken = set(held)
    blocks = iter(_blocks(settings))
    next(blocks)  # the lighthouses' block
    for block in blocks:
        if str(block) not in taken:
            return str(block)
    raise NoNetworkLeft(f"every /{settings.block_prefix} block of {settings.range} is held by an open workload")


class OverlayAuthority:
    """The grid's overlay CA and what it signs."""

    def __init__(self, key: ed25519.Ed25519PrivateKey, ca: NebulaCertificate, settings: OverlaySettings) -> None:
        self._key = key
        self.ca = ca
        self.ca_pem = cert_pem(ca)
        self.settings = settings

    @classmethod
    def create(cls, settings: OverlaySettings, *, name: str = "idlegrid overlay", now: float | None = None) -> OverlayAuthority:
        key = ed25519.Ed25519PrivateKey.generate()
        start = int(time.time() if now is None else now) - CLOCK_SKEW_S
        public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        ca = sign(
            NebulaCertificate(name=name, public_key=public, not_before=start, not_after=start + CA_LIFETIME_S, is_ca=True),
            key,
            None,
        )
        return cls(key, ca, settings)

    @classmethod
    def open(cls, state_dir: Path, settings: OverlaySettings) -> OverlayAuthority:
        """The CA kept in ``state_dir`` (made there, 0600, on first use)."""
        key_path, cert_path = Path(state_dir) / CA_KEY_FILE, Path(state_dir) / CA_CERT_FILE
        if key_path.exists() and cert_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            if not isinstance(key, ed25519.Ed25519PrivateKey):
                raise IdlegridError(f"{key_path} is not an Ed25519 key")
            return cls(key, decode_cert_pem(cert_path.read_text()), settings)
        made = cls.create(settings)
        key_bytes = made._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_bytes)
        cert_path.write_text(made.ca_pem)
        return made

    @property
    def enabled(self) -> bool:
        return bool(self.settings.lighthouses)

    def _certificate(self, *, name: str, cidr: str, groups: tuple[str, ...], public_key: bytes, now: float, ttl_s: float) -> str:
        start = max(int(now) - CLOCK_SKEW_S, self.ca.not_before)
        end = min(int(now + ttl_s), self.ca.not_after)
        cert = NebulaCertificate(name=name, public_key=public_key, not_before=start, not_after=end, ips=(cidr,), groups=groups)
        return cert_pem(sign(cert, self._key, self.ca))

    def lighthouse_certificate(self, address: str, public_key_pem: str, now: float) -> str:
        """A lighthouse's certificate: an address of the first block, in no workload's group."""
        first = next(iter(_blocks(self.settings)))
        if ipaddress.IPv4Address(address) not in first:
            raise ValueError(f"a lighthouse's address is in {first}, not {address}")
        return self._certificate(
            name=f"lighthouse-{address}",
            cidr=f"{address}/{ipaddress.IPv4Network(self.settings.range).prefixlen}",
            groups=("lighthouse",),
            public_key=public_key_of_pem(public_key_pem),
            now=now,
            ttl_s=self.settings.lighthouse_cert_s,
        )

    def replica_spec(
        self,
        *,
        workload_id: str,
        network: str,
        replica: int,
        replicas: int,
        gpus: int,
        public_key_pem: str,
        now: float,
        max_duration_s: float | None = None,
        blocklist: Sequence[str] = (),
        attempt: int = 0,
    ) -> OverlaySpec:
        """Replica ``replica``'s place on ``network``, its certificate made for its host's key, valid ``cert_ttl_s``
        or the workload's ``max_duration_s`` and an hour if longer (up to ``max_cert_s``); its Nebula refuses the
        certificates in ``blocklist`` (the newest MAX_BLOCKLIST)."""
        settings = self.settings
        ttl_s = min(max(settings.cert_ttl_s, (max_duration_s or 0.0) + 3600.0), settings.max_cert_s)
        peers = [replica_address(network, r) for r in range(replicas)]
        address = peers[replica]
        # The certificate's prefix is the grid's range: a replica's Nebula routes the whole range into its tunnel (the
        # lighthouses are in it); its firewall, not its routes, keeps it to its own workload.
        cidr = f"{address}/{ipaddress.IPv4Network(self.settings.range).prefixlen}"
        certificate = self._certificate(
            # The attempt makes every container's certificate its own (a replica placed again on the same host in the
            # same second would otherwise get the very certificate its predecessor held, which the blocklist names).
            name=f"{workload_id}-r{replica}" + (f"-a{attempt}" if attempt else ""),
            cidr=cidr,
            groups=(workload_id,),
            public_key=public_key_of_pem(public_key_pem),
            now=now,
            ttl_s=ttl_s,
        )
        return OverlaySpec(
            network=network,
            group=workload_id,
            rank=replica,
            peers=peers,
            local_world_size=max(gpus, 1),
            master_port=self.settings.master_port,
            ca=self.ca_pem,
            certificate=certificate,
            lighthouses=[Lighthouse(address=lh.address, endpoints=list(lh.endpoints)) for lh in self.settings.lighthouses],
            blocklist=list(blocklist)[-MAX_BLOCKLIST:],
        )


def write_lighthouse(
    authority: OverlayAuthority, *, address: str, port: int, out: Path, now: float | None = None
) -> list[list[str]]:
    """A lighthouse's directory for the host of an Access relay: a fresh key (0600), its certificate from the grid's
    overlay CA, the CA, and ``nebula.json`` (``nebula -config OUT/nebula.json`` runs it, as root). Returns the iptables
    rules that bound each replica's relayed bandwidth on that host (common.overlay.relay_limit_rules). The relay's
    address and UDP port then go into the Master's ``[overlay] lighthouses``."""
    out.mkdir(parents=True, exist_ok=True)
    private, public = new_host_key()
    key_path = out / "host.key"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(private)
    (out / "host.crt").write_text(authority.lighthouse_certificate(address, public, time.time() if now is None else now))
    (out / "ca.crt").write_text(authority.ca_pem)
    config = lighthouse_config(
        ca_path=str((out / "ca.crt").resolve()),
        cert_path=str((out / "host.crt").resolve()),
        key_path=str(key_path.resolve()),
        listen_host="0.0.0.0",
        listen_port=port,
        interface="lh0",
    )
    (out / "nebula.json").write_text(json.dumps(config, indent=2))
    return relay_limit_rules(port)
