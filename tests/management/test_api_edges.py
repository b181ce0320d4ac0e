"""What a hostile client sends the API, against a real Master (SQLite in a temp dir) behind the real aiohttp app.

Each test is a defect found by a hostile tester: the answer is a 400 (or 409) naming what is wrong, nothing
is stored, and the Master goes on serving.
"""

from __future__ import annotations

import re

import msgspec
import pytest

from common.inventory import GpuPartition, UnofferedGpu
from management.http.schemas import json_schemas
from tests.management.hosts import add_agent

DELETE_X = {"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}}
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


async def commands_stored(api) -> list[dict]:
    return (await (await api.get("/api/v1/commands", headers=api.auth)).json())["items"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_a_command_timeout_that_is_not_a_finite_number_is_refused_and_nothing_is_stored(api, number):
    await add_agent(api.master, "agt-a", "a10:1")
    body = '{"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}, "timeout_s": ' + number + "}"
    response = await api.post("/api/v1/commands", data=body, headers={**api.auth, "Content-Type": "application/json"})
    assert response.status == 400
    assert (await response.json())["error"]["code"] in ("bad_json", "bad_request")
    assert await commands_stored(api) == []


@pytest.mark.parametrize("query", ["limit=nan", "limit=inf", "limit=1.5", "limit=true", "after=Infinity", "after=NaN"])
async def test_non_finite_or_non_integer_numbers_in_a_query_string_are_refused(api, query):
    response = await api.get(f"/api/v1/events?{query}", headers=api.auth)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "bad_request"


async def test_json_nested_a_thousand_deep_is_a_400_not_a_500(api):
    await add_agent(api.master, "agt-a", "a10:1")
    deep = '{"agent_id": "agt-a", "kind": "delete_container", "spec": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}"
    response = await api.post("/api/v1/commands", data=deep, headers={**api.auth, "Content-Type": "application/json"})
    assert response.status == 400
    assert "nested too deeply" in (await response.json())["error"]["message"]
    assert (await api.get("/healthz")).status == 200


async def test_an_event_sequence_number_of_thirty_digits_is_a_400_naming_the_parameter(api):
    response = await api.get("/api/v1/events?after=" + "9" * 30, headers=api.auth)
    assert response.status == 400
    assert "after" in (await response.json())["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/tokens", {"provider": "acme", "ttl_s": True}, "ttl_s"),
        ("/api/v1/commands", {**DELETE_X, "timeout_s": True}, "timeout_s"),
        ("/api/v1/tokens", {"provider": 7}, "provider"),
    ],
)
async def test_booleans_are_not_numbers_and_numbers_are_not_strings(api, path, body, field):
    await add_agent(api.master, "agt-a", "a10:1")
    response = await api.post(path, json=body, headers=api.auth)
    assert response.status == 400
    assert (await response.json())["error"]["message"].startswith(f"{field}:")


@pytest.mark.parametrize(
    "provider",
    ["x" * 65, "acme corp", "../etc", "acme\u202e", "", "-leading-dash"],
)
async def test_provider_names_are_bounded_in_length_and_characters(api, provider):
    response = await api.post("/api/v1/tokens", json={"provider": provider, "ttl_s": 60}, headers=api.auth)
    assert response.status == 400
    assert (await response.json())["error"]["message"].startswith("provider:")


async def test_filters_naming_a_region_or_provider_are_bounded_too(api):
    for query, field in (("region=" + "r" * 65, "region"), ("provider=a%20b", "provider"), ("agent_id=%00", "agent_id")):
        path = "/api/v1/gpus" if field == "agent_id" else "/api/v1/agents"
        response = await api.get(f"{path}?{query}", headers=api.auth)
        assert response.status == 400, query
        assert (await response.json())["error"]["message"].startswith(f"{field}:")


@pytest.mark.parametrize(
    ("path", "valid"),
    [
        ("/api/v1/agents?state=bogus", "enrolled, ready, busy, maintenance, offline, quarantined, retired"),
        ("/api/v1/gpus?state=bogus", "available, reserved, busy, faulty, offline"),
        ("/api/v1/commands?state=pending&state=bogus", "pending, sent, acked, succeeded, failed, timed_out, cancelled"),
    ],
)
async def test_an_unknown_filter_value_is_a_400_listing_the_valid_ones(api, path, valid):
    response = await api.get(path, headers=api.auth)
    assert response.status == 400
    assert valid in (await response.json())["error"]["message"]


async def test_an_unknown_query_parameter_is_refused_rather_than_ignored(api):
    response = await api.get("/api/v1/gpus?stat=available", headers=api.auth)
    assert response.status == 400
    assert "stat" in (await response.json())["error"]["message"]


