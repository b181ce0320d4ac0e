"""``idlegrid ssh-key add FILE`` and ``idlegrid ssh-key add -`` (docs/ssh.md's first command) against a real Master's
API, through the CLI's own entry point, with the API key read from ``--key-file`` as the docs show it."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from management.cli import main as cli
from management.store import ssh_key_repo
from tests.management.hosts import api_key
from tests.management.test_api_ssh_keys import openssh_fingerprint, openssh_public


@pytest.fixture
async def ana(api, tmp_path: Path):
    """``run(*argv, stdin=)`` runs ``idlegrid ARGV`` as renter ana (her API key in a file); (exit status, out, err)."""
    key_file = tmp_path / "ana.key"
    key_file.write_text((await api_key(api.master, "renter", "ana"))["Authorization"].removeprefix("Bearer "))
    url = str(api.make_url("")).rstrip("/")

    async def run(*argv: str, capsys: pytest.CaptureFixture[str], monkeypatch=None, stdin: str = "") -> tuple[int, str, str]:
        capsys.readouterr()
        if monkeypatch is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        code = await asyncio.to_thread(cli.main, [*argv, "--api", url, "--key-file", str(key_file)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_ssh_key_add_takes_a_public_key_file_beside_the_api_key_file(ana, api, tmp_path, capsys):
    line = openssh_public(ed25519.Ed25519PrivateKey.generate(), "ana@laptop")
    public = tmp_path / "id_ed25519.pub"
    public.write_text(line + "\n")

    code, out, err = await ana("ssh-key", "add", str(public), capsys=capsys)

    assert code == 0, err
    assert out.startswith("added sshk-") and f"(ana@laptop) {openssh_fingerprint(line)} for ana" in out
    [stored] = await ssh_key_repo(api.master.store).list(account="ana")
    assert stored.fingerprint == openssh_fingerprint(line)
    code, out, err = await ana("ssh-key", "list", capsys=capsys)
    assert code == 0 and openssh_fingerprint(line) in out, err


async def test_ssh_key_add_dash_reads_the_public_key_from_standard_input(ana, api, capsys, monkeypatch):
    line = openssh_public(ed25519.Ed25519PrivateKey.generate(), "ci-runner")

    code, out, err = await ana("ssh-key", "add", "-", "--name", "ci", capsys=capsys, monkeypatch=monkeypatch, stdin=line)

    assert code == 0, err
    assert f"(ci) {openssh_fingerprint(line)} for ana" in out
    assert [k.name for k in await ssh_key_repo(api.master.store).list(account="ana")] == ["ci"]


async def test_ssh_key_add_of_a_missing_file_says_so(ana, tmp_path, capsys):
    code, _, err = await ana("ssh-key", "add", str(tmp_path / "nope.pub"), capsys=capsys)
    assert code != 0 and "nope.pub: no such file" in err
