"""``idlegrid whoami`` and ``idlegrid account ...`` against a real Master with its API (in a thread of this process),
run through the CLI's own entry point: human tables by default, ``--json`` for scripts, the key found where the
documented order says."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from management.app import MasterServer
from management.cli import main as cli
from management.cli.connection import Credentials, cli_config_path, resolve_credentials
from master.config import MasterConfig


class ServedMaster:
    """A MasterServer on its own event loop in a thread, so the blocking CLI can call it from the test's thread."""

    def __init__(self, state_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = MasterServer(MasterConfig(state_dir=str(state_dir), link_port=0, api_port=0))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServedMaster:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def served(tmp_path, monkeypatch) -> Iterator[ServedMaster]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no CLI config file unless a test writes one
    monkeypatch.delenv("IDLEGRID_API_KEY", raising=False)
    monkeypatch.delenv("IDLEGRID_API", raising=False)
    with ServedMaster(tmp_path / "master") as served:
        yield served


@pytest.fixture
def idlegrid(served, capsys):
    """Runs ``idlegrid ARGS`` as the bootstrap operator (its key file) unless the args name another key."""

    def run(*args: str, ok: bool = True) -> str:
        argv = [*args, "--api", served.server.api_url]
        if "--api-key" not in args:
            argv += ["--operator-token-file", str(served.server.operator_token_file)]
        status = cli.main(argv)
        out, err = capsys.readouterr()
        assert (status == 0) == ok, err
        return out if ok else err

    return run


def test_an_operator_creates_lists_shows_and_updates_accounts(idlegrid):
    created = idlegrid("account", "create", "acme", "--role", "provider", "--name", "Acme GPUs", "--gpu-quota", "8")
    assert created.splitlines()[0].split() == [
        "ID",
        "ROLE",
        "NAME",
        "SHARE",
        "GPU",
        "QUOTA",
        "TIER",
        "QUOTAS",
        "STATUS",
        "CREATED",
    ]
    assert created.splitlines()[1].split()[:7] == ["acme", "provider", "Acme", "GPUs", "1", "8", "-"]
    idlegrid("account", "create", "bob", "--role", "renter", "--tier-quota", "h100=2", "--project-share", "vision=3")
    listed = idlegrid("account", "list", "--role", "renter")
    assert [line.split()[0] for line in listed.splitlines()] == ["ID", "bob"]
    assert "h100=2" in listed
    shown = json.loads(idlegrid("account", "get", "bob", "--json"))
    assert (shown["tier_quotas"], shown["project_shares"]) == ({"h100": 2}, {"vision": 3.0})
    updated = json.loads(idlegrid("account", "update", "acme", "--gpu-quota", "none", "--disable", "--json"))
    assert (updated["gpu_quota"], updated["disabled"], updated["name"]) == (None, True, "Acme GPUs")
    assert "nothing to change" in idlegrid("account", "update", "acme", ok=False)


def test_an_account_key_is_created_used_listed_and_revoked_from_the_command_line(idlegrid):
    idlegrid("account", "create", "bob", "--role", "renter")
    issued = json.loads(idlegrid("account", "key", "create", "bob", "--name", "laptop", "--json"))
    key = issued["key"]
    me = idlegrid("whoami", "--api-key", key)
    assert me.splitlines()[:2] == ["account   bob (renter)", f"key       {issued['key_id']} (laptop)"]
    assert "key from  --api-key" in me
    own = idlegrid("account", "key", "list", "bob", "--api-key", key)
    assert issued["key_id"] in own and key not in own
    assert "revoked " + issued["key_id"] in idlegrid("account", "key", "revoke", issued["key_id"], "--api-key", key)
    refused = idlegrid("whoami", "--api-key", key, ok=False)
    assert "401 unauthorized" in refused and "revoked" in refused and "Traceback" not in refused


def test_the_human_key_output_shows_the_key_once_and_says_so(idlegrid):
    idlegrid("account", "create", "bob", "--role", "renter")
    out = idlegrid("account", "key", "create", "bob", "--name", "ci")
    assert "shown this once" in out and "igak_" in out


def test_a_bad_account_id_is_one_line_naming_the_field(idlegrid):
    err = idlegrid("account", "create", "Not Valid", "--role", "renter", ok=False)
    assert err.startswith("idlegrid account create: 400 bad_request: id:") and len(err.splitlines()) == 1


# --- where the key comes from: flag > env > file > operator key file ------------------------------------------


def namespace(api_key: str | None, token_file: Path, api: str | None = None):
    import argparse

    return argparse.Namespace(api=api, api_key=api_key, operator_token_file=token_file)


def test_the_key_comes_from_the_flag_then_the_environment_then_the_config_file_then_the_operator_key(tmp_path):
    token_file = tmp_path / "operator.token"
    token_file.write_text("igak_operator\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    config = cli_config_path(env)
    config.parent.mkdir(parents=True)
    config.write_text('api = "http://grid.example:7000"\napi_key = "igak_file"\n')
    with_env = env | {"IDLEGRID_API_KEY": "igak_env"}
    assert resolve_credentials(namespace("igak_flag", token_file), with_env).api_key == "igak_flag"
    assert resolve_credentials(namespace(None, token_file), with_env) == Credentials(
        "http://grid.example:7000", "igak_env", "IDLEGRID_API_KEY"
    )
    assert resolve_credentials(namespace(None, token_file), env).api_key == "igak_file"
    assert resolve_credentials(namespace(None, token_file, api="http://other:1"), env).api == "http://other:1"
    config.unlink()
    assert resolve_credentials(namespace(None, token_file), env) == Credentials(
        "http://127.0.0.1:7000", "igak_operator", str(token_file)
    )
    token_file.unlink()
    with pytest.raises(Exception, match="no API key: pass --api-key"):
        resolve_credentials(namespace(None, token_file), env)


def test_a_config_file_with_an_unknown_setting_is_named(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    cli_config_path(env).parent.mkdir(parents=True)
    cli_config_path(env).write_text('apikey = "x"\n')
    with pytest.raises(Exception, match="unknown setting"):
        resolve_credentials(namespace(None, tmp_path / "none"), env)


def test_every_command_group_takes_a_key_by_flag_or_by_file(tmp_path, capsys):
    key_file = tmp_path / "key"
    key_file.write_text("igak_from_file\n")
    args = argparse.Namespace(api=None, api_key=None, key_file=key_file, operator_token_file=tmp_path / "none")
    assert resolve_credentials(args, {"IDLEGRID_API_KEY": "igak_env"}).api_key == "igak_from_file"
    args.api_key = "igak_flag"
    assert resolve_credentials(args, {}).api_key == "igak_flag"
    for group in (["account", "list"], ["workload", "list"]):
        with pytest.raises(SystemExit):
            cli.main([*group, "--help"])
        usage = capsys.readouterr().out
        assert "--api-key KEY" in usage and "--key-file FILE" in usage, group


def test_a_password_is_set_from_standard_input_and_changing_ones_own_needs_the_current_one(idlegrid, monkeypatch):
    idlegrid("account", "create", "bob", "--role", "renter")
    monkeypatch.setattr("sys.stdin", io.StringIO("first-password-1\n"))
    out = idlegrid("account", "password", "bob", "--stdin")
    assert out.startswith("password set for bob (renter): sign in to the console at http://")
    assert "first-password-1" not in out
    key = json.loads(idlegrid("account", "key", "create", "bob", "--name", "laptop", "--json"))["key"]
    monkeypatch.setattr("sys.stdin", io.StringIO("second-password-2\n"))
    refused = idlegrid("account", "password", "bob", "--stdin", "--api-key", key, ok=False)
    assert "current_password" in refused and "Traceback" not in refused
    monkeypatch.setattr("sys.stdin", io.StringIO("second-password-2\nfirst-password-1\n"))
    assert "password set for bob" in idlegrid("account", "password", "bob", "--stdin", "--current", "--api-key", key)


def test_a_password_is_asked_twice_and_differing_answers_change_nothing(idlegrid, monkeypatch):
    idlegrid("account", "create", "bob", "--role", "renter")
    answers = iter(["typed-once-here-1", "typed-differently"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert "the two passwords differ" in idlegrid("account", "password", "bob", ok=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("too-short\n"))
    assert "at least 12 characters" in idlegrid("account", "password", "bob", "--stdin", ok=False)
