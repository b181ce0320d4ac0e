"""``idlegrid endpoint create|list|get|update|delete|keys`` against a real Master's API, through the CLI's own entry
point, as renter ana with her API key in a file (docs/endpoints.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from management.cli import main as cli
from management.http.keys import SERVICES_KEY
from management.services.endpoints import InvocationForbidden, InvocationRefused
from management.store import endpoint_repo
from tests.management.hosts import api_key


@pytest.fixture
async def ana(api, tmp_path: Path):
    """``run(*argv)`` runs ``idlegrid ARGV`` as renter ana; (exit status, stdout, stderr)."""
    key_file = tmp_path / "ana.key"
    key_file.write_text((await api_key(api.master, "renter", "ana"))["Authorization"].removeprefix("Bearer "))
    url = str(api.make_url("")).rstrip("/")

    async def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        at = argv.index("--") if "--" in argv else len(argv)  # the options go before a worker's command
        line = [*argv[:at], "--api", url, "--key-file", str(key_file), *argv[at:]]
        code = await asyncio.to_thread(cli.main, line)
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_create_list_get_update_and_delete_an_endpoint(ana, api, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REGISTRY_TOKEN", "registry-secret")
    code, out, err = await ana(
        "endpoint", "create", "--name", "echo", "--image", "ghcr.io/acme/echo:1", "--gpus", "1", "--model", "h100-sxm",
        "--env", "MODE=fast", "--registry-user", "ci", "--registry-password-env", "REGISTRY_TOKEN",
        "--max-workers", "4", "--concurrency", "2", "--ttl-s", "600",
        "--", "python", "handler.py",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    [stored] = await endpoint_repo(api.master.store).list(account="ana")
    assert out.startswith(f"endpoint {stored.id} created\n")
    assert "command:     python handler.py" in out and "gpus:        1 x h100-sxm" in out
    assert "env:         MODE" in out and "fast" not in out  # names only
    assert "registry:    user ci" in out and "registry-secret" not in out
    assert "workers:     0..4 (idle ones stop after 60 s)" in out
    assert "concurrency: 2 request(s) per worker" in out
    assert "requests:    600 s per attempt, 600 s in all, 3 retries after a lost worker" in out
    assert stored.spec.scaling.max_workers == 4 and stored.spec.env == {"MODE": "fast"}

    code, out, err = await ana("endpoint", "list", capsys=capsys)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "ACCOUNT", "IMAGE", "GPUS", "WORKERS", "CONCURRENCY", "CREATED"]
    assert row.split()[:4] == [stored.id, "echo", "ana", "ghcr.io/acme/echo:1"] and "0..4" in row

    code, out, err = await ana("endpoint", "update", stored.id, "--max-workers", "8", "--min-workers", "1", capsys=capsys)
    assert code == 0, err
    assert out.startswith(f"endpoint {stored.id} updated\n") and "workers:     1..8" in out
    updated = await endpoint_repo(api.master.store).get(stored.id)
    assert updated is not None and updated.spec.scaling.concurrency == 2 and updated.spec.env == {"MODE": "fast"}

    code, out, err = await ana("endpoint", "get", stored.id, "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["spec"]["scaling"]["min_workers"] == 1

    code, out, err = await ana("endpoint", "delete", stored.id, capsys=capsys)
    assert code == 0 and out == f"endpoint {stored.id} deleted, and its keys\n", err
    code, out, err = await ana("endpoint", "list", capsys=capsys)
    assert code == 0 and out == "no endpoint\n"


async def test_a_load_balanced_endpoint_from_flags_shows_its_mode_and_url_and_bad_flags_are_refused(ana, api, capsys):
    code, out, err = await ana(
        "endpoint", "create", "--name", "llm", "--image", "ghcr.io/acme/vllm:1", "--max-workers", "2",
        "--mode", "load-balanced", "--http-port", "8080", "--readiness-path", "/v1/models", "--max-hold-s", "30",
        "--", "vllm", "serve",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    [stored] = await endpoint_repo(api.master.store).list(account="ana")
    spec = stored.spec
    assert (spec.mode, spec.http_port, spec.readiness_path, spec.max_hold_s) == ("load_balanced", 8080, "/v1/models", 30.0)
    assert "mode:        load-balanced: port 8080, ready when /v1/models answers 200" in out
    assert "held:        up to 256 requests for 30 s while no worker is ready" in out
    assert f"/e/{stored.id}/" in next(line for line in out.splitlines() if line.startswith("url:"))

    code, out, err = await ana("endpoint", "update", stored.id, "--mode", "queue", capsys=capsys)
    assert code == 0 and "mode:        queue" in out and "url:" not in out, err
    code, _, err = await ana("endpoint", "update", stored.id, "--readiness-path", "health", capsys=capsys)
    assert code != 0 and "readiness_path must be an absolute path" in err
    code, _, err = await ana("endpoint", "update", stored.id, "--http-port", "70000", capsys=capsys)
    assert code != 0 and "http_port" in err
    with pytest.raises(SystemExit):  # argparse's own refusal: the choices are named in its message
        await ana("endpoint", "update", stored.id, "--mode", "round-robin", capsys=capsys)
    assert "invalid choice: 'round-robin'" in capsys.readouterr().err


async def test_a_spec_file_and_flags_over_it(ana, api, tmp_path, capsys):
    spec = tmp_path / "echo.toml"
    spec.write_text(
        'name = "echo"\nimage = "none"\ncommand = ["python", "handler.py"]\n'
        "[constraints]\nallow_process_runtime = true\n[scaling]\nmax_workers = 2\nidle_timeout_s = 30\n"
    )
    code, out, err = await ana("endpoint", "create", "-f", str(spec), "--max-workers", "3", capsys=capsys)
    assert code == 0, err
    assert "image:       none (process runtime)" in out and "workers:     0..3 (idle ones stop after 30 s)" in out


async def test_bad_input_is_refused_with_what_to_change(ana, api, capsys):
    code, _, err = await ana("endpoint", "create", "--name", "echo", "--image", "x", "--min-workers", "3", capsys=capsys)
    assert code != 0 and "min_workers (3) must not exceed max_workers (1)" in err
    code, _, err = await ana("endpoint", "create", "--image", "x", capsys=capsys)
    assert code != 0 and "name: give --name, or put name in a spec file (-f)" in err
    code, _, err = await ana("endpoint", "create", "--name", "e", "--image", "x", "--env", "TOKEN", capsys=capsys)
    assert code != 0 and "--env 'TOKEN': write it as KEY=VALUE" in err
    code, _, err = await ana("endpoint", "update", "ep-0000", capsys=capsys)
    assert code != 0 and "nothing to change" in err
    code, _, err = await ana("endpoint", "get", "ep-0000", capsys=capsys)
    assert code != 0 and "no endpoint 'ep-0000'" in err
    assert await endpoint_repo(api.master.store).list() == []


async def test_invocation_keys_are_made_listed_and_revoked(ana, api, capsys):
    code, out, err = await ana("endpoint", "create", "--name", "echo", "--image", "x", capsys=capsys)
    assert code == 0, err
    [endpoint] = await endpoint_repo(api.master.store).list()

    code, out, err = await ana("endpoint", "keys", "create", endpoint.id, "--name", "ci", capsys=capsys)
    assert code == 0, err
    first, key, note = out.splitlines()
    assert first.startswith("invocation key epk-") and first.endswith(f"(ci) for endpoint {endpoint.id}:")
    assert key.startswith("igek_") and "shown this once" in note
    key_id = first.split()[2]
    invocation = await api.app[SERVICES_KEY].endpoints.authorize_invocation(endpoint.id, key)
    assert invocation.key.id == key_id

    code, out, err = await ana("endpoint", "keys", "list", endpoint.id, capsys=capsys)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "CREATED", "REVOKED"] and row.split()[:2] == [key_id, "ci"]
    assert row.split()[-1] == "-" and key not in out

    code, out, err = await ana("endpoint", "keys", "revoke", endpoint.id, key_id, capsys=capsys)
    assert code == 0 and out.startswith(f"invocation key {key_id} revoked ("), err
    with pytest.raises(InvocationRefused):
        await api.app[SERVICES_KEY].endpoints.authorize_invocation(endpoint.id, key)
    code, _, err = await ana("endpoint", "list", "--api-key", key, capsys=capsys)
    assert code != 0  # an invocation key is no API key

    other = await api.app[SERVICES_KEY].endpoints.create_key(endpoint.id, "x")
    with pytest.raises(InvocationForbidden):
        await api.app[SERVICES_KEY].endpoints.authorize_invocation("ep-other", other.key)
