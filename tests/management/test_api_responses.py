"""The answers' structs (management/views/) and the functions that build the answers agree, field for field.

Each view's output is encoded and decoded as its struct: a key a view adds that the struct lacks, a key the struct
requires that the view drops, or a value of another type (a time left as a float, money as an integer) fails here,
before the OpenAPI document states a shape the API does not answer. The views are fed records with every optional
part set (a fault, telemetry, MIG instances, hosted replicas, bid changes, a quota) and with none; the views that need
the market's façade (a workload's terms, balances, statements, offers) are read through the real API on a real Master.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, TypeVar

import msgspec
import pytest

import management.views
from agent.simulate import SimulatedCollector
from common.inventory import GpuSample, MigInstance
from management.market.ledger import HostEarnings, PeriodEarnings, Statement, StatementLine, WorkloadSpend
from management.market.prices import HostPrice
from management.scheduler.model import Explanation, FilterCount, QuotaCheck
from management.services.hosts import HostedReplica
from management.services.market import FundsDetail, RentalDetail, Statements
from management.views.accounts import (
    AccountView,
    ApiKeyView,
    IssuedApiKeyView,
    WhoamiView,
    account_view,
    api_key_view,
    issued_api_key_view,
    whoami_view,
)
from management.views.grid import (
    CommandAccepted,
    CommandView,
    EventView,
    SigningKeyView,
    TokenView,
    command_accepted_view,
    command_view,
    event_view,
    signing_key_view,
    token_view,
)
from management.views.hosts import AgentPage, AgentView, GpuPage, GpuView, TierPage, agent_view, gpu_view
from management.views.market import (
    Credited,
    EarningsStatements,
    FundsView,
    LedgerEntryView,
    OfferSearch,
    OfferView,
    PayoutStatements,
    RentalPage,
    RentalView,
    SpendStatements,
    StatementView,
    earnings_view,
    funds_view,
    ledger_entry_view,
    payouts_view,
    rental_view,
    spend_view,
    statement_view,
)
from management.views.prices import (
    HostPriceView,
    PriceListing,
    PriceRecordView,
    host_price_view,
    price_listing_view,
    price_record_view,
)
from management.views.workloads import ExplanationView, WorkloadDetail, WorkloadPage, WorkloadView, explanation_view
from master.accounts import AccountRole
from master.keys import KeyState, SigningKeyInfo
from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuFault,
    GpuRecord,
    LedgerEntry,
    LedgerLine,
    PriceChange,
    PriceRecord,
    RentalHost,
    RentalRecord,
    TokenRecord,
)
from tests.management.hosts import HOST, add_agent, api_key

# Every module of the answers (management/views/): base's page structs are made in base, the rest where they are named.
VIEW_MODULES = [importlib.import_module(f"management.views.{m.name}") for m in pkgutil.iter_modules(management.views.__path__)]
# Answers the document states with additional properties allowed, as they always were (moved here from the services and
# the links' handlers; holding them to the rule would change the published document).
OPEN_ANSWERS = {"LinkList", "LinkView", "MintedToken", "TemplateList"}

NOW = 1795380123.25
ViewT = TypeVar("ViewT", bound=msgspec.Struct)


def conforms(view: Any, struct: type[ViewT]) -> ViewT:
    """The view as the API sends it (JSON), decoded as its struct: ValidationError names the field that disagrees."""
    return msgspec.json.decode(msgspec.json.encode(view), type=struct)


def gpus(agent_id: str = "agt-1") -> list[GpuRecord]:
    infos = SimulatedCollector("a100:2", host_key=agent_id).inventory()
    mig = msgspec.structs.replace(
        infos[1], mig_enabled=True, mig_instances=[MigInstance(uuid="MIG-1", profile="1g.10gb", memory_mib=9984)]
    )
    return [
        GpuRecord(
            uuid=infos[0].uuid,
            agent_id=agent_id,
            index=0,
            model="a100-sxm4-80gb",
            info=infos[0],
            state="faulty",
            tier="gold",
            flags=("vram_mismatch",),
            updated_at=NOW,
            fault=GpuFault(kind="xid", reason="Xid 79", since=NOW, code=79),
        ),
        GpuRecord(uuid=mig.uuid, agent_id=agent_id, index=1, model="", info=mig, state="available"),
    ]


def test_a_gpu_view_with_and_without_its_optional_parts_conforms():
    faulty, partitioned = gpus()
    sample = GpuSample(uuid=faulty.uuid, ts=NOW, temperature_c=91.0, power_w=300.0, clock_sm_mhz=1400)
    view = conforms(gpu_view(faulty, sample, offered=True, holders={faulty.uuid: "c-1"}), GpuView)
    assert view.telemetry is not None and view.telemetry.ts == "2026-11-22T20:42:03.250Z"
    view = conforms(gpu_view(partitioned, holders={"MIG-1": "c-2"}), GpuView)
    assert view.mig.instances[0].held_by == "c-2" and view.telemetry is None


def test_an_agent_view_with_and_without_its_optional_parts_conforms():
    bare = AgentRecord(id="agt-0", provider="acme", state="enrolled")
    assert conforms(agent_view(bare, []), AgentView).host is None
    agent = AgentRecord(
        id="agt-1",
        provider="acme",
        state="ready",
        region="eu",
        relay="relay-1",
        host=HOST,
        simulated=True,
        runtime="docker",
        isolation="container",
        enrolled_at=NOW,
        last_seen=NOW,
        connected_since=NOW,
        cert_serial="ab",
        cert_not_after=NOW,
        containers={"c-1": ["GPU-1"]},
        exited={"c-0": 1},
    )
    replica = HostedReplica("wl-1", "train", "busybox", 0, ["GPU-1"], "c-1", "running", "running", NOW)
    view = conforms(agent_view(agent, gpus(), reachable=True, workloads=[replica]), AgentView)
    assert (view.workloads[0].started_at, view.exited) == ("2026-11-22T20:42:03.250Z", {"c-0": 1})


def test_command_token_event_and_signing_key_views_conform():
    command = CommandRecord(
        id="cmd-1",
        agent_id="agt-1",
        kind="delete_container",
        spec={"name": "x"},
        state="succeeded",
        created_at=NOW,
        deadline=NOW + 60,
        sent_at=NOW,
        acked_at=NOW,
        finished_at=NOW,
        result={"exit": 0},
        error=None,
        key_id="sk-1",
    )
    conforms(command_view(command), CommandView)
    conforms(
        command_view(CommandRecord(id="cmd-2", agent_id="a", kind="k", spec={}, state="pending", created_at=NOW, deadline=0)),
        CommandView,
    )
    conforms(command_accepted_view(command), CommandAccepted)
    conforms(token_view("igjt_x", TokenRecord(token_hash="h", provider="acme", created_at=NOW, expires_at=NOW + 60)), TokenView)
    conforms(
        event_view(EventRecord(ts=NOW, kind="agent.transition", subject="agt-1", data={"to": "ready", "n": 1}, seq=3)),
        EventView,
    )
    for retired in (None, NOW):
        conforms(signing_key_view(SigningKeyInfo("sk-1", "cHVi", KeyState.RETIRED, NOW, retired)), SigningKeyView)


def test_account_key_and_whoami_views_conform():
    account = AccountRecord(
        id="bob",
        role="renter",
        name="Bob",
        created_at=NOW,
        share=2.0,
        project_shares={"a": 1.0},
        gpu_quota=4,
        tier_quotas={"gold": 2},
        updated_at=NOW,
    )
    conforms(account_view(account), AccountView)
    conforms(account_view(AccountRecord(id="acme", role="provider")), AccountView)
    key = ApiKeyRecord(key_hash="h", name="ci", role="", created_at=NOW, subject="bob", key_id="key-1", revoked_at=NOW)
    conforms(api_key_view(key), ApiKeyView)
    assert conforms(issued_api_key_view("igak_secret", key), IssuedApiKeyView).key == "igak_secret"
    conforms(whoami_view("bob", "renter", "key-1", "ci", "Bob"), WhoamiView)
    with pytest.raises(msgspec.ValidationError, match="key"):  # the drift this file exists to catch: a missing field
        conforms(api_key_view(key), IssuedApiKeyView)


def test_an_explanation_with_and_without_a_quota_conforms():
    full = Explanation(
        "wl-1",
        2,
        3,
        ahead=["wl-0"],
        filters=[FilterCount("model", 3, 0, "a100")],
        quota=QuotaCheck("gpus", 4, 4, 1),
        blocked_by="wl-0",
        reserved_start=NOW,
        estimated_start=NOW,
        cannot_fit="no host has 9 GPUs",
        summary="Waits.",
    )
    conforms(explanation_view(full), ExplanationView)
    conforms(explanation_view(Explanation("wl-2", 1, 1)), ExplanationView)


def test_price_views_conform():
    record = PriceRecord(
        provider="acme",
        agent_id="agt-1",
        on_demand=2_500_000,
        min_bid=400_000,
        reserved_discount=0.2,
        max_duration_s=86400.0,
        updated_at=NOW,
    )
    default = PriceRecord(provider="acme", on_demand=1_000_000)
    assert conforms(price_record_view(default, "credits"), PriceRecordView).agent_id is None
    conforms(host_price_view("agt-1", "acme", HostPrice(on_demand=2_500_000, min_bid=1, source="host"), "credits"), HostPriceView)
    conforms(price_listing_view([record, default], HostPrice(on_demand=1_000_000), "credits"), PriceListing)


def test_money_views_conform():
    conforms(funds_view(FundsDetail("bob", 100_000_000, 2_000_000, 1_500_000, "credits", "low")), FundsView)
    conforms(funds_view(FundsDetail("bob", 0, 0, 0, "credits")), FundsView)
    entry = LedgerEntry(
        key="credit:1",
        ts=NOW,
        kind="credit",
        memo="seed",
        seq=1,
        rental="wl-1-a1",
        lines=[
            LedgerLine(account="renter:bob", amount=5_000_000, host="agt-1", workload="wl-1"),
            LedgerLine(account="external", amount=-5_000_000),
        ],
    )
    conforms(ledger_entry_view(entry), LedgerEntryView)
    line = StatementLine(seq=1, ts=NOW, key="k", kind="charge", memo="", rental="", workload="wl-1", amount=-125, balance=10)
    statement = Statement(accounts=["renter:bob"], after_seq=0, opening=0, closing=10, lines=[line], next_after=1, more=False)
    conforms(statement_view(statement, "credits"), StatementView)
    spend = Statements("bob", "credits", [WorkloadSpend(workload="wl-1", charged=3, refunded=1, net=2)])
    conforms(spend_view(spend), SpendStatements)
    earnings = Statements("acme", "credits", [HostEarnings(agent_id="agt-1", gross=10, fee=1, refunded=0, net=9)])
    conforms(earnings_view(earnings), EarningsStatements)
    period = PeriodEarnings(label="2026-11-23", start=NOW, end=NOW + 86400, gross=10, fee=1, refunded=0, net=9)
    conforms(payouts_view(Statements("acme", "credits", [period])), PayoutStatements)


def test_a_rental_view_conforms_for_its_renter_and_for_its_provider():
    rental = RentalRecord(
        id="wl-1-a1",
        workload_id="wl-1",
        account="bob",
        kind="interruptible",
        hosts=[RentalHost(agent_id="agt-1", provider="acme", gpus=2, price=400_000)],
        bid_changes=[PriceChange(at=NOW, price=500_000)],
        started_at=NOW,
        ended_at=NOW + 10,
        end_reason="cancelled",
        host_failure="agt-1: offline",
        reserved_until=None,
        rating=4,
    )
    detail = RentalDetail(rental, 1_234, "credits")
    assert conforms(rental_view(detail, for_provider=False), RentalView).account == "bob"
    assert conforms(rental_view(detail, for_provider=True), RentalView).account is msgspec.UNSET


# --- the views that need the market's façade, through the real API ---------------------------------------------------


async def test_the_market_and_workload_answers_of_a_real_master_conform(api):
    await add_agent(api.master, "agt-1", "a10:2", provider="acme", runtime="docker", isolation="container")
    await api.master.accounts.ensure("acme", AccountRole.PROVIDER)
    renter = await api_key(api.master, "renter", "bob")

    async def answer(method: str, path: str, struct: type[msgspec.Struct], headers=None, json=None, status=200):
        response = await api.request(method, path, headers=headers or api.auth, json=json)
        assert response.status == status, await response.text()
        return conforms(await response.json(), struct)

    await answer(
        "PUT", "/api/v1/prices/default", PriceRecordView, json={"provider": "acme", "on_demand": "2.00", "min_bid": "0.5"}
    )
    await answer("POST", "/api/v1/accounts/bob/credit", Credited, json={"amount": "50"}, status=201)
    offers = await answer("GET", "/api/v1/offers", OfferSearch, headers=renter)
    assert [o.id for o in offers.offers] == ["agt-1"]
    await answer("GET", "/api/v1/offers/agt-1", OfferView, headers=renter)
    await answer("GET", "/api/v1/offers?q=price<0.01", OfferSearch, headers=renter)  # emptied_by set
    spec = {"name": "train", "image": "busybox", "env": {"TOKEN": "secret"}}
    submitted = await answer("POST", "/api/v1/workloads", WorkloadView, headers=renter, json=spec, status=201)
    assert submitted.spec.env == ["TOKEN"]
    bid = {"spec": {**spec, "name": "cheap", "rental": {"kind": "interruptible", "bid": "0.60"}}}
    rented = await answer("POST", "/api/v1/offers/agt-1/rent", WorkloadView, headers=renter, json=bid, status=201)
    await answer("POST", f"/api/v1/workloads/{rented.id}/bid", WorkloadView, headers=renter, json={"bid": "0.70"})
    detail = await answer("GET", f"/api/v1/workloads/{submitted.id}", WorkloadDetail, headers=renter)
    assert detail.rental.summary
    await answer("GET", "/api/v1/workloads", WorkloadPage, headers=renter)
    await answer("GET", "/api/v1/accounts/bob/balance", FundsView, headers=renter)
    await answer("GET", "/api/v1/accounts/bob/ledger", StatementView, headers=renter)
    await answer("GET", "/api/v1/accounts/bob/spend", SpendStatements, headers=renter)
    await answer("GET", "/api/v1/accounts/acme/earnings", EarningsStatements)
    await answer("GET", "/api/v1/accounts/acme/payouts?period=week", PayoutStatements)
    await answer("GET", "/api/v1/rentals", RentalPage, headers=renter)
    await answer("GET", "/api/v1/prices", PriceListing)
    await answer("GET", "/api/v1/agents/agt-1/price", HostPriceView, headers=renter)
    await answer("GET", "/api/v1/tiers", TierPage, headers=renter)
    await answer("GET", "/api/v1/agents", AgentPage)
    await answer("GET", "/api/v1/gpus", GpuPage)
    await answer("GET", "/api/v1/whoami", WhoamiView, headers=renter)
    await answer("POST", f"/api/v1/workloads/{submitted.id}/cancel", WorkloadView, headers=renter)


def test_every_view_struct_forbids_unknown_fields():
    """So the document says ``additionalProperties: false`` and schemathesis holds the server to each field."""
    views = [
        v
        for module in VIEW_MODULES
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == module.__name__
    ]
    assert len(views) > 40
    assert {v.__name__ for v in views if not v.__struct_config__.forbid_unknown_fields} == OPEN_ANSWERS