async def test_every_timestamp_in_a_response_is_an_rfc3339_utc_string(api):
    await add_agent(api.master, "agt-a", "a10:1")
    accepted = await (await api.post("/api/v1/commands", json=DELETE_X, headers=api.auth)).json()
    command = await (await api.get(f"/api/v1/commands/{accepted['id']}", headers=api.auth)).json()
    agent = await (await api.get("/api/v1/agents/agt-a", headers=api.auth)).json()
    [event, *_] = (await (await api.get("/api/v1/events", headers=api.auth)).json())["items"]
    await api.post("/api/v1/accounts", json={"id": "acme", "role": "provider"}, headers=api.auth)
    token = await (await api.post("/api/v1/tokens", json={"provider": "acme"}, headers=api.auth)).json()
    [key] = (await (await api.get("/api/v1/signing-keys", headers=api.auth)).json())["items"]
    stamps = [
        command["created_at"],
        command["deadline"],
        agent["enrolled_at"],
        agent["last_seen"],
        agent["connected_since"],
        agent["gpus"][0]["updated_at"],
        event["ts"],
        token["expires_at"],
        key["created_at"],
    ]
    assert all(isinstance(s, str) and RFC3339_UTC.match(s) for s in stamps), stamps
    assert command["sent_at"] is None and key["retired_at"] is None  # what has not happened is null, not 0 or 1970


async def test_the_agent_view_shows_runtime_isolation_and_reachability(api):
    await add_agent(api.master, "agt-a", "a10:1", runtime="process", isolation="sandbox")
    await add_agent(api.master, "agt-b", "a10:1")  # an agent older than the fields
    a = await (await api.get("/api/v1/agents/agt-a", headers=api.auth)).json()
    b = await (await api.get("/api/v1/agents/agt-b", headers=api.auth)).json()
    assert (a["runtime"], a["isolation"], a["reachable"]) == ("process", "sandbox", False)  # no relay link carries it
    assert (b["runtime"], b["isolation"]) == (None, None)


async def test_the_agent_view_names_the_cards_its_host_does_not_offer_and_why(api):
    """Issue 41: a card the agent sees on the bus and no binding reads is shown with the reason and the fix."""
    missing = UnofferedGpu(
        pci_bus_id="0000:03:00.0",
        vendor="amd",
        device_id="0x744c",
        kind="no_driver",
        reason="no kernel driver is bound to it",
        fix="install AMD's amdgpu driver",
    )
    await add_agent(api.master, "agt-a", "a10:1", runtime="docker", isolation="container", unoffered=[missing])
    await add_agent(api.master, "agt-b", "a10:1")  # an agent older than the field, or a host with nothing unoffered
    a = await (await api.get("/api/v1/agents/agt-a", headers=api.auth)).json()
    b = await (await api.get("/api/v1/agents/agt-b", headers=api.auth)).json()
    assert a["unoffered_gpus"] == [msgspec.to_builtins(missing)]
    assert [g["offered"] for g in a["gpus"]] == [True]  # the card it does offer is unchanged
    assert b["unoffered_gpus"] == []


async def test_process_runtime_hosts_are_not_offered_to_renters_unless_the_operator_allows_it(api):
    await add_agent(api.master, "agt-engine", "a10:1", runtime="docker", isolation="container")
    await add_agent(api.master, "agt-sandbox", "a10:1", runtime="process", isolation="sandbox")
    await add_agent(api.master, "agt-bare", "a10:1", runtime="process", isolation="none")

    async def offered_hosts() -> list[str]:
        page = await (await api.get("/api/v1/gpus?offered=true", headers=api.auth)).json()
        return sorted(g["agent_id"] for g in page["items"])

    every = await (await api.get("/api/v1/gpus", headers=api.auth)).json()
    assert {g["state"] for g in every["items"]} == {"available"}  # all free; only the engine host's is offered
    assert await offered_hosts() == ["agt-engine"]
    sandbox = await (await api.get("/api/v1/agents/agt-sandbox", headers=api.auth)).json()
    assert [g["offered"] for g in sandbox["gpus"]] == [False]

    api.master.config.offer_sandboxed_hosts = True  # as `offer_sandboxed_hosts = true` in the Master's config
    assert await offered_hosts() == ["agt-engine", "agt-sandbox"]  # a host with no isolation never is
    not_offered = await (await api.get("/api/v1/gpus?offered=false", headers=api.auth)).json()
    assert [g["agent_id"] for g in not_offered["items"]] == ["agt-bare"]


async def test_drain_answers_the_agent_view(api):
    await add_agent(api.master, "agt-a", "a10:1")
    response = await api.post("/api/v1/agents/agt-a/drain", headers=api.auth)
    assert response.status == 200
    drained = await response.json()
    assert (drained["id"], drained["state"], drained["drained"], len(drained["gpus"])) == ("agt-a", "maintenance", True, 1)


