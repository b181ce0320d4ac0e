"""A replica's overlay as its create command carries it: torchrun's variables, the hostfile, Nebula's config."""

from __future__ import annotations

import time

import msgspec
import pytest

from common.nebula import new_host_key
from common.overlay import FENCE_METRIC, Lighthouse, OverlaySpec, fence_route, hostfile_text, nebula_config, replica_env
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings

LH = [Lighthouse(address="100.64.0.1", endpoints=["10.77.0.10:4242"])]


def _spec(rank: int, peers: int = 3, gpus: int = 2) -> OverlaySpec:
    addresses = [f"100.64.0.{129 + r}" for r in range(peers)]
    return OverlaySpec(
        network="100.64.0.128/25",
        group="wl-ab",
        rank=rank,
        peers=addresses,
        local_world_size=gpus,
        ca="CA",
        certificate="CERT",
        lighthouses=LH,
    )


def test_every_replica_gets_torchruns_variables_naming_rank_0_as_master() -> None:
    envs = [replica_env(_spec(rank), "/run/idlegrid/hostfile") for rank in range(3)]
    for rank, env in enumerate(envs):
        assert env["MASTER_ADDR"] == "100.64.0.129"
        assert env["MASTER_PORT"] == "29500"
        assert env["NNODES"] == "3" and env["NODE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "2" and env["RANK"] == str(2 * rank)
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ig0"
        assert env["IDLEGRID_HOSTFILE"] == "/run/idlegrid/hostfile"
        assert env["IDLEGRID_OVERLAY_ADDR"] == f"100.64.0.{129 + rank}"


def test_the_hostfile_lists_every_replica_in_rank_order_with_its_gpus_as_slots() -> None:
    assert hostfile_text(_spec(1)) == "100.64.0.129 slots=2\n100.64.0.130 slots=2\n100.64.0.131 slots=2\n"


def test_the_firewall_admits_only_the_workloads_group_and_relays_through_the_lighthouses() -> None:
    config = nebula_config(_spec(0), ca_path="ca", cert_path="crt", key_path="key")
    assert config["firewall"]["inbound"] == [{"port": "any", "proto": "any", "group": "wl-ab"}]
    assert config["relay"]["relays"] == ["100.64.0.1"] and config["relay"]["use_relays"]
    assert config["static_host_map"] == {"100.64.0.1": ["10.77.0.10:4242"]}
    assert config["tun"]["dev"] == "ig0"


def test_the_certificates_of_earlier_containers_go_into_nebulas_blocklist() -> None:
    assert nebula_config(_spec(0), ca_path="ca", cert_path="crt", key_path="key")["pki"]["blocklist"] == []
    old = "ab" * 32
    blocked = msgspec.structs.replace(_spec(0), blocklist=[old])
    assert nebula_config(blocked, ca_path="ca", cert_path="crt", key_path="key")["pki"]["blocklist"] == [old]
    with pytest.raises(msgspec.ValidationError):  # a fingerprint is 64 hex digits, nothing else reaches the config
        msgspec.convert({**msgspec.to_builtins(_spec(0)), "blocklist": ["ab\nkey: x"]}, OverlaySpec)


def test_a_spec_whose_rank_or_peers_do_not_fit_is_refused() -> None:
    good = msgspec.to_builtins(_spec(0))
    with pytest.raises(msgspec.ValidationError, match="rank 5"):
        msgspec.convert({**good, "rank": 5}, OverlaySpec)
    with pytest.raises(msgspec.ValidationError, match="outside the network"):
        msgspec.convert({**good, "peers": ["100.64.1.1"]}, OverlaySpec)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**good, "interface": "eth0; rm"}, OverlaySpec)


def test_the_fence_makes_the_certificates_whole_range_unreachable_under_the_overlays_own_route() -> None:
    settings = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["10.77.0.10:4242"])])
    signed = OverlayAuthority.create(settings).replica_spec(
        workload_id="wl-ab", network="100.64.0.128/25", replica=0, replicas=2, gpus=1,
        public_key_pem=new_host_key()[1], now=time.time(),
    )  # fmt: skip
    # The range, not the block: the lighthouses and every other workload's block are in it too.
    assert fence_route(signed) == ["route", "replace", "unreachable", "100.64.0.0/10", "metric", str(FENCE_METRIC)]
    assert FENCE_METRIC > 0  # the overlay interface's own route (metric 0) wins while it exists
    # A certificate that does not decode still fences the workload's own block.
    assert fence_route(_spec(0))[3] == "100.64.0.128/25"
