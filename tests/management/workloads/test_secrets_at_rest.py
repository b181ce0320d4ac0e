"""Secrets are never at rest in clear (docs/storage.md, "Sealed at rest"): a renter's env secret, storage secret key
and registry password reach the host in the create command, and again in its resend after the host reconnects and
after the Master restarts, while no byte of them is in the store (every file of the SQLite state directory, WAL
included; every document of the MongoDB database, raw BSON), in a backup made by ``idlegrid master backup``, or in an
API answer about the command or the workload.

A real Master on each backend (SQLite file, nx-27017), driven through its relay-link handlers (tests/master/linked.py);
the host is simulated (no GPU, no container engine: what it receives is asserted on the frames)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pymongo
import pytest
from aiohttp.test_utils import TestClient, TestServer
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from common.containers import RegistryAuth
from common.pki import CommandVerifier
from common.wire import Command, CommandResult, signing_bytes
from management.app import api_app
from management.store import workload_repo
from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.port import SEALED
from master.records import WorkloadRecord
from master.store import open_store
from tests.management.workloads.test_runner import creates_sent, host, scheduler, spec
from tests.management.workloads.test_storage_spec import storage
from tests.master.conftest import nx27017_uri, store_url  # noqa: F401  (fixtures: each backend in turn)
from tests.master.linked import disconnect, relay, relay_link

ENV_SECRET = "hf_alice_5f1e2d9c77"
STORAGE_SECRET = "alice-storage-secret-8b7e3a10"
REGISTRY_PASSWORD = "hunter2-registry-9a7b41c3"
CLEAR = {"env secret": ENV_SECRET, "storage secret key": STORAGE_SECRET, "registry password": REGISTRY_PASSWORD}


def new_master(store_url: str, state_dir: Path) -> Master:  # noqa: F811
    config = MasterConfig(state_dir=str(state_dir), link_port=0)
    if store_url.startswith("sqlite"):
        return Master(config)  # its store is state_dir/master.db, where `idlegrid master backup` finds it
    return Master(config, store=open_store(store_url))


@pytest.fixture
async def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "master"


@pytest.fixture
async def master(store_url: str, state_dir: Path) -> AsyncIterator[Master]:  # noqa: F811
    m = new_master(store_url, state_dir)
    await m.start()
    await m.accounts.ensure("alice", AccountRole.RENTER)
    yield m
    await m.stop()


def found_in(blob: bytes) -> list[str]:
    """Which of the secrets ``blob`` holds in clear."""
    return [what for what, value in CLEAR.items() if value.encode() in blob]


def state_dir_bytes(state_dir: Path) -> bytes:
    """Every regular file of the Master's state directory, master.db, -wal and -shm included."""
    return b"".join(p.read_bytes() for p in sorted(state_dir.rglob("*")) if p.is_file())


def mongo_bytes(url: str) -> bytes:
    """Every document of every collection of the database, as the server hands out its BSON."""
    database = pymongo.uri_parser.parse_uri(url)["database"]
    raw = CodecOptions(document_class=RawBSONDocument)
    with pymongo.MongoClient[RawBSONDocument](url) as client:  # the type only: the raw codec is the collection's
        db = client[database]
        return b"".join(doc.raw for name in db.list_collection_names() for doc in db.get_collection(name, raw).find())


def store_bytes(store_url: str, state_dir: Path) -> bytes:  # noqa: F811
    return state_dir_bytes(state_dir) + (b"" if store_url.startswith("sqlite") else mongo_bytes(store_url))


def assert_carries_the_secrets(master: Master, command: Command) -> None:
    """What the host needs, in clear, under a signature it accepts."""
    sent = command.body.spec
    assert sent["env"] == {"HF_TOKEN": ENV_SECRET, "PLAIN": "1"}
    assert sent["registry_auth"] == {"username": "alice", "password": REGISTRY_PASSWORD}
    assert sent["storage"]["credentials"] == {"access_key_id": "AKIAALICE", "secret_access_key": STORAGE_SECRET}
    CommandVerifier(master.authority.keys.command_keys()).verify(
        command.body.key_id, signing_bytes(command.body), command.signature
    )


async def submit_and_send(master: Master, link: AccessLink) -> Command:
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    await master.secrets.create("alice", "hf", ENV_SECRET)
    await master.secrets.create("alice", "s3-keys", f"AKIAALICE:{STORAGE_SECRET}")
    auth = RegistryAuth(username="alice", password=REGISTRY_PASSWORD)
    env = {"HF_TOKEN": "${secret:hf}", "PLAIN": "1"}
    await loop.book.submit("alice", spec(env=env, registry_auth=auth, **storage()), time.time())
    await loop.cycle()
    (create,) = creates_sent(link, "agt-a")
    return create