async def test_undrain_brings_a_drained_agent_back_and_answers_its_view(api):
    await add_agent(api.master, "agt-a", "a10:1")
    await api.post("/api/v1/agents/agt-a/drain", headers=api.auth)
    response = await api.post("/api/v1/agents/agt-a/undrain", headers=api.auth)
    assert response.status == 200
    undrained = await response.json()
    assert (undrained["id"], undrained["drained"]) == ("agt-a", False)
    assert undrained["state"] != "maintenance"
    assert (await api.post("/api/v1/agents/agt-nobody/undrain", headers=api.auth)).status == 404


async def test_a_create_container_naming_a_gpu_not_on_the_host_is_a_409_with_a_clear_message(api):
    await add_agent(api.master, "agt-a", "a10:1")
    spec = {"name": "job", "image": "busybox", "gpus": ["GPU-not-on-this-host"]}
    response = await api.post(
        "/api/v1/commands", json={"agent_id": "agt-a", "kind": "create_container", "spec": spec}, headers=api.auth
    )
    assert response.status == 409
    error = (await response.json())["error"]
    assert error["code"] == "conflict" and "GPU-not-on-this-host" in error["message"]


async def test_the_master_goes_on_serving_after_every_refusal(api):
    await add_agent(api.master, "agt-a", "a10:1")
    for body in ('{"timeout_s": NaN}', "[" * 5000, '{"agent_id": "agt-a"', "\xff\xfe"):
        response = await api.post("/api/v1/commands", data=body, headers={**api.auth, "Content-Type": "application/json"})
        assert response.status == 400
    accepted = await api.post("/api/v1/commands", json=DELETE_X, headers=api.auth)
    assert accepted.status == 202


def test_the_request_schemas_publish_their_bounds_as_json_schema():
    schemas = json_schemas()
    timeout = schemas["CreateCommand"]["properties"]["timeout_s"]["anyOf"][0]
    assert (timeout["type"], timeout["exclusiveMinimum"], timeout["maximum"]) == ("number", 0, 7 * 86400)
    provider = schemas["CreateToken"]["properties"]["provider"]
    assert (provider["maxLength"], provider["pattern"]) == (64, "^[A-Za-z0-9][A-Za-z0-9._-]*$")
    assert set(schemas["CreateCommand"]["required"]) == {"agent_id", "kind", "spec"}


@pytest.mark.parametrize(
    "body",
    [
        b'{"agent_id": "agt-\xff", "kind": "delete_container", "spec": {"name": "x"}}',
        b'{"agent_id": "\xc3", "kind": "delete_container", "spec": {}}',
    ],
    ids=["invalid-start-byte", "cut-short-sequence"],
)
async def test_invalid_utf8_in_a_json_body_is_a_400_not_a_500(api, body):
    await add_agent(api.master, "agt-a", "a10:1")
    response = await api.post("/api/v1/commands", data=body, headers={**api.auth, "Content-Type": "application/json"})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "bad_json"
    assert "UTF-8" in error["message"]
    assert await commands_stored(api) == []
    assert (await api.get("/healthz")).status == 200


async def test_the_agent_view_reports_amd_partition_modes_and_a_partitioned_card_it_does_not_sell(api):
    """Issue 41: an MI300X's partition modes are shown (a whole card, SPX, is sold as one GPU); a card split into CPX
    partitions is among the cards not offered, with its modes."""
    cpx = GpuPartition(compute="CPX", memory="NPS4", compute_modes=("SPX", "CPX"), memory_modes=("NPS1", "NPS4"))
    split = UnofferedGpu(
        pci_bus_id="0000:26:00.0", vendor="amd", name="AMD Instinct MI300X", kind="partitioned", reason="split", partition=cpx
    )
    await add_agent(api.master, "agt-amd", "mi300x:2", runtime="docker", isolation="container", unoffered=[split])
    await add_agent(api.master, "agt-nv", "a10:1", runtime="docker", isolation="container")
    amd = await (await api.get("/api/v1/agents/agt-amd", headers=api.auth)).json()
    nvidia = await (await api.get("/api/v1/agents/agt-nv", headers=api.auth)).json()
    assert [g["partition"]["compute"] + "/" + g["partition"]["memory"] for g in amd["gpus"]] == ["SPX/NPS1", "SPX/NPS1"]
    assert [g["offered"] for g in amd["gpus"]] == [True, True]  # whole cards: sold as before
    assert amd["unoffered_gpus"][0]["kind"] == "partitioned" and amd["unoffered_gpus"][0]["partition"]["compute"] == "CPX"
    assert nvidia["gpus"][0]["partition"] is None
