"""Poisoned state, on every backend: a stored record that no longer decodes is skipped, reported and left in
place, and every other record is served; a record holding a NaN or an infinity is never written."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from msgspec import Struct
from prometheus_client import CollectorRegistry, generate_latest

from master.records import ApiKeyRecord, RevocationRecord
from master.store import SqliteStore, UnstorableRecord
from master.store.aggregates import Aggregate
from master.store.base import Store, TokenOutcome
from master.store.codec import to_document, to_json
from master.store.quarantine import Quarantine
from tests.master.test_store_contract import NOW, agent, command, event, gpu, gpu_info, host, raw_client, rollup, token
from tests.support.poison import nan_command_doc, poison, poison_sqlite
from tests.support.prometheus import check_metrics


def quarantined(store: Store) -> list[tuple[str, str]]:
    return [(q.aggregate, q.key) for q in store.quarantine.records]


# --- reading: one bad record never fails a read ------------------------------------------------------


async def test_listing_agents_skips_an_undecodable_one_and_serves_the_rest(store: Store) -> None:
    await store.agents.put_many([agent("agt-1"), agent("agt-3")])
    await poison(store, Aggregate.AGENTS, "agt-2")
    assert [a.id for a in await store.agents.list()] == ["agt-1", "agt-3"]
    assert [a.id for a in await store.agents.list(state="ready")] == ["agt-1", "agt-3"]
    assert quarantined(store) == [(Aggregate.AGENTS, "agt-2")]


async def test_getting_an_undecodable_record_answers_none_and_quarantines_it(store: Store) -> None:
    await poison(store, Aggregate.AGENTS, "agt-bad")
    await poison(store, Aggregate.GPUS, "GPU-bad")
    await poison(store, Aggregate.COMMANDS, "cmd-bad")
    await poison(store, Aggregate.API_KEYS, "k" * 64)
    assert await store.agents.get("agt-bad") is None
    assert await store.gpus.get("GPU-bad") is None
    assert await store.commands.get("cmd-bad") is None
    assert await store.api_keys.get("k" * 64) is None
    assert sorted(quarantined(store)) == sorted(
        [
            (Aggregate.AGENTS, "agt-bad"),
            (Aggregate.GPUS, "GPU-bad"),
            (Aggregate.COMMANDS, "cmd-bad"),
            (Aggregate.API_KEYS, "k" * 64),
        ]
    )


async def test_listing_gpus_revocations_and_rollups_skips_undecodable_ones(store: Store) -> None:
    await store.gpus.put_many([gpu("GPU-a"), gpu("GPU-c", index=2)])
    await poison(store, Aggregate.GPUS, "GPU-b")
    good = RevocationRecord(serial="0a", agent_id="agt-1", revoked_at=NOW)
    await store.revocations.put(good)
    await poison(store, Aggregate.REVOCATIONS, "0b")
    await store.rollups.put_many([rollup("GPU-a", 4), rollup("GPU-a", 6)])
    bad_rollup = await poison(store, Aggregate.ROLLUPS, "GPU-a", minute=5)

    assert [g.uuid for g in await store.gpus.list()] == ["GPU-a", "GPU-c"]
    assert await store.revocations.list() == [good]
    assert [r.minute for r in await store.rollups.list("GPU-a")] == [4, 6]
    assert sorted(quarantined(store)) == sorted(
        [(Aggregate.GPUS, "GPU-b"), (Aggregate.REVOCATIONS, "0b"), (Aggregate.ROLLUPS, bad_rollup)]
    )
    assert bad_rollup == "GPU-a:5"


async def test_a_page_of_commands_is_topped_up_past_undecodable_ones(store: Store) -> None:
    for i in range(5):
        await store.commands.put(command(f"cmd-{i}", NOW + i))
    await poison(store, Aggregate.COMMANDS, "cmd-3b", created_at=NOW + 3.5)
    await poison(store, Aggregate.COMMANDS, "cmd-2b", created_at=NOW + 2.5)
    assert [c.id for c in await store.commands.list(limit=3)] == ["cmd-4", "cmd-3", "cmd-2"]
    assert [c.id for c in await store.commands.list(states=["pending"], limit=10)] == [f"cmd-{i}" for i in range(4, -1, -1)]
    assert sorted(key for _, key in quarantined(store)) == ["cmd-2b", "cmd-3b"]


async def test_a_page_of_events_is_topped_up_past_undecodable_ones(store: Store) -> None:
    await store.events.append(event("agent.enrolled", "agt-1"))
    bad = [await poison(store, Aggregate.EVENTS, "agt-1") for _ in range(3)]
    await store.events.append_many([event("agent.transition", "agt-1"), event("agent.transition", "agt-1")])
    page = await store.events.list(limit=2)
    assert [e.kind for e in page] == ["agent.enrolled", "agent.transition"]
    rest = await store.events.list(after_seq=page[-1].seq, limit=2)
    assert [e.kind for e in rest] == ["agent.transition"]
    assert sorted(key for _, key in quarantined(store)) == sorted(bad)


async def test_consuming_an_undecodable_join_token_is_unknown(store: Store) -> None:
    await poison(store, Aggregate.TOKENS, "h" * 64)
    assert await store.tokens.consume("h" * 64, agent_id="agt-1", now=NOW) == (TokenOutcome.UNKNOWN, None)
    assert quarantined(store) == [(Aggregate.TOKENS, "h" * 64)]
    await store.tokens.put(token("g" * 64))  # the others still enroll
    assert (await store.tokens.consume("g" * 64, agent_id="agt-2", now=NOW))[0] is TokenOutcome.OK


async def test_an_undecodable_record_is_reported_once_and_left_in_the_database(store: Store) -> None:
    await poison(store, Aggregate.AGENTS, "agt-bad")
    await store.agents.list()
    await store.agents.list()
    assert await store.agents.get("agt-bad") is None
    [found] = store.quarantine.take_unreported()
    assert (found.aggregate, found.key, found.backend) == (Aggregate.AGENTS, "agt-bad", store.backend)
    assert "host" in found.reason  # what failed to decode, for the operator who repairs it
    assert store.quarantine.take_unreported() == []  # handed out once
    assert len(store.quarantine) == 1  # but still in quarantine
    await store.agents.list()
    assert store.quarantine.take_unreported() == []
    assert await _raw_keys(store, Aggregate.AGENTS) == ["agt-bad"]  # not deleted


async def test_a_good_record_written_over_an_undecodable_one_leaves_quarantine(store: Store) -> None:
    await poison(store, Aggregate.AGENTS, "agt-1")
    assert await store.agents.list() == []
    await store.agents.put(agent("agt-1"))
    assert [a.id for a in await store.agents.list()] == ["agt-1"]
    assert len(store.quarantine) == 0


async def test_quarantine_logs_the_aggregate_and_key(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    await poison(store, Aggregate.COMMANDS, "cmd-bad")
    with caplog.at_level("WARNING", logger="master.store.quarantine"):
        await store.commands.list()
    [record] = [r for r in caplog.records if "quarantined" in r.getMessage()]
    assert (record.aggregate, record.key, record.backend) == ("commands", "cmd-bad", store.backend)  # type: ignore[attr-defined]


async def _raw_keys(store: Store, aggregate: Aggregate) -> list[str]:
    if isinstance(store, SqliteStore):
        key = {"agents": "id"}[aggregate.value]
        with sqlite3.connect(store.path) as conn:
            rows = conn.execute(f"SELECT {key} FROM {aggregate.value}").fetchall()
        conn.close()
        return [row[0] for row in rows]
    from master.store import MongoStore

    assert isinstance(store, MongoStore)
    async with raw_client(store.url) as client:
        return [doc["_id"] async for doc in client[store.database][aggregate.value].find({})]


# --- the incident: a command created with timeout_s NaN -------------------------------------------------


async def test_a_nan_command_stored_by_an_earlier_version_no_longer_fails_the_listing(tmp_path: Path) -> None:
    path = str(tmp_path / "master.db")
    store = SqliteStore(path)
    await store.open()
    try:
        await store.commands.put(command("cmd-ok", NOW))
        poison_sqlite(path, Aggregate.COMMANDS, "cmd-nan", doc=nan_command_doc("cmd-nan", NOW + 1), created_at=NOW + 1)
        assert [c.id for c in await store.commands.list(states=["pending"])] == ["cmd-ok"]
        assert quarantined(store) == [(Aggregate.COMMANDS, "cmd-nan")]
    finally:
        await store.close()


# --- writing: no NaN or infinity reaches the database ----------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_a_command_with_a_non_finite_deadline_is_refused_naming_the_field(store: Store, bad: float) -> None:
    with pytest.raises(UnstorableRecord, match=r"commands record 'cmd-1': deadline is (nan|inf|-inf)"):
        await store.commands.put(command("cmd-1", NOW, deadline=bad))
    assert await store.commands.list() == []


async def test_a_non_finite_float_deep_in_a_record_is_refused_with_its_path(store: Store) -> None:
    spec = {"name": "job", "limits": {"cpus": [1.0, float("nan")]}}
    with pytest.raises(UnstorableRecord, match=r"spec\.limits\.cpus\[1\] is nan"):
        await store.commands.put(command("cmd-1", NOW, spec=spec))
    with pytest.raises(UnstorableRecord, match=r"data\.ratio is inf"):
        await store.events.append(event("agent.transition", "agt-1", ratio=float("inf")))
    assert await store.events.list() == []


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("aggregate", "rec", "named"),
    [
        (Aggregate.AGENTS, agent(host=host(latency_ms=INF)), "host.latency_ms is inf"),  # an optional nested struct
        (Aggregate.AGENTS, agent(previous_serials={"0a": NAN}), "previous_serials.0a is nan"),  # dict[str, float]
        (Aggregate.GPUS, gpu("GPU-a", info=gpu_info("GPU-a", power_limit_w=-INF)), "info.power_limit_w is -inf"),
        (Aggregate.COMMANDS, command("cmd-1", NOW, result={"times": [1.0, NAN]}), "result.times[1] is nan"),  # Any
        (Aggregate.ROLLUPS, rollup("GPU-a", 1, temperature_max=NAN), "temperature_max is nan"),  # float | None
    ],
)
def test_the_refusal_names_the_non_finite_field_wherever_it_is(aggregate: Aggregate, rec: Struct, named: str) -> None:
    with pytest.raises(UnstorableRecord, match=re.escape(named)):
        to_json(aggregate, "key", rec)
    with pytest.raises(UnstorableRecord, match=re.escape(named)):
        to_document(aggregate, "key", rec)


async def test_a_batch_with_one_non_finite_record_writes_nothing(store: Store) -> None:
    batch = [rollup("GPU-a", 1), rollup("GPU-a", 2, utilization_avg=float("nan")), rollup("GPU-a", 3)]
    with pytest.raises(UnstorableRecord, match=r"rollups record 'GPU-a:2': utilization_avg is nan"):
        await store.rollups.put_many(batch)
    assert await store.rollups.list("GPU-a") == []
    with pytest.raises(UnstorableRecord):
        await store.agents.put_many([agent("agt-1"), agent("agt-2", uptime_s=float("inf"))])
    assert await store.agents.list() == []


async def test_the_refusal_is_an_api_error_with_its_own_code(store: Store) -> None:
    with pytest.raises(UnstorableRecord) as refused:
        await store.api_keys.put(ApiKeyRecord(key_hash="k" * 64, name="ops", role="operator", created_at=float("nan")))
    assert refused.value.code == "unstorable_record"


# --- metrics ----------------------------------------------------------------------------------------


async def test_writes_are_timed_by_aggregate_and_backend_in_the_registry_given(store: Store) -> None:
    registry = CollectorRegistry()
    store.metrics.register(registry)
    await store.agents.put(agent())
    await store.gpus.put_many([gpu("GPU-a"), gpu("GPU-b", index=1)])
    await store.events.append(event("agent.enrolled", "agt-1"))

    def writes(aggregate: str) -> float | None:
        labels = {"aggregate": aggregate, "backend": store.backend}
        return registry.get_sample_value("idlegrid_store_write_seconds_count", labels)

    assert (writes("agents"), writes("gpus"), writes("events"), writes("rollups")) == (1, 1, 1, 0)
    body = generate_latest(registry).decode()
    assert body.count("idlegrid_store_write_seconds_count{") == len(Aggregate)  # every series, from the start


async def test_quarantined_records_are_a_gauge_by_aggregate(store: Store) -> None:
    registry = CollectorRegistry()
    store.metrics.register(registry)
    await poison(store, Aggregate.GPUS, "GPU-x")
    await poison(store, Aggregate.GPUS, "GPU-y")
    await store.gpus.list()
    labels = {"aggregate": "gpus", "backend": store.backend}
    assert registry.get_sample_value("idlegrid_store_quarantined_records", labels) == 2
    assert registry.get_sample_value("idlegrid_store_quarantined_records", labels | {"aggregate": "agents"}) == 0


def test_a_quarantine_reason_is_bounded() -> None:
    quarantine = Quarantine("sqlite", clock=lambda: NOW)
    quarantine.add(Aggregate.AGENTS, "agt-1", ValueError("x" * 10_000))
    [found] = quarantine.records
    assert len(found.reason) < 400 and found.found_at == NOW


async def test_the_store_metrics_pass_promtool(store: Store) -> None:
    registry = CollectorRegistry()
    store.metrics.register(registry)
    await store.agents.put(agent())
    await poison(store, Aggregate.AGENTS, "agt-bad")
    await store.agents.list()
    checked = check_metrics(generate_latest(registry))
    assert checked.clean, checked.findings
