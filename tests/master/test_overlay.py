"""The Master as the overlay's authority: blocks, addresses, certificates (master/overlay.py)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest

from common.nebula import decode_cert_pem, new_host_key, public_key_of_pem, verify
from master.overlay import (
    LighthouseSetting,
    NoNetworkLeft,
    OverlayAuthority,
    OverlaySettings,
    allocate_network,
    replica_address,
)

SETTINGS = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["10.77.0.10:4242"])])
NOW = 1_800_000_000.0


def test_blocks_go_lowest_free_first_and_never_to_two_open_workloads() -> None:
    first = allocate_network([], SETTINGS)
    assert first == "100.64.0.128/25"  # the first block is the lighthouses'
    second = allocate_network([first], SETTINGS)
    assert second == "100.64.1.0/25"
    assert allocate_network([second], SETTINGS) == first  # a finished workload's block is used again


def test_a_full_range_says_so() -> None:
    small = OverlaySettings(range="100.64.0.0/24", block_prefix=25)
    assert allocate_network([], small) == "100.64.0.128/25"
    with pytest.raises(NoNetworkLeft):
        allocate_network(["100.64.0.128/25"], small)


def test_a_replicas_address_depends_only_on_its_block_and_rank() -> None:
    assert replica_address("100.64.1.0/25", 0) == "100.64.1.1"
    assert replica_address("100.64.1.0/25", 63) == "100.64.1.64"
    with pytest.raises(ValueError):
        replica_address("100.64.1.0/29", 6)


def test_a_replicas_certificate_names_its_address_and_its_workloads_group_for_its_hosts_key() -> None:
    authority = OverlayAuthority.create(SETTINGS, now=NOW)
    _, public = new_host_key()
    spec = authority.replica_spec(
        workload_id="wl-ab", network="100.64.1.0/25", replica=1, replicas=2, gpus=4, public_key_pem=public, now=NOW
    )
    cert = decode_cert_pem(spec.certificate)
    assert verify(cert, authority.ca)
    assert cert.ips == ("100.64.1.2/10",) and cert.groups == ("wl-ab",) and cert.name == "wl-ab-r1"
    assert cert.public_key == public_key_of_pem(public)
    assert cert.not_after - NOW == SETTINGS.cert_ttl_s and cert.not_before < NOW  # short-lived, with clock skew
    assert spec.peers == ["100.64.1.1", "100.64.1.2"] and spec.rank == 1 and spec.local_world_size == 4
    assert spec.group == "wl-ab" and spec.lighthouses[0].endpoints == ["10.77.0.10:4242"]


def test_a_restart_or_a_move_keeps_the_rank_and_address() -> None:
    authority = OverlayAuthority.create(SETTINGS, now=NOW)
    args = dict(workload_id="wl-ab", network="100.64.1.0/25", replica=1, replicas=2, gpus=1)
    before = authority.replica_spec(**args, public_key_pem=new_host_key()[1], now=NOW)  # type: ignore[arg-type]
    after = authority.replica_spec(**args, public_key_pem=new_host_key()[1], now=NOW + 600)  # type: ignore[arg-type]
    assert (before.rank, before.peers) == (after.rank, after.peers)
    assert decode_cert_pem(before.certificate).ips == decode_cert_pem(after.certificate).ips


def test_the_ca_is_kept_0600_and_the_same_after_a_restart(tmp_path: Path) -> None:
    first = OverlayAuthority.open(tmp_path, SETTINGS)
    assert os.stat(tmp_path / "overlay-ca.key").st_mode & 0o777 == 0o600
    again = OverlayAuthority.open(tmp_path, SETTINGS)
    assert again.ca == first.ca


def test_a_lighthouse_is_in_the_first_block_and_no_workloads_group() -> None:
    authority = OverlayAuthority.create(SETTINGS, now=NOW)
    cert = decode_cert_pem(authority.lighthouse_certificate("100.64.0.1", new_host_key()[1], NOW))
    assert cert.groups == ("lighthouse",)
    assert ipaddress.IPv4Interface(cert.ips[0]).ip == ipaddress.IPv4Address("100.64.0.1")
    with pytest.raises(ValueError):
        authority.lighthouse_certificate("100.64.1.1", new_host_key()[1], NOW)


def test_a_lighthouse_directory_is_written_for_a_relays_host(tmp_path: Path) -> None:
    from master.overlay import write_lighthouse

    authority = OverlayAuthority.open(tmp_path / "master", SETTINGS)
    rules = write_lighthouse(authority, address="100.64.0.1", port=4242, out=tmp_path / "lh", now=NOW)
    assert os.stat(tmp_path / "lh" / "host.key").st_mode & 0o777 == 0o600
    cert = decode_cert_pem((tmp_path / "lh" / "host.crt").read_text())
    assert verify(cert, authority.ca) and cert.groups == ("lighthouse",)
    config = json.loads((tmp_path / "lh" / "nebula.json").read_text())
    assert config["lighthouse"]["am_lighthouse"] and config["relay"]["am_relay"] and config["listen"]["port"] == 4242
    assert config["firewall"]["inbound"] == []  # nothing reaches the lighthouse itself over the overlay
    assert any("hashlimit" in rule for rule in rules)


def test_the_cli_writes_a_lighthouse_from_the_masters_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from management.cli.main import main

    state = tmp_path / "master"
    authority = OverlayAuthority.open(state, SETTINGS)
    assert (
        main(["ca", "issue-lighthouse", "--state-dir", str(state), "--address", "100.64.0.1", "--out", str(tmp_path / "lh")]) == 0
    )
    assert verify(decode_cert_pem((tmp_path / "lh" / "host.crt").read_text()), authority.ca)
    assert "nebula -config" in capsys.readouterr().out
    assert (
        main(["ca", "issue-lighthouse", "--state-dir", str(state), "--address", "100.64.5.1", "--out", str(tmp_path / "x")]) == 2
    )


def test_a_certificate_covers_the_workloads_longest_run_up_to_a_cap_and_a_lighthouses_lasts() -> None:
    authority = OverlayAuthority.create(SETTINGS, now=NOW)
    args = dict(workload_id="wl-ab", network="100.64.1.0/25", replica=0, replicas=2, gpus=1, now=NOW)

    def lifetime(**extra: object) -> float:
        spec = authority.replica_spec(**args, public_key_pem=new_host_key()[1], **extra)  # type: ignore[arg-type]
        return decode_cert_pem(spec.certificate).not_after - NOW

    assert lifetime() == SETTINGS.cert_ttl_s  # no maximum duration: the default
    assert lifetime(max_duration_s=3600.0) == SETTINGS.cert_ttl_s  # a short run: still the default
    assert lifetime(max_duration_s=3 * 86400.0) == 3 * 86400.0 + 3600.0  # a long run is covered, and an hour
    assert lifetime(max_duration_s=300 * 86400.0) == SETTINGS.max_cert_s  # up to the cap
    lighthouse = decode_cert_pem(authority.lighthouse_certificate("100.64.0.1", new_host_key()[1], NOW))
    assert lighthouse.not_after - NOW == SETTINGS.lighthouse_cert_s
