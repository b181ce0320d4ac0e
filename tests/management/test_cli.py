"""The one command line: every subcommand explains itself, and bad input gets a clear message, not a traceback."""

import subprocess
import sys

import pytest

from tests.support.grid import REPO

COMMANDS = [
    ["master"],
    ["access"],
    ["agent"],
    ["agent", "enroll"],
    ["demo"],
    ["ca", "init"],
    ["ca", "issue-access"],
    ["token", "create"],
]


def idlegrid(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "management.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_says_what_each_command_does(command):
    done = idlegrid(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: idlegrid " + " ".join(command) in done.stdout
    assert len(done.stdout.splitlines()) > 3


def test_ca_init_creates_the_platform_keys_with_private_modes(tmp_path):
    done = idlegrid("ca", "init", "--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pki" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "pki" / "signing.key").stat().st_mode & 0o777 == 0o600
    out = tmp_path / "relay"
    issued = idlegrid("ca", "issue-access", "--state-dir", str(tmp_path), "--relay-id", "relay-x", "--out", str(out))
    assert issued.returncode == 0, issued.stderr
    assert (out / "relay-x.key").stat().st_mode & 0o777 == 0o600


def test_an_agent_that_is_not_enrolled_says_what_to_do(tmp_path):
    done = idlegrid("agent", "--state-dir", str(tmp_path / "nowhere"), "--access", "wss://127.0.0.1:1")
    assert done.returncode == 2
    assert "idlegrid agent enroll" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_config_file_is_named_in_the_error(tmp_path):
    config = tmp_path / "master.toml"
    config.write_text('heartbeat_s = "often"\nno_such_setting = 1\n')
    done = idlegrid("master", "--config", str(config), "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert "no_such_setting" in done.stderr and "Traceback" not in done.stderr


def test_token_create_needs_a_reachable_api(tmp_path):
    key = tmp_path / "operator.token"
    key.write_text("igak_x\n")
    done = idlegrid("token", "create", "--provider", "acme", "--api", "http://127.0.0.1:1", "--operator-token-file", str(key))
    assert done.returncode == 2
    assert "cannot reach the management API" in done.stderr
