"""Reports through the real API on a real Master (SQLite in the test's tmp_path), from seeded rollups, rentals and
ledger entries, cross-checked against what they summarize: revenue by provider x day against the ledger's own provider
payouts (GET /accounts/{id}/payouts), usage by tier x region against the rollups in the store (acceptance 4).

The GPUs are simulated (no GPU here); every record the reports read is a real one in the real store."""

from __future__ import annotations

import csv
import io
import time
from collections import defaultdict

import pytest

from management.store import ledger_repo, rental_repo
from master.master import Master
from master.records import LedgerEntry, LedgerLine, RentalHost, RentalRecord, TelemetryRollup
from tests.management.hosts import add_agent, api_key

DAY = 86400
D1 = (int(time.time()) // DAY - 3) * DAY  # midnight UTC three days ago
WINDOW = {"from": str(D1), "to": str(D1 + 2 * DAY)}
UTILS = (12.5, 40.0, 95.0, 0.0, 63.0)


def day_of(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def line(account: str, amount: int, host: str, workload: str) -> LedgerLine:
    return LedgerLine(account=account, amount=amount, host=host, workload=workload)


def charge(key: str, ts: float, r: RentalRecord, amount: int, fee: int) -> LedgerEntry:
    host, w = r.hosts[0], r.workload_id
    lines = [
        line(f"hold:{r.account}", -amount, host.agent_id, w),
        line(f"provider:{host.provider}", amount - fee, host.agent_id, w),
        line("platform:fees", fee, host.agent_id, w),
    ]
    return LedgerEntry(key=key, ts=ts, kind="charge", memo="metered", lines=lines, rental=r.id)


def refund(key: str, ts: float, r: RentalRecord, amount: int, fee: int) -> LedgerEntry:
    host, w = r.hosts[0], r.workload_id
    lines = [
        line(f"renter:{r.account}", amount, host.agent_id, w),
        line(f"provider:{host.provider}", -(amount - fee), host.agent_id, w),
        line("platform:fees", -fee, host.agent_id, w),
    ]
    return LedgerEntry(key=key, ts=ts, kind="refund", memo="host failed", lines=lines, rental=r.id)


async def seed(master: Master) -> dict[str, list[str]]:
    """acme: agt-a1 (2 x H100, eu-west) and agt-a2 (1 x A10, us-east); bolt: agt-b1 (1 x A10, eu-west). Two days of
    rollups, a rental across midnight on agt-a1 for renter lab, one on agt-b1 for renter zoo that the host failed, and
    their charges and refund in the ledger. Answers each host's GPU uuids."""
    await add_agent(master, "agt-a1", "h100:2", provider="acme", region="eu-west")
    await add_agent(master, "agt-a2", "a10:1", provider="acme", region="us-east")
    await add_agent(master, "agt-b1", "a10:1", provider="bolt", region="eu-west")
    gpus = {agent: [g.uuid for g in master.registry.gpus_of(agent)] for agent in ("agt-a1", "agt-a2", "agt-b1")}
    rollups = []
    for n, (agent, uuids) in enumerate(sorted(gpus.items())):
        for uuid in uuids:
            for minute in range(D1 // 60 + 600 + n * 7, D1 // 60 + 2 * 1440 - 10, 97):  # every 97 minutes, both days
                util = UTILS[minute % len(UTILS)]
                rollups.append(
                    TelemetryRollup(
                        gpu_uuid=uuid,
                        agent_id=agent,
                        minute=minute,
                        samples=6,
                        utilization_avg=util,
                        utilization_max=util,
                        memory_used_mib_max=1024,
                    )
                )
    await master.store.rollups.put_many(rollups)
    lab = RentalRecord(
        id="wl-lab-a1",
        workload_id="wl-lab",
        account="lab",
        kind="on_demand",
        hosts=[RentalHost(agent_id="agt-a1", provider="acme", gpus=2, price=2_000_000, units=gpus["agt-a1"])],
        started_at=D1 + 20 * 3600,
        ended_at=D1 + DAY + 4 * 3600,
        end_reason="stopped by its renter",
    )
    zoo = RentalRecord(
        id="wl-zoo-a1",
        workload_id="wl-zoo",
        account="zoo",
        kind="on_demand",
        hosts=[RentalHost(agent_id="agt-b1", provider="bolt", gpus=1, price=1_000_000, units=gpus["agt-b1"])],
        started_at=D1 + DAY + 5 * 3600,
        ended_at=D1 + DAY + 6 * 3600,
        end_reason="its host went offline",
        host_failure="agt-b1: went offline",
    )
    for r in (lab, zoo):
        assert await rental_repo(master.store).insert(r)
    entries = [
        charge("charge:wl-lab-a1:1", D1 + 21 * 3600, lab, 4_000_000, 400_000),
        charge("charge:wl-lab-a1:2", D1 + 23 * 3600, lab, 8_000_000, 800_000),
        charge("charge:wl-lab-a1:end", D1 + DAY + 4 * 3600, lab, 16_000_001, 1_600_000),
        charge("charge:wl-zoo-a1:end", D1 + DAY + 6 * 3600, zoo, 1_000_000, 100_000),
        refund("refund:wl-zoo-a1", D1 + DAY + 6 * 3600 + 1, zoo, 1_000_000, 100_000),
    ]
    for entry in entries:
        assert await ledger_repo(master.store).post(entry) is not None
    return gpus


@pytest.fixture
async def grid(api):
    """``seed``, with a key for providers acme and bolt and for renter lab."""
    api.gpus = await seed(api.master)
    api.acme = await api_key(api.master, "provider", "acme")
    api.bolt = await api_key(api.master, "provider", "bolt")
    api.lab = await api_key(api.master, "renter", "lab")
    return api


async def report(api, kind: str, by: str, headers, **extra) -> dict:
    response = await api.get(f"/api/v1/reports/{kind}", params={"by": by, **WINDOW, **extra}, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_revenue_by_provider_and_day_is_what_the_ledger_pays_each_provider_each_day(grid):
    body = await report(grid, "revenue", "provider,day", grid.auth)
    assert body["columns"][:2] == ["provider", "day"] and body["currency"] == "USD"
    rows = {(r["provider"], r["day"]): r for r in body["rows"]}
    for provider in ("acme", "bolt"):
        payouts = await (
            await grid.get(f"/api/v1/accounts/{provider}/payouts", params={"period": "day"}, headers=grid.auth)
        ).json()
        assert payouts["items"], provider
        for paid in payouts["items"]:
            row = rows.pop((provider, paid["label"]))
            assert (row["gross"], row["fees"], row["refunded"], row["provider_net"]) == (
                paid["gross"],
                paid["fee"],
                paid["refunded"],
                paid["net"],
            )
    assert rows == {}  # no money the ledger does not pay
    assert rows_total(body) == {"gross": "29.000001", "fees": "2.90", "refunded": "0.90", "provider_net": "25.200001"}
    assert body["total"]["platform_net"] == "2.80"  # bolt's fee was given back with the refund


def rows_total(body: dict) -> dict[str, str]:
    return {k: body["total"][k] for k in ("gross", "fees", "refunded", "provider_net")}


async def test_usage_by_tier_and_region_is_the_rollups_each_gpu_reported(grid):
    body = await report(grid, "usage", "tier,region", grid.auth)
    master = grid.master
    minutes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for agent, uuids in grid.gpus.items():
        region = master.registry.agents[agent].region
        for uuid in uuids:
            tier = master.registry.gpus[uuid].tier or "-"
            stored = await master.store.rollups.list(uuid, since_minute=D1 // 60, until_minute=(D1 + 2 * DAY) // 60)
            minutes[(tier, region)].extend(r.utilization_avg for r in stored)
    got = {(r["tier"], r["region"]): r for r in body["rows"]}
    assert set(got) == set(minutes) and len(got) >= 2
    for key, utils in minutes.items():
        assert got[key]["gpu_hours_available"] == round(len(utils) / 60, 4)
        assert got[key]["utilization_pct"] == pytest.approx(sum(utils) / len(utils), abs=0.01)
    h100_tier = master.registry.gpus[grid.gpus["agt-a1"][0]].tier or "-"
    assert got[(h100_tier, "eu-west")]["gpu_hours_sold"] == 2 * 8.0  # two GPUs, 20:00 to 04:00
    expected_minutes = sum(len(u) for u in minutes.values())
    assert body["total"]["gpu_hours_available"] == round(expected_minutes / 60, 4)


async def test_a_provider_reads_its_own_hosts_rows_and_a_renter_its_own_rentals(grid):
    acme = await report(grid, "summary", "host", grid.acme)
    assert sorted(r["host"] for r in acme["rows"]) == ["agt-a1", "agt-a2"]
    bolt = await report(grid, "reliability", "host", grid.bolt)
    [row] = bolt["rows"]
    assert (row["host"], row["sla_breaches"], row["rentals_ended"]) == ("agt-b1", 1, 1)
    lab = await report(grid, "summary", "workload,day", grid.lab)
    assert {r["workload"] for r in lab["rows"]} == {"wl-lab"}
    assert lab["total"]["gross"] == "28.000001"
    assert lab["total"]["gpu_hours_idle"] == 0.0  # a renter sees its GPUs only while it rented them


async def test_csv_has_a_header_and_one_line_per_row(grid):
    response = await grid.get(
        "/api/v1/reports/revenue", params={"by": "provider,day", "format": "csv", **WINDOW}, headers=grid.auth
    )
    assert response.status == 200 and response.content_type == "text/csv"
    table = list(csv.reader(io.StringIO(await response.text())))
    assert table[0] == ["provider", "day", "gross", "fees", "refunded", "fees_refunded", "provider_net", "platform_net"]
    assert [row[:2] for row in table[1:]] == [["acme", day_of(D1)], ["acme", day_of(D1 + DAY)], ["bolt", day_of(D1 + DAY)]]


@pytest.mark.parametrize(
    ("path", "params", "said"),
    [
        ("/api/v1/reports/usage", {"by": "provider,planet"}, "by: 'planet' is not a dimension"),
        ("/api/v1/reports/usage", {"by": "day,month"}, "at most one of day, week and month"),
        ("/api/v1/reports/weather", {"by": "provider"}, "kind: 'weather' is not a report"),
        ("/api/v1/reports/usage", {"by": "provider", "from": "last tuesday"}, "from: 'last tuesday'"),
        ("/api/v1/reports/usage", {"by": "provider", "from": "2026-01-01", "to": "2025-01-01"}, "must be before"),
        ("/api/v1/reports/usage", {}, "by"),
        ("/api/v1/reports/usage", {"by": "provider", "format": "xml"}, "format"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(api, path, params, said):
    response = await api.get(path, params=params, headers=api.auth)
    assert response.status == 400
    assert said in (await response.json())["error"]["message"]


@pytest.mark.parametrize("by", ["renter", "workload,day", "host,renter"])
async def test_a_provider_never_sees_who_rents_its_hosts_in_a_report_as_in_rental_views(grid, by):
    """D18: rental views hide the renter and its workload from providers; reports follow the same policy (a 400
    naming the dimension), in JSON and CSV alike, while the operator and the renter keep them."""
    for fmt in ("json", "csv"):
        response = await grid.get("/api/v1/reports/usage", params={"by": by, "format": fmt, **WINDOW}, headers=grid.acme)
        assert response.status == 400, (by, fmt, await response.text())
        message = (await response.json())["error"]["message"]
        assert "not shown to providers" in message and "lab" not in message, message
    assert "lab" in {r.get("renter") for r in (await report(grid, "usage", "renter", grid.auth))["rows"]}
    assert (await report(grid, "usage", "workload", grid.lab))["rows"]