async def reconnected(master: Master, relay_id: str) -> Command:
    """The host comes back through another relay; the unacknowledged create is sent again."""
    link = relay_link(relay_id)
    await host(master, link, "agt-a")
    (resent,) = creates_sent(link, "agt-a")
    return resent


async def api_answers(master: Master, command_id: str, workload_id: str) -> str:
    client = TestClient(TestServer(api_app(master)))
    await client.start_server()
    try:
        auth = {"Authorization": f"Bearer {await master.create_api_key('operator')}"}
        answers = []
        for path in (
            f"/api/v1/commands/{command_id}",
            "/api/v1/commands?agent_id=agt-a",
            f"/api/v1/workloads/{workload_id}",
            "/api/v1/workloads",
        ):
            response = await client.get(path, headers=auth)
            assert response.status == 200, (path, await response.text())
            answers.append(await response.text())
        return "\n".join(answers)
    finally:
        await client.close()


def backup(state_dir: Path, out: Path) -> bytes:
    """``idlegrid master backup`` of the running Master; the archive's content, unpacked."""
    made = subprocess.run(
        [sys.executable, "-m", "management.cli", "master", "backup", "--state-dir", str(state_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return gzip.decompress(out.read_bytes())


async def test_a_create_and_its_resends_carry_the_secrets_and_nothing_at_rest_holds_them(
    master: Master,
    store_url: str,  # noqa: F811
    state_dir: Path,
    tmp_path: Path,
) -> None:
    link = relay_link()
    first = await submit_and_send(master, link)
    assert_carries_the_secrets(master, first)

    await disconnect(master, link, "agt-a")  # before it acknowledged: the create is still open
    resent = await reconnected(master, "relay-b")
    assert resent.body.id == first.body.id
    assert_carries_the_secrets(master, resent)

    assert found_in(store_bytes(store_url, state_dir)) == []
    (workload,) = await workload_repo(master.store).list()
    answers = await api_answers(master, first.body.id, workload.id)
    assert found_in(answers.encode()) == [] and '"HF_TOKEN":"<hidden>"' in answers.replace(" ", "")
    if store_url.startswith("sqlite"):
        assert found_in(backup(state_dir, tmp_path / "backup.tar.gz")) == []

    # The Master restarts with the create still open: the reconnecting host gets it again, whole, from the store.
    await master.stop()
    again = new_master(store_url, state_dir)
    await again.start()
    try:
        after_restart = await reconnected(again, "relay-c")
        assert after_restart.body.id == first.body.id
        assert_carries_the_secrets(again, after_restart)
        await relay(again, again.hub.links["relay-c"], "agt-a", CommandResult(id=first.body.id, ok=True, result={}))
        assert (await again.command(first.body.id)).state == "succeeded"
        assert found_in(store_bytes(store_url, state_dir)) == []
    finally:
        await again.stop()
        await master.start()  # the fixture stops it


async def test_an_open_workload_stored_with_its_registry_password_in_clear_is_sealed_when_the_book_loads(
    master: Master,
    store_url: str,  # noqa: F811
    state_dir: Path,
) -> None:
    link = relay_link()
    await host(master, link, "agt-a")
    auth = RegistryAuth(username="alice", password=REGISTRY_PASSWORD)
    old = WorkloadRecord(  # as a Master older than sealing stored it
        id="wl-0123456789abcdef",
        account="alice",
        spec=spec(registry_auth=auth),
        state="queued",
        created_at=time.time(),
        queued_at=time.time(),
        version=1,
    )
    await workload_repo(master.store).insert(old)
    assert found_in(store_bytes(store_url, state_dir)) == ["registry password"]

    loop = scheduler(master)
    await loop.book.load()
    await loop.cycle()

    (create,) = creates_sent(link, "agt-a")
    assert create.body.spec["registry_auth"] == {"username": "alice", "password": REGISTRY_PASSWORD}
    stored = await workload_repo(master.store).get(old.id)
    assert stored is not None and stored.sealed_registry_password
    assert stored.spec.registry_auth is not None and stored.spec.registry_auth.password == SEALED
    if not store_url.startswith("sqlite"):  # SQLite's WAL and free pages keep the old row until they are reused
        assert found_in(store_bytes(store_url, state_dir)) == []
