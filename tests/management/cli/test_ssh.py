"""The SSH commands' pure parts (management/cli/ssh.py): the names ssh knows replicas by and the config block. The
commands themselves run against a real grid with OpenSSH's clients in tests/e2e/test_ssh.py."""

from __future__ import annotations

import pytest

from management.cli.ssh import BadSshRequest, host_block, known_hosts_lines, parse_host


def test_a_host_name_is_a_workload_and_optionally_a_replica():
    assert parse_host("wl-1a2b") == ("wl-1a2b", 0)
    assert parse_host("wl-1a2b.r3") == ("wl-1a2b", 3)


@pytest.mark.parametrize("bad", ["", "1a2b", "wl-1a2b.r", "wl-1a2b.rx", "wl-1a2b;id", "wl-1a2b.r1.example"])
def test_anything_else_is_refused_naming_the_forms_it_takes(bad):
    with pytest.raises(BadSshRequest, match="give its id"):
        parse_host(bad)


def test_the_config_block_names_every_replica_and_proxies_through_the_cli_with_the_host_key_checked():
    block = host_block(["wl-1a2b", "wl-1a2b.r1"], "idlegrid")
    assert block.splitlines() == [
        "Host wl-1a2b wl-1a2b.r1",
        "    ProxyCommand idlegrid workload proxy %h",
        "    ServerAliveInterval 60",
        "    StrictHostKeyChecking yes",
    ]


def test_known_hosts_lines_are_those_of_replicas_whose_host_reported_a_key():
    answer = {
        "workload": "wl-1",
        "replicas": [
            {"replica": 0, "known_hosts": "wl-1 ssh-ed25519 AAAA"},
            {"replica": 1, "known_hosts": None},
        ],
    }
    assert known_hosts_lines(answer) == ["wl-1 ssh-ed25519 AAAA"]
