"""Per-key rate limits (management/api/ratelimit.py): a token bucket per API key; a key over its limit gets 429
with Retry-After and the JSON error shape, and never slows another key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from management.api import ApiSettings
from management.api.ratelimit import KeyRateLimits
from management.app import api_app
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import api_key


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_gets_its_burst_at_once_then_its_rate_and_another_key_its_own_burst():
    clock = FakeClock()
    limits = KeyRateLimits(rate=2.0, burst=3, clock=clock)
    assert [limits.retry_after_s("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.retry_after_s("a") == pytest.approx(0.5)  # one request's worth at 2 a second
    assert [limits.retry_after_s("b") for _ in range(3)] == [0.0, 0.0, 0.0]  # "a" being out costs "b" nothing
    clock.now += 0.5
    assert limits.retry_after_s("a") == 0.0
    assert limits.retry_after_s("a") > 0


def test_a_limit_that_allows_nothing_is_refused_at_start():
    with pytest.raises(ValueError, match="rate > 0"):
        KeyRateLimits(rate=0, burst=10)


@pytest.fixture
async def limited(tmp_path) -> AsyncIterator[TestClient]:
    """The API with a burst of 3 and a refill too slow to matter within a test."""
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    client = TestClient(TestServer(api_app(master, ApiSettings(key_rate_per_s=0.01, key_burst=3))))
    await client.start_server()
    client.master = master  # type: ignore[attr-defined]
    yield client
    await client.close()
    await master.stop()


async def test_a_key_over_its_limit_gets_429_with_retry_after_and_another_key_is_served(limited):
    busy = await api_key(limited.master, "renter", "busy")
    calm = await api_key(limited.master, "renter", "calm")
    assert [(await limited.get("/api/v1/tiers", headers=busy)).status for _ in range(3)] == [200, 200, 200]
    refused = await limited.get("/api/v1/tiers", headers=busy)
    assert refused.status == 429
    assert int(refused.headers["Retry-After"]) >= 1
    error = (await refused.json())["error"]
    assert error["code"] == "rate_limited" and "retry in" in error["message"]
    assert (await limited.get("/api/v1/tiers", headers=calm)).status == 200
    assert (await limited.get("/healthz")).status == 200  # not an API call: no key, no limit


def test_the_limits_are_master_settings_from_a_file_or_the_environment(tmp_path):
    from management.app import MasterServer
    from master.config import load_master_config

    config = load_master_config(
        env={"IDLEGRID_MASTER_API_KEY_RATE_PER_S": "1e9", "IDLEGRID_MASTER_API_KEY_BURST": "1000000000"},
        overrides={"state_dir": str(tmp_path)},
    )
    settings = MasterServer(config).api_settings
    assert (settings.key_rate_per_s, settings.key_burst) == (1e9, 1_000_000_000)
    assert (ApiSettings().key_rate_per_s, ApiSettings().key_burst) == (20.0, 40)  # the defaults


def test_the_client_sends_a_429_again_after_its_retry_after_a_few_times_and_nothing_else():
    from management.client.api import MAX_RETRY_AFTER_S, RATE_LIMIT_RETRIES, retry_after_s

    assert retry_after_s(429, {"retry-after": "2"}, attempt=0) == 2.0
    assert retry_after_s(429, {"Retry-After": "3600"}, attempt=0) == MAX_RETRY_AFTER_S
    assert retry_after_s(429, {}, attempt=0) == 1.0
    assert retry_after_s(429, {"Retry-After": "1"}, attempt=RATE_LIMIT_RETRIES) is None  # then the 429 is the answer
    assert retry_after_s(503, {"Retry-After": "1"}, attempt=0) is None


async def test_the_client_waits_out_its_keys_limit_and_gets_its_answer(tmp_path):
    from management.client.api import AsyncApiClient

    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    server = TestServer(api_app(master, ApiSettings(key_rate_per_s=2.0, key_burst=1)))
    await server.start_server()
    key = (await api_key(master, "renter", "bob"))["Authorization"].removeprefix("Bearer ")
    try:
        async with AsyncApiClient(str(server.make_url("")), key) as client:
            first = await client.whoami()
            second = await client.whoami()  # over the limit: answered 429, sent again after Retry-After (1 s)
        assert first == second and second["account"] == "bob"
    finally:
        await server.close()
        await master.stop()


def test_the_keys_of_one_account_share_the_accounts_budget():
    clock = FakeClock()
    limits = KeyRateLimits(rate=10.0, burst=10, account_rate=1.0, account_burst=3, clock=clock)
    assert [limits.retry_after_s(key, "acct") for key in ("k1", "k2", "k3")] == [0.0, 0.0, 0.0]
    assert limits.verdict("k4", "acct") == (pytest.approx(1.0), "account")  # a fresh key buys nothing
    assert limits.retry_after_s("k5", "other") == 0.0  # another account has its own budget


async def test_an_account_minting_keys_gets_no_more_requests_than_its_own_limit(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    client = TestClient(TestServer(api_app(master, ApiSettings())))  # the default limits: 40 a key, 80 an account
    await client.start_server()
    try:
        keys = [await api_key(master, "renter", "greedy") for _ in range(4)]  # 4 keys: 160 by their limits alone
        calm = await api_key(master, "renter", "calm")
        answers = [await client.get("/api/v1/whoami", headers=keys[n % 4]) for n in range(160)]  # within every key's
        statuses = [answer.status for answer in answers]
        assert statuses[: ApiSettings().account_burst] == [200] * ApiSettings().account_burst
        assert 429 in statuses  # the account's limit holds, however many keys it spreads its requests over
        refused = answers[statuses.index(429)]
        assert "account 'greedy'" in (await refused.json())["error"]["message"]
        assert (await client.get("/api/v1/whoami", headers=calm)).status == 200
    finally:
        await client.close()
        await master.stop()


async def test_an_account_holds_at_most_the_configured_number_of_keys(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    client = TestClient(TestServer(api_app(master, ApiSettings(key_rate_per_s=1e6, key_burst=10**6))))
    await client.start_server()
    try:
        auth = await api_key(master, "renter", "minter")  # its first key
        limit = MasterConfig().api_keys_per_account
        for n in range(limit - 1):
            created = await client.post("/api/v1/accounts/minter/keys", json={"name": f"k{n}"}, headers=auth)
            assert created.status == 201
        refused = await client.post("/api/v1/accounts/minter/keys", json={"name": "one more"}, headers=auth)
        assert refused.status == 409
        assert "revoke one" in (await refused.json())["error"]["message"]
        listed = (await (await client.get("/api/v1/accounts/minter/keys?limit=100", headers=auth)).json())["items"]
        assert len(listed) == limit
        revoked = await client.post(f"/api/v1/keys/{listed[-1]['key_id']}/revoke", headers=auth)
        assert revoked.status == 200
        again = await client.post("/api/v1/accounts/minter/keys", json={"name": "in its place"}, headers=auth)
        assert again.status == 201
    finally:
        await client.close()
        await master.stop()


def test_an_endpoints_invocation_keys_share_its_own_bucket_and_no_api_keys():
    clock = FakeClock()
    limits = KeyRateLimits(rate=1.0, burst=1, endpoint_rate=2.0, endpoint_burst=3, clock=clock)
    assert [limits.endpoint_wait_s("ep-a") for _ in range(3)] == [0.0, 0.0, 0.0]  # past any key's burst of 1
    assert limits.endpoint_wait_s("ep-a") == pytest.approx(0.5)
    assert limits.endpoint_wait_s("ep-b") == 0.0  # another endpoint has its own
    assert limits.retry_after_s("k", "acct") == 0.0  # and no API key or account paid for ep-a's calls
    with pytest.raises(ValueError, match="rate > 0"):
        KeyRateLimits(rate=1.0, burst=1, endpoint_rate=0.0)


async def test_invocation_keys_meet_their_endpoints_limit_and_the_owners_api_key_its_own(tmp_path):
    """An endpoint's invocation keys (two of them) get the endpoint's burst together, well past an API key's; the owner's
    API key on the same routes keeps its key's limit, and another endpoint's keys are not slowed."""
    import aiohttp

    from management.app import MasterServer

    config = MasterConfig(
        state_dir=str(tmp_path), link_port=0, api_port=0, api_key_burst=6, api_key_rate_per_s=0.01,
        api_account_burst=100, endpoint_burst=10, endpoint_rate_per_s=0.01,
    )  # fmt: skip
    server = MasterServer(config)
    await server.start()
    try:
        operator = {"Authorization": f"Bearer {server.operator_token_file.read_text().strip()}"}
        owner = await api_key(server.master, "renter", "ana")
        spec = {"image": "none", "command": ["python", "h.py"], "constraints": {"allow_process_runtime": True}}
        async with aiohttp.ClientSession(server.api_url) as http:

            async def call(method: str, path: str, headers: dict[str, str], body: object = None) -> tuple[int, object]:
                async with http.request(method, path, headers=headers, json=body) as answer:
                    return answer.status, await answer.json()

            keys: dict[str, list[dict[str, str]]] = {}
            for name in ("a", "b"):
                status, made = await call("POST", "/api/v1/endpoints", operator, spec | {"name": name, "account": "ana"})
                assert status == 201, made
                assert isinstance(made, dict)
                keys[made["id"]] = []
                for n in range(2):
                    _, key = await call("POST", f"/api/v1/endpoints/{made['id']}/keys", operator, {"name": f"k{n}"})
                    assert isinstance(key, dict)
                    keys[made["id"]].append({"Authorization": f"Bearer {key['key']}"})
            (a, a_keys), (b, b_keys) = keys.items()
            statuses = [(await call("GET", f"/api/v1/endpoints/{a}/health", a_keys[n % 2]))[0] for n in range(12)]
            assert statuses == [200] * 10 + [429] * 2  # the endpoint's burst of 10, both keys together
            status, refused = await call("GET", f"/api/v1/endpoints/{a}/health", a_keys[0])
            assert status == 429 and isinstance(refused, dict)
            assert f"endpoint {a}'s invocation keys" in refused["error"]["message"]
            assert (await call("GET", f"/api/v1/endpoints/{b}/health", b_keys[0]))[0] == 200
            owners = [(await call("GET", f"/api/v1/endpoints/{a}/health", owner))[0] for _ in range(8)]
            assert owners == [200] * 6 + [429] * 2  # the owner's API key: its own key's burst of 6, as before
    finally:
        await server.stop()
