"""The operator API on a real Master (SQLite store in a temp dir): authentication, JSON errors, filters."""

import asyncio
import time

import pytest

import master.metrics as metrics
from agent.simulate import SimulatedCollector
from tests.management.hosts import add_agent
from tests.support.prometheus import samples


async def test_every_api_call_needs_an_operator_key(api):
    for headers in ({}, {"Authorization": "Bearer igak_wrong"}, {"Authorization": "Basic abc"}):
        response = await api.get("/api/v1/agents", headers=headers)
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "unauthorized"
    assert (await api.get("/healthz")).status == 200


async def test_agents_are_listed_with_state_region_relay_tiered_gpus_and_reputation(api):
    await add_agent(api.master, "agt-a", "h100:2")
    await add_agent(api.master, "agt-b", "rtx-4090:1")
    body = await (await api.get("/api/v1/agents", headers=api.auth)).json()
    assert [a["id"] for a in body["items"]] == ["agt-a", "agt-b"]
    a = body["items"][0]
    assert (a["state"], a["region"], a["relay"]) == ("ready", "eu-west", "relay-1")
    assert len(a["gpus"]) == 2 and all(g["tier"] for g in a["gpus"])
    assert set(a["reputation"]["components"]) == {
        "uptime",
        "command_success",
        "container_success",
        "rentals",
        "verification",
        "ratings",
    }
    # every GPU tiered, none flagged, none measured (simulated GPUs never are: docs/verification.md): 0.5
    assert a["reputation"]["components"]["verification"] == 0.5
    assert {g["verification"]["label"] for g in a["gpus"]} == {"simulated"}
    one = await (await api.get("/api/v1/agents/agt-b", headers=api.auth)).json()
    assert one["gpus"][0]["model"] == "rtx-4090"
    missing = await api.get("/api/v1/agents/agt-zzz", headers=api.auth)
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "not_found"


async def test_gpus_filter_by_tier_model_and_state(api):
    await add_agent(api.master, "agt-a", "h100:2")
    await add_agent(api.master, "agt-b", "t4:3")
    everything = (await (await api.get("/api/v1/gpus", headers=api.auth)).json())["items"]
    assert len(everything) == 5
    t4_tier = next(g["tier"] for g in everything if g["model"] == "t4")
    by_tier = (await (await api.get(f"/api/v1/gpus?tier={t4_tier}", headers=api.auth)).json())["items"]
    assert {g["model"] for g in by_tier} == {"t4"}
    by_model = (await (await api.get("/api/v1/gpus?model=h100-sxm&state=available", headers=api.auth)).json())["items"]
    assert len(by_model) == 2
    tiers = (await (await api.get("/api/v1/tiers", headers=api.auth)).json())["items"]
    assert t4_tier in {t["name"] for t in tiers}


async def test_hosts_filter_by_the_tier_and_model_of_their_gpus(api):
    await add_agent(api.master, "agt-a", "h100:2")
    await add_agent(api.master, "agt-b", "t4:3")
    t4_tier = (await (await api.get("/api/v1/gpus?model=t4", headers=api.auth)).json())["items"][0]["tier"]
    by_model = (await (await api.get("/api/v1/agents?model=h100-sxm", headers=api.auth)).json())["items"]
    by_tier = (await (await api.get(f"/api/v1/agents?tier={t4_tier}", headers=api.auth)).json())["items"]
    assert [a["id"] for a in by_model] == ["agt-a"] and [a["id"] for a in by_tier] == ["agt-b"]
    none = await (await api.get("/api/v1/agents?model=h100-sxm&tier=" + t4_tier, headers=api.auth)).json()
    assert none["items"] == []
    bad = await api.get("/api/v1/agents?model=not%20a%20model", headers=api.auth)
    assert bad.status == 400 and "model" in (await bad.json())["error"]["message"]


