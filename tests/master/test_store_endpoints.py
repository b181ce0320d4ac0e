"""Endpoints and their invocation keys (management/store/endpoints.py), on both backends, as the contract tests run the
other management aggregates: put, get, list, delete, find a key by its hash, and all of it kept across a restart."""

from __future__ import annotations

from management.endpoints.spec import EndpointKeyRecord, EndpointRecord, EndpointScaling, EndpointSpec, hash_key
from management.store import endpoint_key_repo, endpoint_repo
from master.store import open_store
from master.store.base import Store
from tests.master.test_store_contract import NOW, assert_same


def endpoint(endpoint_id: str, account: str, created_at: float) -> EndpointRecord:
    spec = EndpointSpec(
        name="echo",
        image="ghcr.io/acme/echo:1",
        command=["python", "-m", "echo"],
        env={"TOKEN": "${secret:hf}"},
        scaling=EndpointScaling(min_workers=0, max_workers=3, concurrency=2),
        ttl_s=600.0,
        execution_timeout_s=60.0,
        max_retries=1,
    )
    return EndpointRecord(id=endpoint_id, account=account, spec=spec, created_at=created_at, updated_at=created_at)


def key(key_id: str, endpoint_id: str, created_at: float) -> EndpointKeyRecord:
    return EndpointKeyRecord(
        id=key_id,
        endpoint=endpoint_id,
        account="ana",
        name="ci",
        key_hash=hash_key(f"igek_{key_id}"),
        created_at=created_at,
    )


async def test_endpoints_list_by_creation_per_account_and_delete_says_whether_there_was_one(store: Store) -> None:
    for rec in [endpoint("ep-2", "ana", NOW + 1), endpoint("ep-1", "bo", NOW), endpoint("ep-3", "ana", NOW + 2)]:
        await endpoint_repo(store).put(rec)
    assert [e.id for e in await endpoint_repo(store).list()] == ["ep-1", "ep-2", "ep-3"]
    assert_same(
        await endpoint_repo(store).list(account="ana"), [endpoint("ep-2", "ana", NOW + 1), endpoint("ep-3", "ana", NOW + 2)]
    )
    assert_same(await endpoint_repo(store).get("ep-1"), endpoint("ep-1", "bo", NOW))
    assert await endpoint_repo(store).get("ep-9") is None
    assert await endpoint_repo(store).delete("ep-2") is True
    assert await endpoint_repo(store).delete("ep-2") is False
    assert [e.id for e in await endpoint_repo(store).list(account="ana")] == ["ep-3"]


async def test_a_key_is_found_by_its_hash_and_an_endpoint_s_keys_go_with_it(store: Store) -> None:
    repo = endpoint_key_repo(store)
    for rec in [key("epk-2", "ep-a", NOW + 1), key("epk-1", "ep-a", NOW), key("epk-3", "ep-b", NOW)]:
        await repo.put(rec)
    assert_same(await repo.by_hash(hash_key("igek_epk-2")), key("epk-2", "ep-a", NOW + 1))
    assert await repo.by_hash(hash_key("igek_unknown")) is None
    assert [k.id for k in await repo.list("ep-a")] == ["epk-1", "epk-2"]
    revoked = key("epk-1", "ep-a", NOW)
    revoked.revoked_at = NOW + 5
    await repo.put(revoked)
    assert_same(await repo.list("ep-a"), [revoked, key("epk-2", "ep-a", NOW + 1)])
    assert await repo.delete_of("ep-a") == 2
    assert await repo.list("ep-a") == []
    assert [k.id for k in await repo.list("ep-b")] == ["epk-3"]


async def test_endpoints_and_keys_survive_a_restart(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await endpoint_repo(first).put(endpoint("ep-1", "ana", NOW))
    await endpoint_key_repo(first).put(key("epk-1", "ep-1", NOW))
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await endpoint_repo(second).get("ep-1"), endpoint("ep-1", "ana", NOW))
        assert_same(await endpoint_key_repo(second).by_hash(hash_key("igek_epk-1")), key("epk-1", "ep-1", NOW))
    finally:
        await second.close()
