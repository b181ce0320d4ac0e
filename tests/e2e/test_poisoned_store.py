"""Poisoned state, end to end: a Master process restarted on an SQLite file with an undecodable record in
every table starts, serves agents, relays and the API, and reports each record it meets (log line + event).

Rollups are planted too, but no part of the Master reads them yet (the telemetry history will): the
in-process test tests/master/test_master_poisoned_store.py shows their read path on both backends.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from master.enrollment import hash_secret
from master.store.aggregates import Aggregate
from tests.support.grid import QUICK_RECONNECT, Grid, wait_for, write_toml
from tests.support.poison import poison_sqlite

POISONED_API_KEY = "igak_poisoned"
POISONED_TOKEN = "igjt_poisoned"
QUARANTINED_LOG = "undecodable store record quarantined"


@pytest.fixture
def grid(tmp_path):
    g = Grid(tmp_path)
    try:
        g.start_master()
        g.start_relay("relay-1", "eu-west", extra=["--config", str(write_toml(tmp_path / "relay.toml", QUICK_RECONNECT))])
        yield g
    finally:
        g.stop()


def plant_every_aggregate(grid: Grid) -> dict[Aggregate, str]:
    """One undecodable record per table of the stopped Master's store; the keys they are reported under."""
    path = str(grid.master_dir / "master.db")
    return {
        Aggregate.AGENTS: poison_sqlite(path, Aggregate.AGENTS, "agt-bad"),
        Aggregate.GPUS: poison_sqlite(path, Aggregate.GPUS, "GPU-bad"),
        Aggregate.COMMANDS: poison_sqlite(path, Aggregate.COMMANDS, "cmd-bad"),
        Aggregate.TOKENS: poison_sqlite(path, Aggregate.TOKENS, hash_secret(POISONED_TOKEN)),
        Aggregate.API_KEYS: poison_sqlite(path, Aggregate.API_KEYS, hash_secret(POISONED_API_KEY)),
        Aggregate.EVENTS: poison_sqlite(path, Aggregate.EVENTS, "agt-bad"),
        Aggregate.REVOCATIONS: poison_sqlite(path, Aggregate.REVOCATIONS, "0b"),
        Aggregate.ROLLUPS: poison_sqlite(path, Aggregate.ROLLUPS, "GPU-bad"),
    }


def test_a_master_restarted_on_a_store_with_an_undecodable_record_in_every_table_serves_and_reports_them(
    grid: Grid,
) -> None:
    agent_id, _ = grid.run_agent("a1", simulate="h100:2")
    assert grid.master is not None and grid.master.terminate() == 0
    bad = plant_every_aggregate(grid)

    grid.restart_master()  # the incident: the Master exited at start, until the database was edited by hand

    # Served: the agent comes back through its relay, the API lists what is good.
    wait_for(lambda: grid.agent(agent_id)["state"] == "ready", 30, f"{agent_id} to be ready again\n{grid.master.tail()}")
    assert [a["id"] for a in grid.get("/api/v1/agents")["items"]] == [agent_id]
    assert len(grid.agent(agent_id)["gpus"]) == 2
    assert grid.get("/api/v1/commands")["items"] == []
    assert grid.get("/api/v1/events?limit=1000")["items"]
    # Refused, not crashed: a credential the store cannot read is no credential.
    assert status_with_key(grid, POISONED_API_KEY) == 401
    relay = grid.relays["relay-1"]
    wait_for(lambda: grid.relay_health(relay)["master_link"] == "up", 30, "the relay to link to the restarted Master")
    enrolled = grid.enroll("a2", relay, token=POISONED_TOKEN)
    assert enrolled.returncode != 0 and "join token is not valid" in enrolled.stderr, enrolled.stderr

    # Reported: one event per record met, naming its aggregate and key, and a log line each.
    met = {aggregate: key for aggregate, key in bad.items() if aggregate is not Aggregate.ROLLUPS}
    reported = wait_for(
        lambda: (
            (items := grid.get("/api/v1/events?kind=store.quarantined&limit=100")["items"]) and len(items) >= len(met) and items
        ),
        10,
        f"every record met to be reported\n{grid.master.tail()}",
    )
    assert sorted((e["data"]["aggregate"], e["subject"]) for e in reported) == sorted((a.value, k) for a, k in met.items())
    logged = [json.loads(line) for line in grid.master.log.read_text().splitlines() if QUARANTINED_LOG in line]
    assert sorted((line["aggregate"], line["key"]) for line in logged) == sorted((a.value, k) for a, k in met.items())
    assert grid.master.alive()


def status_with_key(grid: Grid, key: str) -> int:
    """The status of an API call made with ``key``."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{grid.api_port}/api/v1/agents", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