async def test_join_tokens_are_created_for_a_provider_and_stored_only_hashed(api, tmp_path):
    await api.post("/api/v1/accounts", json={"id": "acme", "role": "provider"}, headers=api.auth)
    response = await api.post("/api/v1/tokens", json={"provider": "acme", "ttl_s": 60}, headers=api.auth)
    assert response.status == 201
    token = (await response.json())["token"]
    for path in tmp_path.glob("master.db*"):
        assert token.encode() not in path.read_bytes()
    for bad in ({}, {"provider": ""}, {"provider": "acme", "ttl_s": -1}):
        refused = await api.post("/api/v1/tokens", json=bad, headers=api.auth)
        assert refused.status == 400 and "error" in await refused.json()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("not json", 400, "bad_json"),
        ({"agent_id": "agt-a"}, 400, "bad_request"),
        ({"agent_id": "agt-nobody", "kind": "create_container", "spec": {}}, 404, "not_found"),
        ({"agent_id": "agt-a", "kind": "format_disk", "spec": {}}, 400, "invalid_command"),
        ({"agent_id": "agt-a", "kind": "create_container", "spec": {"name": "x"}}, 400, "invalid_command"),
        (
            {"agent_id": "agt-a", "kind": "create_container", "spec": {"name": "x", "image": "i", "privileged": True}},
            400,
            "invalid_command",
        ),
    ],
)
async def test_bad_commands_get_clear_json_errors(api, body, status, code):
    await add_agent(api.master, "agt-a", "a10:1")
    kwargs = {"data": body} if isinstance(body, str) else {"json": body}
    response = await api.post("/api/v1/commands", headers=api.auth, **kwargs)
    assert response.status == status
    assert (await response.json())["error"]["code"] == code


async def test_a_malformed_spec_is_refused_at_the_edge_naming_its_field_after_the_host_is_checked(api):
    """The API makes the raw spec typed once (services/grid.py); what it answers is what the command ledger answered
    when it checked the dict itself: the host first (unknown 404, retired 409), then the spec, naming the field."""
    await add_agent(api.master, "agt-a", "a10:1")
    bad = {"agent_id": "agt-a", "kind": "create_container", "spec": {"name": "not a name!", "image": "i"}}
    refused = await api.post("/api/v1/commands", headers=api.auth, json=bad)
    assert refused.status == 400
    error = (await refused.json())["error"]
    assert error["code"] == "invalid_command"
    assert error["message"].startswith("invalid create_container spec: Expected `str` matching regex")
    assert error["message"].endswith("- at `$.name`")
    await api.post("/api/v1/agents/agt-a/revoke", headers=api.auth)
    assert (await api.post("/api/v1/commands", headers=api.auth, json=bad)).status == 409
    assert (await api.master.list_commands(agent_id="agt-a")) == []


