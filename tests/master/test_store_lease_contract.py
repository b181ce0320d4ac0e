"""The leader lease's part of the store contract (docs/ha.md), on every backend: SQLite, MongoDB on nx-27017, and a
real mongod when MONGODB_URI is set. Fixtures are in conftest.py."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import Fenced
from master.records import EventRecord, LeaseRecord
from master.store import open_store
from master.store.base import Store
from tests.master.conftest import OpenStore
from tests.master.test_store_contract import agent, command, raw_client

NOW = 1_700_000_000.5
TTL = 10.0


async def take(store: Store, holder: str, now: float = NOW) -> LeaseRecord | None:
    return await store.leases.acquire(holder, f"wss://{holder}:7100/link", f"http://{holder}:7000", TTL, now)


async def test_no_lease_before_anyone_takes_it(store: Store) -> None:
    assert await store.leases.current() is None


async def test_the_first_holder_gets_epoch_1_until_now_plus_ttl(store: Store) -> None:
    lease = await take(store, "m-a")
    want = LeaseRecord(holder="m-a", url="wss://m-a:7100/link", api_url="http://m-a:7000", epoch=1, expires_at=NOW + TTL)
    assert lease == want
    assert await store.leases.current() == want


async def test_a_held_lease_is_refused_to_another_until_it_lapses(store: Store) -> None:
    await take(store, "m-a")
    assert await take(store, "m-b", NOW + TTL - 0.01) is None
    held = await store.leases.current()
    assert held is not None and held.holder == "m-a"
    lease = await take(store, "m-b", NOW + TTL)
    assert lease is not None and (lease.holder, lease.epoch, lease.url) == ("m-b", 2, "wss://m-b:7100/link")


async def test_the_holder_taking_it_again_keeps_its_epoch(store: Store) -> None:
    await take(store, "m-a")
    again = await take(store, "m-a", NOW + 3)
    assert again is not None and (again.epoch, again.expires_at) == (1, NOW + 3 + TTL)


async def test_renewal_extends_only_the_holders_own_epoch(store: Store) -> None:
    await take(store, "m-a")
    renewed = await store.leases.renew("m-a", 1, TTL, NOW + 3)
    assert renewed is not None and renewed.expires_at == NOW + 3 + TTL
    assert await store.leases.renew("m-b", 1, TTL, NOW + 3) is None  # not its lease
    assert await store.leases.renew("m-a", 2, TTL, NOW + 3) is None  # not its epoch


async def test_a_deposed_holder_cannot_renew_after_another_took_over(store: Store) -> None:
    await take(store, "m-a")
    taken = await take(store, "m-b", NOW + TTL + 1)  # m-a stopped renewing (SIGSTOP) and the lease lapsed
    assert taken is not None and taken.epoch == 2
    assert await store.leases.renew("m-a", 1, TTL, NOW + TTL + 2) is None
    assert await take(store, "m-a", NOW + TTL + 2) is None  # and cannot take it back while m-b holds it
    assert await store.leases.current() == taken


async def test_release_lets_the_next_holder_in_at_once_with_a_higher_epoch(store: Store) -> None:
    await take(store, "m-a")
    assert await store.leases.release("m-b", 1) is False  # not its lease: nothing changes
    assert await take(store, "m-b", NOW + 1) is None
    assert await store.leases.release("m-a", 1) is True
    lease = await take(store, "m-b", NOW + 1)
    assert lease is not None and (lease.holder, lease.epoch) == ("m-b", 2)


async def test_of_masters_racing_for_a_free_lease_on_separate_connections_exactly_one_wins(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]  # as four Master processes would race
    attempts = [take(store, f"m-{i}") for i, store in enumerate(stores * 3)]
    won = [lease for lease in await asyncio.gather(*attempts) if lease is not None]
    holders = {lease.holder for lease in won}
    assert len(holders) == 1, won  # a holder may win twice (its second try is "already mine"), no one else
    assert await stores[0].leases.current() == won[-1]


async def test_of_masters_racing_for_a_lapsed_lease_exactly_one_wins_and_the_epoch_rises_once(open_stores: OpenStore) -> None:
    stores = [await open_stores() for _ in range(4)]
    await take(stores[0], "m-old")
    later = NOW + TTL + 5
    attempts = [take(store, f"m-{i}", later) for i, store in enumerate(stores * 3)]
    won = [lease for lease in await asyncio.gather(*attempts) if lease is not None]
    assert len({lease.holder for lease in won}) == 1, won
    assert {lease.epoch for lease in won} == {2}


# --- writes carry their writer (MongoDB; SQLite serves one Master per file: docs/ha.md) -------------------------


async def test_on_mongodb_each_document_written_carries_its_leaders_holder_and_epoch(mongo_url: str) -> None:
    store = open_store(mongo_url)
    await store.open()
    try:
        store.writes_by("m-a", 3)
        await store.agents.put(agent("agt-1"))
        await store.events.append(EventRecord(ts=NOW, kind="x.y", subject="agt-1"))
        client = raw_client(mongo_url)
        db = client.get_default_database()
        for collection in ("agents", "events"):
            doc = await db[collection].find_one({})
            assert doc is not None and (doc["_holder"], doc["_epoch"]) == ("m-a", 3), collection
        await client.close()
        assert await store.agents.get("agt-1") == agent("agt-1")  # the stamp is not part of the record
    finally:
        await store.close()


async def test_on_mongodb_a_deposed_leader_cannot_overwrite_a_command_or_agent_its_successor_wrote(mongo_url: str) -> None:
    old, new = open_store(mongo_url), open_store(mongo_url)
    await old.open()
    await new.open()
    try:
        old.writes_by("m-a", 1)
        new.writes_by("m-b", 2)
        await old.commands.put(command("cmd-1", NOW, state="sent"))
        await old.agents.put_many([agent("agt-1"), agent("agt-2")])
        await new.commands.put(command("cmd-1", NOW, state="succeeded"))
        await new.agents.put(agent("agt-1", state="offline"))
        with pytest.raises(Fenced):
            await old.commands.put(command("cmd-1", NOW, state="failed"))
        with pytest.raises(Fenced, match="agt-1"):
            await old.agents.put_many([agent("agt-1", state="busy")])
        got_command, got_agent = await new.commands.get("cmd-1"), await new.agents.get("agt-1")
        assert got_command is not None and got_command.state == "succeeded"
        assert got_agent is not None and got_agent.state == "offline"
        await old.commands.put(command("cmd-2", NOW))  # what no newer leader wrote, it still may (the fence stops it first)
    finally:
        await old.close()
        await new.close()


async def test_every_backend_takes_the_writer_and_gives_records_back_unchanged(store_url: str) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        store.writes_by("m-a", 1)
        await store.commands.put(command("cmd-1", NOW))
        assert await store.commands.get("cmd-1") == command("cmd-1", NOW)
    finally:
        await store.close()


async def test_on_mongodb_guarded_writes_of_many_records_each_land_on_their_own_document(mongo_url: str) -> None:
    """nx-27017 drops an _id equality beside an $or: the guard must not use one, or records overwrite each other."""
    store = open_store(mongo_url)
    await store.open()
    try:
        await store.agents.put_many([agent(f"agt-{i}") for i in range(20)])  # before any leader: unstamped
        store.writes_by("m-a", 1)
        await asyncio.gather(*(store.agents.put(agent(f"agt-{i}", state="busy")) for i in range(20)))
        await store.agents.put_many([agent(f"agt-{i}", state="offline") for i in range(0, 20, 2)])
        client = raw_client(mongo_url)
        docs = await client.get_default_database()["agents"].find({}).to_list()
        await client.close()
        assert sorted((d["_id"], d["id"], d["state"]) for d in docs) == sorted(
            (f"agt-{i}", f"agt-{i}", "offline" if i % 2 == 0 else "busy") for i in range(20)
        )
    finally:
        await store.close()


async def test_a_command_written_again_keeps_its_times_to_the_last_digit_so_its_signature_still_verifies(
    store: Store,
) -> None:
    """A command's signature covers its times: resent from the store by a new leader, they must be what was signed.
    nx-27017 keeps a float ``$set`` into an existing document to 15 digits; this is what caught it."""
    issued = 1_795_412_309.8676217  # as time.time() gives: 17 significant digits
    first = command("cmd-1", issued, deadline=issued + 300.0)
    await store.commands.put(first)
    first.state = "sent"
    await store.commands.put(first)
    again = await store.commands.get("cmd-1")
    assert again is not None and (again.created_at, again.deadline, again.state) == (issued, issued + 300.0, "sent")
    hosts = [agent("agt-1", last_seen=issued, drained=True), agent("agt-2", last_seen=issued)]
    await store.agents.put_many(hosts)
    hosts[0].drained, hosts[1].last_seen = False, issued + 1.0000001
    await store.agents.put_many(hosts)
    await store.agents.put(hosts[0])
    assert [await store.agents.get(a.id) for a in hosts] == hosts
