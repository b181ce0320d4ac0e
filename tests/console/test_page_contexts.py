"""The provider's and operator's pages' pure parts (management/console/pages/): from what the façade answers to what
the templates show, and the forms and filters parsed, each refusal naming its field. No server, no browser."""

from __future__ import annotations

import msgspec
import pytest

from bench.api_pages import generated_fleet
from common.inventory import GpuSample
from management.console.pages.operator import KeyForm, TokenForm, figure_row, fleet_context, parse_fields
from management.console.pages.provider import (
    counted,
    earnings_series,
    gpu_rows,
    host_query,
    host_row,
    price_form,
    reputation_parts,
    samples_document,
)
from management.http.errors import BadRequest
from management.market.ledger import PeriodEarnings
from management.services.fleet import UnitFigures, fleet_figures, usage_of
from management.services.hosts import AgentDetail
from management.services.telemetry import HostSamples
from master.records import GpuFault


def detail_of(index: int = 0) -> AgentDetail:
    fleet = generated_fleet(index + 1, 2, now=1000.0)
    agent, gpus = fleet.agents[index], fleet.gpus[2 * index :]
    gpus[1].state = "faulty"
    gpus[1].fault = GpuFault(kind="xid", reason="Xid 79: GPU has fallen off the bus", since=999.0, code=79)
    latest = {gpus[0].uuid: GpuSample(uuid=gpus[0].uuid, ts=1000.0, utilization_pct=42.4, memory_used_mib=2048, power_w=301.6)}
    return AgentDetail(agent, gpus, latest, reachable=True, offered=frozenset({gpus[0].uuid}))


def test_a_host_row_counts_its_gpus_tiers_models_and_states():
    row = host_row(detail_of())
    assert (row.gpus, row.faulty, row.models) == (2, 1, "h100-sxm x 2")
    assert row.gpu_states == "1 available, 1 faulty" and 0 <= row.reputation <= 1
    assert counted(["a", "b", "a"]) == "a x 2, b"


def test_gpu_rows_show_the_fault_and_the_latest_figures_as_text():
    healthy, broken = gpu_rows(detail_of())
    assert healthy.now == {
        "utilization": "42%",
        "memory": f"2,048 of {healthy.memory_total_mib:,} MiB",
        "temperature": "-",
        "power": "302 W",
    }
    assert healthy.offered and not broken.offered
    assert broken.fault.startswith("Xid 79") and broken.now["utilization"] == "-"


def test_reputation_parts_carry_their_weights_and_evidence():
    score, parts = reputation_parts(detail_of())
    assert abs(sum(p.weight for p in parts) - 1.0) < 1e-9
    uptime = next(p for p in parts if p.name == "uptime")
    assert [what for what, _ in uptime.evidence] == ["seconds answering", "seconds silent"]
    assert 0 <= score <= 1


def test_samples_are_columns_a_chart_draws_with_nulls_for_figures_not_reported():
    detail = detail_of()
    uuid = detail.gpus[0].uuid
    samples = [GpuSample(uuid=uuid, ts=float(t), utilization_pct=t, temperature_c=None if t == 2 else 50.0) for t in (1, 2, 3)]
    doc = samples_document(HostSamples(detail.agent.id, detail.gpus, {uuid: samples}))
    first, second = doc["gpus"]
    assert first["ts"] == [1.0, 2.0, 3.0] and first["temperature_c"] == [50.0, None, 50.0]
    assert first["now"]["utilization"] == "3%"
    assert second["ts"] == [] and second["now"]["power"] == "-"
    msgspec.json.encode(doc)  # what the route answers


def test_earnings_series_pads_by_a_period_and_amounts_are_in_currency_units():
    day = PeriodEarnings(label="2026-11-23", start=0.0, end=86400.0, gross=2_000_000, fee=200_000, refunded=0, net=1_800_000)
    assert earnings_series([day]) == {"ts": [0.0], "net": [1.8], "span": 86400.0}


def test_filters_and_forms_refuse_bad_input_naming_the_field():
    assert host_query({"state": "ready", "tier": "", "model": " l4 "}).filters() == {"state": "ready", "model": "l4"}
    with pytest.raises(ValueError, match="state"):
        host_query({"state": "sideways"})
    with pytest.raises(BadRequest, match="on_demand"):
        price_form({"csrf_token": "x", "min_bid": "1"})
    assert price_form({"on_demand": "2.5", "max_duration_h": "2"}).setting().max_duration_s == 7200
    for hours in ("nan", "inf", "0.5"):
        with pytest.raises(BadRequest, match="max_duration_h"):
            price_form({"on_demand": "2.5", "max_duration_h": hours})
    with pytest.raises(BadRequest, match="ttl_h"):
        parse_fields({"provider": "acme", "ttl_h": "-1"}, TokenForm, "the token")
    with pytest.raises(BadRequest, match="name"):
        parse_fields({"name": "x" * 65}, KeyForm, "the key")


def test_the_fleet_context_lists_faulty_gpus_with_their_host_and_rows_say_no_figure_as_a_dash():
    detail = detail_of()
    context = fleet_context(fleet_figures(detail.gpus, {detail.agent.id: detail.agent}, usage_of({})))
    [faulty] = context["faulty"]
    assert faulty["agent_id"] == detail.agent.id and faulty["reason"].startswith("Xid 79")
    empty = figure_row(UnitFigures("none"))
    assert (empty.utilization, empty.memory, empty.busy_pct) == ("-", "-", 0.0)