async def test_a_command_for_an_unreachable_agent_is_accepted_and_stays_pending(api):
    await add_agent(api.master, "agt-a", "a10:1")
    response = await api.post(
        "/api/v1/commands", headers=api.auth, json={"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}}
    )
    assert response.status == 202
    command_id = (await response.json())["id"]
    command = await (await api.get(f"/api/v1/commands/{command_id}", headers=api.auth)).json()
    assert command["state"] == "pending"
    assert (await api.get("/api/v1/commands/cmd-nope", headers=api.auth)).status == 404


async def test_drain_and_revoke_move_the_agent_and_are_recorded(api):
    await add_agent(api.master, "agt-a", "a10:1")
    drained = await (await api.post("/api/v1/agents/agt-a/drain", headers=api.auth)).json()
    assert drained["state"] == "maintenance"
    revoked = await (await api.post("/api/v1/agents/agt-a/revoke", headers=api.auth)).json()
    assert revoked["state"] == "retired"
    events = (await (await api.get("/api/v1/events?subject=agt-a&kind=agent.transition", headers=api.auth)).json())["items"]
    assert [e["data"]["new"] for e in events] == ["ready", "maintenance", "retired"]
    again = await api.post(
        "/api/v1/commands", headers=api.auth, json={"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}}
    )
    assert again.status == 409


async def test_metrics_and_unknown_routes(api):
    await add_agent(api.master, "agt-a", "l4:2")
    text = await (await api.get("/metrics")).text()
    assert 'idlegrid_agents{region="eu-west",state="ready"} 1.0' in text
    unknown = await api.get("/api/v1/nothing", headers=api.auth)
    assert unknown.status == 404 and (await unknown.json())["error"]["code"] == "not_found"


async def test_a_scrape_walks_the_gpus_in_slices_before_answering(api, monkeypatch):
    """/metrics awaits the fleet gauges' ``prepare`` (master/metrics.py): the GPUs are tallied a slice at a time,
    with the event loop free between slices, and the answer shows every GPU."""
    await add_agent(api.master, "agt-a", "l4:2")
    slices: list[int] = []
    add = metrics._GpuTally.add

    def counted(self, gpus, *args, **kwargs):
        gpus = list(gpus)
        slices.append(len(gpus))
        add(self, gpus, *args, **kwargs)

    monkeypatch.setattr(metrics, "PREPARE_SLICE", 1)
    monkeypatch.setattr(metrics._GpuTally, "add", counted)
    text = await (await api.get("/metrics")).text()
    assert slices == [1, 1]
    assert sum(value for _, value in samples(text, "idlegrid_gpus")) == 2


async def test_gpus_show_their_latest_telemetry_sample(api):
    await add_agent(api.master, "agt-a", "l4:1")
    [gpu] = api.master.registry.gpus_of("agt-a")
    sample = SimulatedCollector("l4:1", host_key="agt-a").sample()[0]
    api.master.telemetry.ingest("agt-a", [sample])
    [shown] = (await (await api.get("/api/v1/gpus", headers=api.auth)).json())["items"]
    assert shown["telemetry"]["utilization_pct"] == sample.utilization_pct
    assert shown["uuid"] == gpu.uuid == sample.uuid


async def test_a_command_nobody_answers_times_out_at_its_deadline(api):
    await add_agent(api.master, "agt-a", "a10:1")
    response = await api.post(
        "/api/v1/commands",
        headers=api.auth,
        json={"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}, "timeout_s": 0.2},
    )
    command_id = (await response.json())["id"]
    for _ in range(40):
        command = await (await api.get(f"/api/v1/commands/{command_id}", headers=api.auth)).json()
        if command["state"] != "pending":
            break
        await asyncio.sleep(0.1)
    assert command["state"] == "timed_out"
    assert "deadline" in command["error"]


async def test_a_read_of_a_command_can_wait_until_it_is_final_while_the_api_serves_others(api):
    await add_agent(api.master, "agt-a", "a10:1")
    body = {"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}, "timeout_s": 60}
    command_id = (await (await api.post("/api/v1/commands", headers=api.auth, json=body)).json())["id"]
    url = f"/api/v1/commands/{command_id}"
    # A short wait on a command that stays open answers with its state then.
    assert (await (await api.get(f"{url}?wait_s=0.1", headers=api.auth)).json())["state"] == "pending"
    waiting = asyncio.create_task(api.get(f"{url}?wait_s=15", headers=api.auth))
    await asyncio.sleep(0.2)
    other = await api.get("/api/v1/agents", headers=api.auth)  # served while the long read waits
    assert other.status == 200 and not waiting.done()
    [expired] = await api.master.commands.expire(time.time() + 120)  # the command ends (its deadline, here)
    assert expired == command_id
    answer = await asyncio.wait_for(waiting, 5)
    assert answer.status == 200 and (await answer.json())["state"] == "timed_out"
    # A final command is answered at once, wait or not.
    assert (await (await api.get(f"{url}?wait_s=15", headers=api.auth)).json())["state"] == "timed_out"


@pytest.mark.parametrize("wait", ["-1", "21", "nan", "inf", "soon", ""])
async def test_a_bad_wait_is_a_clear_400(api, wait):
    await add_agent(api.master, "agt-a", "a10:1")
    body = {"agent_id": "agt-a", "kind": "delete_container", "spec": {"name": "x"}}
    command_id = (await (await api.post("/api/v1/commands", headers=api.auth, json=body)).json())["id"]
    response = await api.get(f"/api/v1/commands/{command_id}?wait_s={wait}", headers=api.auth)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "bad_request" and "wait_s" in error["message"]
