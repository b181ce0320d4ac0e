"""`idlegrid master backup` / `restore` (master/backup.py, docs/backup.md), on a real Master on SQLite.

A Master runs in this process with agents, their (simulated: no GPU here) GPUs, a workload and ledger entries, and
a writer appends events all through the backup; the archive is restored into a new state directory, a second Master
is started there, and it must hold the same agents, GPUs, workloads, ledger and balances, under the same CA.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import stat
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from common.pki import CertRole, load_cert, verify_issued_by
from management.app import MasterServer
from management.cli.main import main
from management.client.api import AsyncApiClient
from management.store import ledger_repo, workload_repo
from master.accounts import AccountRole
from master.backup import MANIFEST, STORE_FILE
from master.config import MasterConfig
from master.records import EventRecord
from master.store.migrations import LATEST_VERSION, migrate_sqlite
from tests.management.hosts import add_agent


def config(state_dir: Path) -> MasterConfig:
    return MasterConfig(state_dir=str(state_dir), link_port=0, api_port=0)


async def started(state_dir: Path) -> MasterServer:
    server = MasterServer(config(state_dir))
    await server.start()
    return server


async def seed(server: MasterServer) -> str:
    """Two providers' hosts with their GPUs, a renter with a credit, a workload: returns the workload's id."""
    # Container hosts, since a workload that no host could ever run is refused at submit; drained, so the workload
    # waits in the queue and the state stays as it is while the test backs it up and compares.
    await add_agent(server.master, "agent-a", "h100:2", provider="prov-a", runtime="docker", isolation="container")
    await add_agent(server.master, "agent-b", "a10:1", provider="prov-b", runtime="docker", isolation="container")
    await server.master.accounts.ensure("rita", AccountRole("renter"))
    await server.services.market.credit("rita", 25_000_000, "welcome", key="credit:rita:1")
    await server.services.market.credit("rita", 5_000_000, "top-up", key="credit:rita:2")
    operator_key = server.operator_token_file.read_text().strip()
    async with AsyncApiClient(server.api_url, operator_key) as client:
        for host in ("agent-a", "agent-b"):
            await client.drain(host)
        workload = await client.submit_workload({"name": "train", "image": "busybox"}, account="rita")
    return str(workload["id"])


async def state_of(server: MasterServer) -> dict[str, Any]:
    """What must survive a backup and restore, as the store holds it."""
    store = server.master.store
    return {
        "agents": [(a.id, a.provider, a.state) for a in await store.agents.list()],
        "gpus": sorted((g.uuid, g.agent_id, g.model) for g in await store.gpus.list()),
        "workloads": [(w.id, w.account, w.spec.name, w.state) for w in await workload_repo(store).list()],
        "ledger": [
            (e.seq, e.key, e.kind, [(line.account, line.amount) for line in e.lines]) for e in await ledger_repo(store).list()
        ],
        "balances": await ledger_repo(store).balances(),
        "accounts": sorted(a.id for a in await store.accounts.list()),
    }


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[MasterServer]:
    server = await started(tmp_path / "old")
    yield server
    await server.stop()


async def cli(*argv: str | Path) -> int:
    """The command line, off the event loop: the Master in this process keeps serving while it runs."""
    return await asyncio.to_thread(main, [str(a) for a in argv])


# --- a backup of a running, writing Master, restored into a new one -------------------------------------------------


async def test_a_backup_taken_while_the_master_writes_restores_into_a_master_with_the_same_state(
    running: MasterServer, tmp_path: Path
) -> None:
    await seed(running)
    await running.master.secrets.create("rita", "s3", "AKIA:rita-secret")  # sealed with the Master's secrets.key
    agent_key, agent_cert = running.master.authority.ca.issue_keypair(CertRole.AGENT, "agent-a", valid_s=3600)
    events = running.master.store.events
    writes = {"before": 0, "done": 0}
    stop = asyncio.Event()

    async def keep_writing() -> None:
        while not stop.is_set():
            await events.append(EventRecord(ts=time.time(), kind="test.write", subject=f"w-{writes['done']}"))
            writes["done"] += 1

    writer = asyncio.create_task(keep_writing())
    while writes["done"] < 20:  # the writer is well under way before the backup starts
        await asyncio.sleep(0.01)
    writes["before"] = writes["done"]
    archive = tmp_path / "backup.tar.gz"
    assert await cli("master", "backup", "--state-dir", running.config.state_dir, "--out", archive) == 0
    after_backup = writes["done"]
    stop.set()
    await writer
    assert after_backup > writes["before"], "the writer went on during the backup"
    expected = await state_of(running)
    assert expected["balances"]["renter:rita"] == 30_000_000
    async with AsyncApiClient(running.api_url, running.operator_token_file.read_text().strip()) as client:
        rita = await client.balance("rita")
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600

    restored_dir = tmp_path / "new"
    assert await cli("master", "restore", "--from", archive, "--state-dir", restored_dir) == 0
    restored = await started(restored_dir)
    try:
        assert await state_of(restored) == expected
        # The copy is the store as of one commit: its test events are a whole prefix of what the writer wrote.
        copied = [e.subject for e in await restored.master.store.events.list(kind_prefix="test.write", limit=100_000)]
        assert writes["before"] <= len(copied) <= after_backup
        assert copied == [f"w-{i}" for i in range(len(copied))]
        # The same CA: a certificate the old Master issued verifies against the new one's, so agents reconnect.
        assert restored.master.authority.ca_file.read_bytes() == running.master.authority.ca_file.read_bytes()
        verify_issued_by(load_cert(agent_cert), restored.master.authority.ca.cert)
        assert restored.master.authority.signer.key_id == running.master.authority.signer.key_id
        # The same secrets key: the renters' secrets open on the restored Master.
        assert await restored.master.secrets.resolve("rita", ["s3"]) == {"s3": "AKIA:rita-secret"}
        # The operator's key still works on the restored Master.
        operator_key = (restored_dir / "operator.token").read_text().strip()
        assert operator_key == running.operator_token_file.read_text().strip()
        async with AsyncApiClient(restored.api_url, operator_key) as client:
            assert await client.balance("rita") == rita
    finally:
        await restored.stop()
    assert agent_key  # issued with its key, as an agent's would be


async def test_restored_files_keep_their_modes(running: MasterServer, tmp_path: Path) -> None:
    archive = tmp_path / "backup.tar.gz"
    assert await cli("master", "backup", "--state-dir", running.config.state_dir, "--out", archive) == 0
    target = tmp_path / "new"
    assert await cli("master", "restore", "--from", archive, "--state-dir", target) == 0
    mode = lambda p: stat.S_IMODE((target / p).stat().st_mode)  # noqa: E731
    assert mode(STORE_FILE) == 0o600
    assert mode("pki") == 0o700
    assert mode("pki/ca.key") == 0o600 and mode("pki/master.key") == 0o600
    # As they were in the running Master's state directory: every file there is 0600 (master/private_state.py).
    assert mode("pki/ca.crt") == 0o600 and mode("pki/master.crt") == 0o600
    assert mode("operator.token") == 0o600
    assert mode("pki/secrets.key") == 0o600


async def test_an_offline_store_is_backed_up_too(tmp_path: Path) -> None:
    server = await started(tmp_path / "old")
    await seed(server)
    expected = await state_of(server)
    await server.stop()
    archive = tmp_path / "offline.tar.gz"
    # The state directory found as the Master finds it: given before the subcommand, or by the Master's --config.
    assert await cli("master", "--state-dir", tmp_path / "old", "backup", "--out", archive) == 0
    settings = tmp_path / "master.toml"
    settings.write_text(f'state_dir = "{tmp_path / "new"}"\n')
    assert await cli("master", "restore", "--from", archive, "--config", settings) == 0
    restored = await started(tmp_path / "new")
    try:
        assert await state_of(restored) == expected
    finally:
        await restored.stop()


async def test_pki_only_holds_the_keys_and_no_store(running: MasterServer, tmp_path: Path) -> None:
    archive = tmp_path / "pki.tar.gz"
    assert await cli("master", "backup", "--pki-only", "--state-dir", running.config.state_dir, "--out", archive) == 0
    manifest, names = read_archive(archive)
    assert manifest["store"] == "none" and manifest["schema_version"] is None
    assert STORE_FILE not in names and {"pki/ca.crt", "pki/ca.key", "pki/master.key"} <= names
    target = tmp_path / "new"
    assert await cli("master", "restore", "--from", archive, "--state-dir", target) == 0
    assert (target / "pki/ca.key").read_bytes() == (running.config.state_path / "pki/ca.key").read_bytes()
    assert not (target / STORE_FILE).exists()
    # Forced over a directory with a store, the keys are replaced and the store is kept: the archive has none.
    (target / "pki/ca.key").write_bytes(b"another CA's key")
    (target / STORE_FILE).write_bytes(b"the store here")
    assert await cli("master", "restore", "--from", archive, "--state-dir", target, "--force") == 0
    assert (target / "pki/ca.key").read_bytes() == (running.config.state_path / "pki/ca.key").read_bytes()
    assert (target / STORE_FILE).read_bytes() == b"the store here"


async def test_an_older_schema_is_restored_and_migrated_when_the_master_starts(tmp_path: Path) -> None:
    old = tmp_path / "old"
    server = await started(old)
    await server.stop()
    (old / STORE_FILE).unlink()
    import sqlite3

    conn = sqlite3.connect(old / STORE_FILE, isolation_level=None)
    migrate_sqlite(conn, up_to=5)
    conn.close()
    archive = tmp_path / "v5.tar.gz"
    assert await cli("master", "backup", "--state-dir", old, "--out", archive) == 0
    assert read_archive(archive)[0]["schema_version"] == 5
    assert await cli("master", "restore", "--from", archive, "--state-dir", tmp_path / "new") == 0
    restored = await started(tmp_path / "new")
    try:
        assert await restored.master.store.schema_version() == LATEST_VERSION
    finally:
        await restored.stop()


# --- refusals: each one line, a nonzero exit, nothing written ------------------------------------------------------


@pytest.fixture
async def archive(running: MasterServer, tmp_path: Path) -> Path:
    await seed(running)
    path = tmp_path / "backup.tar.gz"
    assert await cli("master", "backup", "--state-dir", running.config.state_dir, "--out", path) == 0
    return path


async def refused(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    capsys.readouterr()
    code = await cli(*argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


async def test_an_existing_out_is_not_overwritten_without_force(
    archive: Path, running: MasterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = archive.read_bytes()
    err = await refused(capsys, "master", "backup", "--state-dir", running.config.state_dir, "--out", archive)
    assert err.startswith("idlegrid master backup: ") and "already exists; pass --force" in err
    assert archive.read_bytes() == before
    assert await cli("master", "backup", "--state-dir", running.config.state_dir, "--out", archive, "--force") == 0


async def test_a_truncated_archive_is_refused(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    err = await refused(capsys, "master", "restore", "--from", truncated, "--state-dir", tmp_path / "new")
    assert err.startswith("idlegrid master restore: ") and "truncated or corrupted" in err
    assert not (tmp_path / "new" / STORE_FILE).exists()


async def test_a_corrupted_archive_is_refused(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupted = tmp_path / "corrupted.tar.gz"
    corrupted.write_bytes(bytes(data))
    err = await refused(capsys, "master", "restore", "--from", corrupted, "--state-dir", tmp_path / "new")
    assert "corrupted" in err  # found by gzip's or tar's checks, or by a member's checksum: whichever comes first
    assert not (tmp_path / "new" / STORE_FILE).exists()
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"not an archive at all\n")
    assert "not a readable idlegrid backup" in await refused(
        capsys, "master", "restore", "--from", garbage, "--state-dir", tmp_path / "new"
    )


async def test_a_file_that_does_not_match_its_checksum_is_refused(
    archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    altered = rewrite(archive, tmp_path / "altered.tar.gz", change={"pki/ca.crt": lambda body: body.replace(b"A", b"B", 1)})
    err = await refused(capsys, "master", "restore", "--from", altered, "--state-dir", tmp_path / "new")
    assert "pki/ca.crt does not match its checksum" in err
    assert not (tmp_path / "new" / "pki").exists(), "nothing of a refused archive is left in the target"


async def test_a_schema_newer_than_this_idlegrid_is_refused(
    archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = rewrite(archive, tmp_path / "newer.tar.gz", manifest={"schema_version": LATEST_VERSION + 1})
    err = await refused(capsys, "master", "restore", "--from", newer, "--state-dir", tmp_path / "new")
    assert f"schema version {LATEST_VERSION + 1}, newer than this idlegrid understands ({LATEST_VERSION})" in err


async def test_a_file_the_manifest_does_not_list_is_refused(
    archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    altered = rewrite(archive, tmp_path / "extra.tar.gz", extra={"../escape": b"x"})
    err = await refused(capsys, "master", "restore", "--from", altered, "--state-dir", tmp_path / "new")
    assert "which its manifest does not list" in err
    assert not (tmp_path / "escape").exists()


async def test_a_target_that_is_not_empty_is_refused_unless_forced(
    archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "used"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    err = await refused(capsys, "master", "restore", "--from", archive, "--state-dir", target)
    assert f"{target} is not empty" in err and "--force" in err
    (target / "master.db-wal").write_bytes(b"a stale WAL that must not be replayed over the restored store")
    assert await cli("master", "restore", "--from", archive, "--state-dir", target, "--force") == 0
    assert not (target / "master.db-wal").exists()
    assert (target / "notes.txt").read_text() == "mine", "files that are no part of the Master's state are left alone"


async def test_a_state_dir_a_master_runs_on_is_refused_even_with_force(
    archive: Path, running: MasterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    state = running.config.state_path
    before = (state / "pki/ca.crt").read_bytes()
    err = await refused(capsys, "master", "restore", "--from", archive, "--state-dir", state, "--force")
    assert "a Master is running on" in err and "stop it before restoring" in err
    assert (state / "pki/ca.crt").read_bytes() == before


async def test_a_master_on_mongodb_is_told_to_use_mongodump(
    running: MasterServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = await refused(
        capsys,
        "master",
        "backup",
        "--state-dir",
        running.config.state_dir,
        "--store-url",
        "mongodb://127.0.0.1:1/idlegrid",
        "--out",
        tmp_path / "x.tar.gz",
    )
    assert "mongodump" in err and "--pki-only" in err
    assert not (tmp_path / "x.tar.gz").exists()


async def test_a_directory_with_no_ca_is_not_backed_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    err = await refused(capsys, "master", "backup", "--state-dir", tmp_path / "empty", "--out", tmp_path / "x.tar.gz")
    assert "no CA in" in err and "the Master's state directory?" in err


# --- helpers -------------------------------------------------------------------------------------------------------


def read_archive(path: Path) -> tuple[dict[str, Any], set[str]]:
    with tarfile.open(path, "r:gz") as tar:
        members = tar.getmembers()
        body = tar.extractfile(members[0])
        assert members[0].name == MANIFEST and body is not None
        return json.loads(body.read()), {m.name for m in members[1:]}


def rewrite(
    source: Path,
    target: Path,
    *,
    change: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
    extra: dict[str, bytes] | None = None,
) -> Path:
    """A copy of the archive ``source`` with members' bodies changed, the manifest's fields replaced or members added
    (the manifest's checksums left as they were)."""
    out = io.BytesIO()
    with tarfile.open(source, "r:gz") as tar, tarfile.open(fileobj=out, mode="w") as new:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            assert f is not None
            body = f.read()
            if member.name == MANIFEST and manifest:
                body = json.dumps({**json.loads(body), **manifest}).encode()
            if change and member.name in change:
                original, body = body, change[member.name](body)
                assert body != original, "the change changed nothing"
            member.size = len(body)
            new.addfile(member, io.BytesIO(body))
        for name, body in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            new.addfile(info, io.BytesIO(body))
    target.write_bytes(gzip.compress(out.getvalue()))
    os.chmod(target, 0o600)
    return target
