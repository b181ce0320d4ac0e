"""A gang's private network as a replica's create command carries it (docs/overlay.md).

``OverlaySpec`` travels in ``ContainerSpec.overlay``, inside the Master's signed command: the replica's address and
rank, its peers' addresses by rank, the grid's overlay CA and the replica's certificate (which names the address and
the workload's group; its key is the agent's own, never sent), and the lighthouses that are the network's discovery
and relay points. From it the agent writes Nebula's configuration (``nebula_config``) and the replica's environment
(``replica_env``: torchrun's variables, the hostfile, the interface for NCCL and Gloo).

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

import msgspec

from common.nebula import NebulaCertError, decode_cert_pem

__all__ = [
    "DEFAULT_INTERFACE",
    "DEFAULT_MASTER_PORT",
    "FENCE_METRIC",
    "HOSTFILE_NAME",
    "Lighthouse",
    "MAX_BLOCKLIST",
    "OverlaySpec",
    "fence_route",
    "hostfile_text",
    "nebula_config",
    "replica_address",
    "replica_env",
]

DEFAULT_INTERFACE = "ig0"  # the overlay's TUN device in every replica's namespace: NCCL_SOCKET_IFNAME names it
DEFAULT_MASTER_PORT = 29500  # torchrun's own default
HOSTFILE_NAME = "idlegrid-hostfile"
MTU = 1300  # under the underlay's 1500 less Nebula's headers, and a relay's second header
# The fence's route metric: above the overlay interface's own route for the range (the kernel's, metric 0), so the
# fence decides only while the interface is absent (before Nebula is up, after it ended).
FENCE_METRIC = 4242

_IPV4 = r"^\d{1,3}(\.\d{1,3}){3}\Z"
_CIDR = r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}\Z"
_ENDPOINT = r"^[A-Za-z0-9.-]{1,253}:\d{1,5}\Z"
_IFNAME = r"^[a-z][a-z0-9]{0,14}\Z"
_GROUP = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z"
_PEM = Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
_FINGERPRINT = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]
MAX_BLOCKLIST = 256


class Lighthouse(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A discovery and relay point: its overlay address and where it answers on the underlay (UDP)."""

    address: Annotated[str, msgspec.Meta(pattern=_IPV4)]
    endpoints: Annotated[list[Annotated[str, msgspec.Meta(pattern=_ENDPOINT)]], msgspec.Meta(min_length=1, max_length=8)]


class OverlaySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A replica's place on its workload's network. ``peers[rank]`` is each replica's address; ``peers[0]`` is
    torchrun's MASTER_ADDR. Rank and address follow the replica, not its host: a restart or a move keeps them."""

    network: Annotated[str, msgspec.Meta(pattern=_CIDR)]  # the workload's block, e.g. "100.64.0.0/25"
    group: Annotated[str, msgspec.Meta(pattern=_GROUP)]  # the workload's group: the only one admitted inbound
    rank: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    peers: Annotated[list[Annotated[str, msgspec.Meta(pattern=_IPV4)]], msgspec.Meta(min_length=1, max_length=1024)]
    local_world_size: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1  # the replica's GPUs (processes per replica)
    master_port: Annotated[int, msgspec.Meta(ge=1024, le=65535)] = DEFAULT_MASTER_PORT
    ca: _PEM
    certificate: _PEM
    lighthouses: Annotated[list[Lighthouse], msgspec.Meta(min_length=1, max_length=16)]
    interface: Annotated[str, msgspec.Meta(pattern=_IFNAME)] = DEFAULT_INTERFACE
    # Certificates this replica's Nebula refuses (hex SHA-256 fingerprints): those the workload's earlier containers
    # held, which a host lost but still running, or an agent restarting before its stray is deleted, could bring back.
    blocklist: Annotated[list[_FINGERPRINT], msgspec.Meta(max_length=MAX_BLOCKLIST)] = []

    def __post_init__(self) -> None:
        if self.rank >= len(self.peers):
            raise ValueError(f"rank {self.rank} has no address: {len(self.peers)} peers")
        network = ipaddress.IPv4Network(self.network, strict=True)
        for peer in self.peers:
            if ipaddress.IPv4Address(peer) not in network:
                raise ValueError(f"peer {peer} is outside the network {self.network}")

    @property
    def address(self) -> str:
        """This replica's overlay address."""
        return self.peers[self.rank]


def fence_route(spec: OverlaySpec) -> list[str]:
    """``ip`` arguments that make the whole overlay range unreachable in a replica's namespace except through the
    overlay's interface. Without it, a replica's traffic to its peers (MASTER_ADDR included) follows the namespace's
    default route out of the host to whoever answers for that address on the provider's network whenever the overlay
    is not up: before Nebula has started, and after it ended. ``replace`` keeps it idempotent (an agent that restarts
    sets it again). The range is the certificate's prefix (its routes are the range's), else the workload's block."""
    try:
        fenced = str(ipaddress.ip_interface(decode_cert_pem(spec.certificate).ips[0]).network)
    except (NebulaCertError, IndexError, ValueError):
        fenced = spec.network
    return ["route", "replace", "unreachable", fenced, "metric", str(FENCE_METRIC)]


def replica_address(network: str, replica: int) -> str:
    """Replica ``replica``'s address: the block's host number ``replica + 1`` (rank 0 is MASTER_ADDR)."""
    block = ipaddress.IPv4Network(network)
    if replica + 2 >= block.num_addresses:
        raise ValueError(f"replica {replica} does not fit in {network}")
    return str(block.network_address + replica + 1)


