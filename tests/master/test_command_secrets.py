"""A create command's secret fields, sealed in its record (master/command_secrets.py, master/commands.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import bson
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.containers import ContainerSpec, parse_create_spec
from common.wire import Command, CommandResult
from master.command_secrets import SEALED, SEALED_TOKEN, join, split
from master.config import MasterConfig
from master.master import Master
from master.records import CommandRecord
from master.store import MongoStore, SqliteStore, open_store
from master.store.migrations import migrate_mongo, migrate_sqlite
from tests.master.linked import connect, disconnect, relay, relay_link, to_agent
from tests.master.test_store_contract import raw_client

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)
_env = st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), _text, max_size=4)
_credentials = st.fixed_dictionaries({"access_key_id": _text, "secret_access_key": _text}, optional={"session_token": _text})


@st.composite
def create_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "c1", "image": "busybox"}
    env = draw(_env)
    if env:
        spec["env"] = env
    if draw(st.booleans()):
        spec["registry_auth"] = {"username": draw(_text), "password": draw(_text)}
    if draw(st.booleans()):
        spec["storage"] = {"credentials": draw(_credentials), "region": "eu-1", "inputs": [{"uri": "s3://b/k", "path": "/in"}]}
    if draw(st.booleans()):
        spec["endpoint_worker"] = {"endpoint_id": "ep-1", "worker_id": "w-1", "token": draw(_text) * 16}
    return spec


def _secret_values(spec: dict[str, Any]) -> list[str]:
    values = list(spec.get("env", {}).values())
    if "registry_auth" in spec:
        values.append(spec["registry_auth"]["password"])
    if "storage" in spec:
        credentials = spec["storage"]["credentials"]
        values += [credentials["secret_access_key"], *([credentials["session_token"]] if "session_token" in credentials else [])]
    if "endpoint_worker" in spec:
        values.append(spec["endpoint_worker"]["token"])
    return values


@given(create_specs())
def test_a_stored_spec_holds_no_secret_value_and_joins_back_to_the_spec(spec: dict[str, Any]) -> None:
    stored, secrets = split(spec)
    assert (secrets is None) == (not _secret_values(spec))
    if secrets is None:
        assert stored == spec
        return
    assert join(stored, secrets) == spec
    assert set(_secret_values(stored)) <= {SEALED, SEALED_TOKEN}
    # What answers show stays: every env name, the registry username, the storage key id; and it still parses.
    assert stored.get("env", {}).keys() == spec.get("env", {}).keys()
    if "registry_auth" in spec:
        assert stored["registry_auth"]["username"] == spec["registry_auth"]["username"]
    if "storage" in spec:
        assert stored["storage"]["credentials"] == {
            "access_key_id": spec["storage"]["credentials"]["access_key_id"],
            "secret_access_key": SEALED,
        }
    if "endpoint_worker" in spec:
        assert stored["endpoint_worker"] == {**spec["endpoint_worker"], "token": SEALED_TOKEN}
    parse_create_spec(stored)


async def test_an_open_create_stored_in_clear_by_an_older_master_is_sealed_at_start_and_sent_whole(tmp_path: Path) -> None:
    state_dir = tmp_path / "master"
    config = MasterConfig(state_dir=str(state_dir), link_port=0)
    first = Master(config)
    await first.start()
    link = relay_link()
    await connect(first, link, "agt-a")
    await first.stop()
    whole = {"name": "c1", "image": "busybox", "env": {"TOKEN": "clear-token-31f"}}
    legacy = CommandRecord(
        id="cmd-legacy", agent_id="agt-a", kind="create_container", spec=whole, state="pending", created_at=time.time(),
        deadline=time.time() + 600,
    )  # fmt: skip
    store = open_store(f"sqlite:///{state_dir / 'master.db'}")
    await store.open()
    await store.commands.put(legacy)
    await store.close()

    master = Master(config)
    await master.start()
    try:
        stored = await master.store.commands.get("cmd-legacy")
        assert stored is not None and stored.sealed and stored.spec["env"] == {"TOKEN": SEALED}
        link = relay_link("relay-b")
        await connect(master, link, "agt-a")
        (sent,) = [f for f in to_agent(link, "agt-a") if isinstance(f, Command)]
        assert sent.body.spec == whole

        await relay(master, link, "agt-a", CommandResult(id="cmd-legacy", ok=True, result={}))
        final = await master.store.commands.get("cmd-legacy")
        assert final is not None and final.state == "succeeded"
        assert final.sealed == "" and b"clear-token-31f" not in msgspec.json.encode(final)  # never sent again: dropped
    finally:
        await master.stop()


def _clear_create(command_id: str, state: str, token: str) -> CommandRecord:
    """A create command as a Master older than sealing stored it: its secret values in clear."""
    spec = {
        "name": command_id,
        "image": "busybox",
        "env": {"TOKEN": token},
        "registry_auth": {"username": "alice", "password": f"{token}-registry"},
        "storage": {"credentials": {"access_key_id": "AKIA", "secret_access_key": f"{token}-storage"}},
    }
    return CommandRecord(
        id=command_id, agent_id="agt-a", kind="create_container", spec=spec, state=state, created_at=1.0, deadline=2.0
    )


async def test_a_version_13_sqlite_store_keeps_no_secret_of_a_finished_create_once_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    finished, still_open = _clear_create("cmd-done", "succeeded", "done-7c1"), _clear_create("cmd-open", "sent", "open-2b9")
    with sqlite3.connect(path, isolation_level=None) as conn:  # what an idlegrid of schema version 13 wrote
        assert migrate_sqlite(conn, up_to=13) == 13
        for rec in (finished, still_open):
            row = (rec.id, rec.agent_id, rec.state, rec.created_at, msgspec.json.encode(rec).decode())
            conn.execute("INSERT INTO commands (id, agent_id, state, created_at, doc) VALUES (?, ?, ?, ?, ?)", row)
    conn.close()

    store = SqliteStore(str(path))
    await store.open()
    try:
        migrated = await store.commands.get("cmd-done")
        assert migrated is not None and migrated.spec["env"] == {"TOKEN": SEALED}
        assert migrated.spec["registry_auth"] == {"username": "alice", "password": SEALED}
        assert migrated.spec["storage"]["credentials"] == {"access_key_id": "AKIA", "secret_access_key": SEALED}
        assert await store.commands.get("cmd-open") == still_open  # the ledger seals it when it loads (it holds the key)
        on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("old.db"))
        assert b"done-7c1" not in on_disk and b"open-2b9" in on_disk
    finally:
        await store.close()


async def test_a_version_13_mongodb_database_keeps_no_secret_of_a_finished_create_once_migrated(mongo_url: str) -> None:
    store = MongoStore(mongo_url)
    finished, still_open = _clear_create("cmd-done", "failed", "done-7c1"), _clear_create("cmd-open", "pending", "open-2b9")
    async with raw_client(mongo_url) as client:  # what an idlegrid of schema version 13 wrote
        assert await migrate_mongo(client[store.database], up_to=13) == 13
        for rec in (finished, still_open):
            await client[store.database].commands.insert_one(msgspec.to_builtins(rec) | {"_id": rec.id})
    await store.open()
    try:
        migrated = await store.commands.get("cmd-done")
        assert migrated is not None and migrated.spec["env"] == {"TOKEN": SEALED}
        assert await store.commands.get("cmd-open") == still_open
    finally:
        await store.close()
    async with raw_client(mongo_url) as client:
        raw = b"".join(bson.encode(doc) for doc in await client[store.database].commands.find().to_list())
    assert b"done-7c1" not in raw and b"open-2b9" in raw


async def test_a_master_whose_secrets_key_cannot_open_a_stored_create_does_not_send_it_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    first = Master(config)
    await first.start()
    link = relay_link()
    await connect(first, link, "agt-a")
    await disconnect(first, link, "agt-a")
    record = await first.commands.create("agt-a", ContainerSpec(name="c1", image="busybox", env={"T": "v"}))
    await first.stop()
    key = tmp_path / "master" / "pki" / "secrets.key"
    key.unlink()  # a Master given another key (one not copied with the CA)

    master = Master(config)
    await master.start()
    try:
        link = relay_link("relay-b")
        await connect(master, link, "agt-a")  # its hello is served all the same
        assert master.registry.get("agt-a").state == "ready"
        assert [f for f in to_agent(link, "agt-a") if isinstance(f, Command)] == []
        assert (await master.command(record.id)).state == "pending"  # it times out at its deadline
        assert f"command {record.id} cannot be sent" in caplog.text and "secrets.key" in caplog.text
    finally:
        await master.stop()
