"""schemathesis against the whole API: every operation of the OpenAPI document (management/api/openapi.py), called on a
real MasterServer (a real SQLite store, a free port) with generated requests, valid and invalid. Every answer must be
no 500, have a status the document lists for the operation, the content type it lists, and a body its schema accepts.

The server runs in a thread of its own (schemathesis and Hypothesis drive it synchronously, over HTTP). It is seeded
the way a grid is: an operator key, a provider with two simulated hosts (no GPU exists here: the agents' GPUs are
simulated, as everywhere in the tests) and its prices, a renter with a balance, a workload, a top-up and a key; the
Master takes payments through a localstripe of its own (tests/support/localstripe.py) behind the fake of Stripe's
Connect calls (tests/support/fake_connect.py; the provider's payout account is connected). Path parameters
are sometimes swapped for the seeded ids, so the answers about real resources are exercised as well as the 404s.

Generation is derandomized (the same examples every run) and small: every read with the operator's key, and with the
renter's and the provider's (fewer); every change with the renter's key (few), then with the operator's. About a
minute and a half on two cores; a failure prints the request as a curl line.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from management.api import ApiSettings
from management.api.routing import document
from management.app import MasterServer
from master.config import MasterConfig
from tests.management.hosts import add_agent
from tests.support.fake_connect import fake_connect_server
from tests.support.localstripe import local_stripe

pytestmark = pytest.mark.serial  # scripts/test runs it after the parallel part (pyproject.toml's markers)

T = TypeVar("T")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
READ_EXAMPLES = 30  # per operation
OTHER_ROLE_EXAMPLES = 12
WRITE_EXAMPLES = 30

schema = schemathesis.openapi.from_dict(document())
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE], deterministic=True, allow_x00=False
)
reads = schema.include(method="GET")
writes = schema.exclude(method="GET")


@dataclass
class LiveGrid:
    """A MasterServer on its own event loop in a thread, and what it was seeded with."""

    url: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # "operator" | "provider" | "renter" -> API key
    ids: dict[str, list[str]] = field(default_factory=dict)  # path parameter name -> seeded ids

    def headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}


class ServerThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="master-under-test", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _call(grid: LiveGrid, method: str, path: str, who: str = "operator", **kwargs: Any) -> Any:
    response = requests.request(method, grid.url + path, headers=grid.headers(who), timeout=10, **kwargs)
    assert response.status_code < 300, f"seeding {method} {path}: {response.status_code} {response.text}"
    return response.json()


def seed(server: MasterServer, thread: ServerThread, grid: LiveGrid) -> None:
    thread.run(add_agent(server.master, "agt-acme-1", "a10:2", provider="acme", runtime="docker", isolation="container"))
    thread.run(add_agent(server.master, "agt-acme-2", "h100:1", provider="acme", runtime="docker", isolation="container"))
    _call(grid, "POST", "/api/v1/accounts", json={"id": "acme", "role": "provider"})
    _call(grid, "POST", "/api/v1/accounts", json={"id": "bob", "role": "renter"})
    grid.keys["provider"] = _call(grid, "POST", "/api/v1/accounts/acme/keys", json={"name": "acme ci"})["key"]
    renter_key = _call(grid, "POST", "/api/v1/accounts/bob/keys", json={"name": "bob laptop"})
    grid.keys["renter"] = renter_key["key"]
    spare_key = _call(grid, "POST", "/api/v1/accounts/bob/keys", json={"name": "spare"})  # the one the passes revoke
    _call(grid, "PUT", "/api/v1/prices/default", json={"provider": "acme", "on_demand": "1.50", "min_bid": "0.40"})
    _call(grid, "PUT", "/api/v1/agents/agt-acme-2/price", json={"on_demand": "3.00"})
    _call(grid, "POST", "/api/v1/accounts/bob/credit", json={"amount": "100.00", "memo": "seed", "key": "seed-1"})
    workload = _call(
        grid, "POST", "/api/v1/workloads", who="renter", json={"name": "train", "image": "busybox", "env": {"TOKEN": "x"}}
    )
    command = _call(
        grid, "POST", "/api/v1/commands", json={"agent_id": "agt-acme-1", "kind": "delete_container", "spec": {"name": "x"}}
    )
    signing = _call(grid, "GET", "/api/v1/signing-keys")["items"]
    gpus = _call(grid, "GET", "/api/v1/gpus")["items"]
    topup = _call(grid, "POST", "/api/v1/billing/topups", who="renter", json={"amount": "25"})["topup"]
    grid.ids = {
        "agent_id": ["agt-acme-1", "agt-acme-2"],
        "offer_id": ["agt-acme-1", "agt-acme-2"],
        "account_id": ["bob", "acme"],  # not "operator": a change run disabling it would leave the rest all 403
        "workload_id": [workload["id"]],
        "command_id": [command["id"]],
        "key_id": [spare_key["key_id"], signing[0]["key_id"]],
        "uuid": [gpus[0]["uuid"]],
        "rental_id": [f"{workload['id']}-a1"],
        "topup_id": [topup["id"]],
    }


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGrid]:
    state = Path(tmp_path_factory.mktemp("schemathesis-master"))
    thread = ServerThread()
    # No rate limit: Hypothesis calls far faster than any client should (the limit has its own tests).
    settings_ = ApiSettings(key_rate_per_s=1e6, key_burst=1_000_000)
    with local_stripe(state / "localstripe") as stripe_server:
        # Stripe's Connect calls (payouts) answered by the fake, everything else passed on to localstripe.
        connect = fake_connect_server(upstream=stripe_server.url)
        fake = thread.run(connect.__aenter__())
        config = MasterConfig(
            state_dir=str(state),
            link_port=0,
            api_port=0,
            payment_provider="stripe",
            stripe_api_key=stripe_server.api_key,
            stripe_webhook_secret="whsec_schemathesis",
            stripe_api_base=fake.url,
        )
        server = MasterServer(config, settings_)
        thread.run(server.start())
        grid = LiveGrid(url=server.api_url, keys={"operator": server.operator_token_file.read_text().strip()})
        try:
            seed(server, thread, grid)
            connected = _call(grid, "POST", "/api/v1/billing/payout-account", json={"account": "acme"})
            fake.complete_onboarding(connected["reference"])  # acme's payout account can take transfers
            yield grid
        finally:
            thread.run(server.stop())
            thread.run(connect.__aexit__(None, None, None))
            thread.close()


def with_seeded_ids(case: schemathesis.Case, grid: LiveGrid) -> None:
    """Swap about half the generated path parameters for seeded ids (chosen from the generated value, so a run is
    reproducible), so the operation is tried on resources that exist as well as on ones that do not."""
    for name, value in list((case.path_parameters or {}).items()):
        known = grid.ids.get(name)
        digest = hashlib.sha256(str(value).encode()).digest()
        if known and digest[0] % 2 == 0:
            case.path_parameters[name] = known[digest[1] % len(known)]


HYPOTHESIS = settings(derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)


# The passes run in this order (pytest keeps the file's order): the reads, then the renter's changes, then the
# operator's, which may disable or change the seeded accounts and revoke their keys (the calls are still checked
# then: 401 and 403 are answers the document states).


@reads.parametrize()
@settings(HYPOTHESIS, max_examples=READ_EXAMPLES)
def test_every_read_conforms_for_the_operator(case: schemathesis.Case, grid: LiveGrid) -> None:
    with_seeded_ids(case, grid)
    case.call_and_validate(base_url=grid.url, headers=grid.headers("operator"), checks=CHECKS)


@reads.parametrize()
@settings(HYPOTHESIS, max_examples=OTHER_ROLE_EXAMPLES)
def test_every_read_conforms_for_a_renter(case: schemathesis.Case, grid: LiveGrid) -> None:
    with_seeded_ids(case, grid)
    case.call_and_validate(base_url=grid.url, headers=grid.headers("renter"), checks=CHECKS)


@reads.parametrize()
@settings(HYPOTHESIS, max_examples=OTHER_ROLE_EXAMPLES)
def test_every_read_conforms_for_a_provider(case: schemathesis.Case, grid: LiveGrid) -> None:
    with_seeded_ids(case, grid)
    case.call_and_validate(base_url=grid.url, headers=grid.headers("provider"), checks=CHECKS)


@writes.parametrize()
@settings(HYPOTHESIS, max_examples=OTHER_ROLE_EXAMPLES)
def test_every_change_conforms_for_a_renter(case: schemathesis.Case, grid: LiveGrid) -> None:
    with_seeded_ids(case, grid)
    case.call_and_validate(base_url=grid.url, headers=grid.headers("renter"), checks=CHECKS)


@writes.parametrize()
@settings(HYPOTHESIS, max_examples=WRITE_EXAMPLES)
def test_every_change_conforms_for_the_operator(case: schemathesis.Case, grid: LiveGrid) -> None:
    with_seeded_ids(case, grid)
    case.call_and_validate(base_url=grid.url, headers=grid.headers("operator"), checks=CHECKS)
