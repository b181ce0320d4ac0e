"""``idlegrid secret ...`` and the storage flags of ``workload submit`` against a real Master's API."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from management.cli import main as cli
from tests.management.hosts import api_key
from tests.support.stored import stored_workload


@pytest.fixture
async def alice(api, tmp_path: Path):
    """``run(*argv, stdin=)`` runs ``idlegrid ARGV`` as renter alice; returns (exit status, stdout, stderr)."""
    key_file = tmp_path / "alice.key"
    key_file.write_text((await api_key(api.master, "renter", "alice"))["Authorization"].removeprefix("Bearer "))
    url = str(api.make_url("")).rstrip("/")

    async def run(*argv: str, capsys: pytest.CaptureFixture[str], monkeypatch=None, stdin: str = "") -> tuple[int, str, str]:
        capsys.readouterr()
        if monkeypatch is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        command = [*argv[:2], "--api", url, "--key-file", str(key_file), *argv[2:]]
        code = await asyncio.to_thread(cli.main, command)
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_a_secret_is_read_from_stdin_or_a_variable_listed_by_name_and_deleted(alice, api, capsys, monkeypatch):
    code, out, err = await alice("secret", "create", "s3", capsys=capsys, monkeypatch=monkeypatch, stdin="AKIA:very-secret\n")
    assert code == 0, err
    assert out.strip() == "secret s3 stored (16 bytes)"
    monkeypatch.setenv("HF", "hf_token_value")
    code, out, err = await alice("secret", "create", "hf", "--from-env", "HF", capsys=capsys)
    assert code == 0, err
    code, out, _ = await alice("secret", "list", capsys=capsys)
    assert [line.split()[:2] for line in out.splitlines()] == [["NAME", "BYTES"], ["hf", "14"], ["s3", "16"]]
    assert "very-secret" not in out and "hf_token_value" not in out
    assert await api.master.secrets.resolve("alice", ["s3"]) == {"s3": "AKIA:very-secret"}  # the newline dropped
    code, out, err = await alice("secret", "create", "s3", capsys=capsys, monkeypatch=monkeypatch, stdin="again")
    assert code != 0 and "delete it first" in err
    code, out, _ = await alice("secret", "delete", "hf", capsys=capsys)
    assert (code, out.strip()) == (0, "secret hf deleted")


async def test_submit_takes_storage_flags_and_get_shows_where_the_data_lives(alice, api, capsys, monkeypatch):
    await alice("secret", "create", "s3", capsys=capsys, monkeypatch=monkeypatch, stdin="AKIA:k")
    code, out, err = await alice(
        "workload", "submit", "--name", "train", "--image", "none",
        "--input", "s3://datasets/mnist/:/data", "--output", "s3://runs/out/:/out",
        "--checkpoint", "s3://runs/ck/", "--checkpoint-period", "60", "--storage-credentials", "s3",
        "--storage-endpoint", "https://s3.eu-central-1.amazonaws.com", "--stop-grace", "90", "--env", "TOKEN=${secret:s3}",
        "--", "python", "train.py", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    workload_id = out.split()[1]
    spec = (await stored_workload(api.master.store, workload_id)).spec
    assert spec.checkpoint is not None and spec.storage is not None
    assert spec.checkpoint.uri == "s3://runs/ck/" and spec.checkpoint.path == "/checkpoint" and spec.checkpoint.period_s == 60
    assert spec.storage.endpoint == "https://s3.eu-central-1.amazonaws.com"
    assert spec.stop_grace_s == 90 and spec.storage.credentials == "s3" and spec.env == {"TOKEN": "${secret:s3}"}
    code, out, _ = await alice("workload", "get", workload_id, capsys=capsys)
    assert "input:       s3://datasets/mnist/ -> /data" in out
    assert "output:      /out -> s3://runs/out/" in out
    assert "checkpoint:  /checkpoint <-> s3://runs/ck/" in out
    assert "last checkpoint: none yet" in out

    code, _, err = await alice("workload", "submit", "--name", "x", "--image", "none", "--input", "s3://b/k", capsys=capsys)
    assert code != 0 and "--input 's3://b/k': write it as s3://BUCKET/KEY:/path/in/container" in err
    code, _, err = await alice(
        "workload", "submit", "--name", "y", "--image", "none", "--checkpoint", "s3://runs/c/", "--storage-credentials", "nope",
        capsys=capsys,
    )  # fmt: skip
    assert code != 0 and "no secret named 'nope'" in err
