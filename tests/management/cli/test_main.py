"""The one command line: every subcommand explains itself, and bad input gets a clear message, not a traceback."""

import argparse
import socket
import subprocess
import sys

import pytest

from common.errors import IdlegridError
from management.cli import main as cli
from tests.support.grid import REPO, Grid, free_port, wait_for

COMMANDS = [
    ["master"],
    ["access"],
    ["agent"],
    ["agent", "enroll"],
    ["demo"],
    ["ca", "init"],
    ["ca", "issue-access"],
    ["token", "create"],
    ["workload", "submit"],
    ["workload", "list"],
    ["workload", "get"],
    ["workload", "cancel"],
    ["whoami"],
    ["account", "create"],
    ["account", "list"],
    ["account", "get"],
    ["account", "update"],
    ["account", "key", "create"],
    ["account", "key", "list"],
    ["account", "key", "revoke"],
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


# --- what a new user runs into ------------------------------------------------------------------------


def test_version_is_printed():
    done = idlegrid("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("idlegrid ") and done.stdout.split()[1][0].isdigit()


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command line by its full name ("agent enroll", "ca init", ...)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found[child.prog.removeprefix("idlegrid ")] = child
                    walk(child)

    walk(cli.build_parser())
    return found


# The relay's own flags are the relay engineer's (access/cli.py); the rest of the command line is checked here.
OWN_COMMANDS = [name for name in subcommand_parsers() if name != "access"]


@pytest.mark.parametrize("name", OWN_COMMANDS)
def test_every_option_says_its_default_unless_it_is_required(name):
    parser = subcommand_parsers()[name]
    assert parser.description, f"idlegrid {name} --help has no description"
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest in ("help", "version"):
            continue
        if action.required:
            continue
        assert "default" in (action.help or ""), f"idlegrid {name} {action.option_strings[0]}: help shows no default"


@pytest.mark.parametrize("command", [["master"], ["access"], ["agent"], ["agent", "enroll"]], ids=" ".join)
def test_every_daemon_takes_a_log_level(command):
    assert "--log-level" in idlegrid(*command, "--help").stdout


@pytest.mark.parametrize("before", [True, False], ids=["before enroll", "after enroll"])
def test_enroll_honours_the_state_dir_before_or_after_the_subcommand(tmp_path, before):
    state = tmp_path / "host-state"
    flags = ["--state-dir", str(state)]
    enroll = ["enroll", "--token", "igjt_x", "--access", "https://127.0.0.1:1", "--ca-file", str(tmp_path / "no-ca.crt")]
    done = idlegrid("agent", *flags, *enroll) if before else idlegrid("agent", *enroll, *flags)
    assert done.returncode == 2
    assert "ca.crt" in done.stderr and "Traceback" not in done.stderr
    assert state.is_dir(), "the state directory given was not the one used"


def test_the_not_enrolled_hint_names_every_flag_enroll_requires(tmp_path):
    state = tmp_path / "nowhere"
    done = idlegrid("agent", "--state-dir", str(state))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    hint = done.stderr
    for flag in ("idlegrid agent enroll", "--token", "--access", "--ca-file", f"--state-dir {state}"):
        assert flag in hint, f"{flag!r} missing from: {hint}"


def test_a_typo_in_simulate_is_one_line_naming_the_spec(tmp_path):
    done = idlegrid("agent", "--state-dir", str(tmp_path), "--simulate", "h1oo:8")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("idlegrid agent: --simulate: GPU simulation spec 'h1oo:8': unknown GPU model 'h1oo'")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("base", [IdlegridError, RuntimeError])
def test_an_error_class_with_an_exit_code_sets_the_exit_status(monkeypatch, capsys, base):
    certificate_revoked_like = type("CertificateRevokedLike", (base,), {"exit_code": 5})

    def revoked(args):
        raise certificate_revoked_like("certificate revoked: enroll again")

    monkeypatch.setattr(cli, "_run_token_create", revoked)
    assert cli.main(["token", "create", "--provider", "acme"]) == 5
    assert capsys.readouterr().err == "idlegrid token create: certificate revoked: enroll again\n"


def test_a_port_in_use_is_one_line_not_a_traceback(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = idlegrid(
            "master", "--state-dir", str(tmp_path), "--api-port", str(port), "--link-port", str(free_port()),
            "--links-port", str(free_port()),
        )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]  # the daemon's JSON log aside
    assert len(said) == 1, done.stderr
    assert said[0].startswith("idlegrid master: cannot listen") and "address already in use" in said[0] and str(port) in said[0]


def test_the_demo_names_a_port_in_use_in_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = idlegrid("demo", "--state-dir", str(tmp_path / "demo"), "--api-port", str(port))
    assert done.returncode == 2
    assert f"port {port} (the Master's API) is in use" in done.stderr and "Traceback" not in done.stderr


def test_an_agent_runs_with_the_same_https_url_it_enrolled_through(tmp_path):
    grid = Grid(tmp_path)
    try:
        grid.start_master()
        relay = grid.start_relay("relay-1", "eu-west")
        assert grid.enroll("host", relay).returncode == 0
        agent_id = grid.agent_id("host")
        daemon = grid.start_agent("host", "--access", relay.http_url)
        wait_for(lambda: grid.agent(agent_id)["state"] == "ready", 30, f"the agent to be ready\n{daemon.tail()}")
    finally:
        grid.stop()


def test_a_revoked_agent_stops_with_its_own_exit_status_and_says_to_enroll_again(tmp_path):
    """Needs the agent engineer's CertificateRevoked (agent/); until that is merged the agent retries forever."""
    grid = Grid(tmp_path)
    try:
        grid.start_master()
        grid.start_relay("relay-1", "eu-west")
        agent_id, daemon = grid.run_agent("host")
        status, _ = grid.call("POST", f"/api/v1/agents/{agent_id}/revoke")
        assert status == 200
        wait_for(lambda: not daemon.alive(), 30, f"the revoked agent to exit\n{daemon.tail()}")
        assert daemon.process.returncode not in (0, 1, 2, None)
        assert daemon.logged("certificate revoked: enroll again")
    finally:
        grid.stop()


def test_a_ca_file_that_is_not_a_certificate_is_one_line(tmp_path):
    not_a_cert = tmp_path / "ca.crt"
    not_a_cert.write_text("hello\n")
    done = idlegrid(
        "agent",
        "enroll",
        "--state-dir",
        str(tmp_path / "s"),
        "--token",
        "t",
        "--access",
        "https://127.0.0.1:1",
        "--ca-file",
        str(not_a_cert),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"idlegrid agent enroll: --ca-file {not_a_cert} is not a PEM certificate")


def test_enrolling_through_a_relays_agent_url_says_which_url_enrollment_needs(tmp_path):
    assert idlegrid("ca", "init", "--state-dir", str(tmp_path / "m")).returncode == 0
    ca = tmp_path / "m" / "pki" / "ca.crt"
    done = idlegrid(
        "agent",
        "enroll",
        "--state-dir",
        str(tmp_path / "s"),
        "--token",
        "t",
        "--access",
        f"wss://127.0.0.1:{free_port()}",
        "--ca-file",
        str(ca),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "looks like a relay's agent URL: enroll through its https:// URL" in done.stderr


def test_the_links_port_in_use_is_one_line_too(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = idlegrid(
            "master", "--state-dir", str(tmp_path), "--api-port", str(free_port()), "--link-port", str(free_port()),
            "--links-port", str(port),
        )  # fmt: skip
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert said[0].startswith("idlegrid master: cannot listen") and str(port) in said[0]