def hostfile_text(spec: OverlaySpec) -> str:
    """The hostfile MPI and DeepSpeed read: one line per replica, in rank order, with its GPUs as slots."""
    return "".join(f"{peer} slots={spec.local_world_size}\n" for peer in spec.peers)


def replica_env(spec: OverlaySpec, hostfile_path: str) -> dict[str, str]:
    """torchrun's variables as ``torchrun --nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node
    $LOCAL_WORLD_SIZE --master_addr $MASTER_ADDR --master_port $MASTER_PORT`` reads them, and as
    ``init_process_group("env://")`` does for one process per replica: WORLD_SIZE counts every process (replicas
    times GPUs each) and RANK is the replica's first process's rank (torchrun sets each worker's own)."""
    nnodes = len(spec.peers)
    return {
        "MASTER_ADDR": spec.peers[0],
        "MASTER_PORT": str(spec.master_port),
        "WORLD_SIZE": str(nnodes * spec.local_world_size),
        "NNODES": str(nnodes),
        "NODE_RANK": str(spec.rank),
        "RANK": str(spec.rank * spec.local_world_size),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "IDLEGRID_HOSTFILE": hostfile_path,
        "IDLEGRID_OVERLAY_ADDR": spec.address,
        "NCCL_SOCKET_IFNAME": spec.interface,
        "GLOO_SOCKET_IFNAME": spec.interface,
    }


def nebula_config(spec: OverlaySpec, *, ca_path: str, cert_path: str, key_path: str) -> dict[str, Any]:
    """Nebula's configuration for one replica (JSON is YAML, which Nebula reads).

    Inbound: only the workload's group, any port. Outbound: anything on the overlay (the overlay holds only
    certificates of this grid's CA, and every other workload drops what does not come from its own group). Peers are
    found through the lighthouses, punched through NATs where they allow it (``punchy``), else reached through the
    lighthouses as relays."""
    lighthouse_ips = [lh.address for lh in spec.lighthouses]
    return {
        "pki": {"ca": ca_path, "cert": cert_path, "key": key_path, "blocklist": list(spec.blocklist)},
        "static_host_map": {lh.address: list(lh.endpoints) for lh in spec.lighthouses},
        "lighthouse": {"am_lighthouse": False, "interval": 10, "hosts": lighthouse_ips},
        "listen": {"host": "0.0.0.0", "port": 0},
        # The peer punches back at once; a second handshake try comes after that punch, so a NAT that allows punching
        # gets a direct tunnel before the relay (asked for on that same try) answers.
        "punchy": {"punch": True, "respond": True, "delay": "0s"},
        "handshakes": {"try_interval": "300ms"},
        "relay": {"relays": lighthouse_ips, "am_relay": False, "use_relays": True},
        "tun": {"dev": spec.interface, "mtu": MTU, "drop_local_broadcast": True, "drop_multicast": True},
        "logging": {"level": "info", "format": "json"},
        "firewall": {
            "conntrack": {"tcp_timeout": "12m", "udp_timeout": "3m", "default_timeout": "10m"},
            "outbound": [{"port": "any", "proto": "any", "host": "any"}],
            "inbound": [{"port": "any", "proto": "any", "group": spec.group}],
        },
    }


RELAY_BYTES_PER_S = 8 * 1024 * 1024  # what one replica may push through a relay (a tunnel's default is 32 MiB/s)


def relay_limit_rules(port: int, bytes_per_s: int = RELAY_BYTES_PER_S) -> list[list[str]]:
    """iptables rules (arguments after ``iptables``) for the relay's host that bound what each replica sends through
    the relay: a token bucket per source address and port (one replica's Nebula socket), over which its packets are
    dropped, so TCP inside the overlay slows down and the relay's control frames keep their pace. Lighthouse queries
    and handshakes are small and stay far under it; direct tunnels never reach the relay."""
    kib = max(bytes_per_s // 1024, 1)
    return [
        ["-A", "INPUT", "-p", "udp", "--dport", str(port), "-m", "hashlimit", "--hashlimit-name", f"overlay{port}",
         "--hashlimit-mode", "srcip,srcport", "--hashlimit-above", f"{kib}kb/s", "--hashlimit-burst", f"{kib + 64}kb",
         "-j", "DROP"],
    ]  # fmt: skip


def lighthouse_config(
    *, ca_path: str, cert_path: str, key_path: str, listen_host: str, listen_port: int, interface: str
) -> dict[str, Any]:
    """Nebula's configuration for a discovery and relay point: it answers where each host is, relays for hosts
    that cannot punch through, and admits nothing to itself over the overlay (its inbound firewall is empty)."""
    return {
        "pki": {"ca": ca_path, "cert": cert_path, "key": key_path},
        "static_host_map": {},
        "lighthouse": {"am_lighthouse": True, "interval": 10, "hosts": []},
        "listen": {"host": listen_host, "port": listen_port},
        "punchy": {"punch": True, "respond": True},
        "relay": {"am_relay": True, "use_relays": False},
        "tun": {"dev": interface, "mtu": MTU},
        "logging": {"level": "info", "format": "json"},
        "firewall": {"outbound": [{"port": "any", "proto": "any", "host": "any"}], "inbound": []},
    }
