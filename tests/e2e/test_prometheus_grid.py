"""A real Prometheus (Debian ``prometheus``) run with the shipped deploy/prometheus/prometheus.yml and rules.yml
(only the targets, the CA, the intervals and the rules' path adapted to the test) scrapes a running grid: a Master
with ``metrics_per_gpu`` on, relay-1 and three hosts of simulated GPUs (no GPU can exist here). PromQL over its
HTTP API counts the fleet's GPUs by tier as the Master's API lists them; every series the shipped rules and
dashboards read is exported; every dashboard query runs; the rules load healthy. Both daemons' /metrics pass
``promtool check metrics``."""

from __future__ import annotations

import collections
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.grid import REPO, Grid, free_port, running_grid, wait_for
from tests.support.prometheus import PrometheusServer, check_metrics, names, sample, samples

pytestmark = pytest.mark.e2e

DEPLOY = REPO / "deploy"
HOSTS = {"host-h100": "h100:4", "host-a10": "a10:2", "host-mixed": "a10:1,t4:2"}
GPU_COUNT = 9
# The shipped series read by the rules and dashboards that a quiet test grid does not produce: no relay is down.
NOT_EXPORTED_HERE = {"up"}


@dataclass
class Scraped:
    grid: Grid
    prometheus: PrometheusServer
    agent_ids: list[str]


def shipped_config(grid: Grid, targets: Path) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml, pointed at this grid: its file_sd target files written here, the relay's
    CA the grid's, one-second intervals, the rules file by its path in the repository; nothing else changed."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(DEPLOY / "prometheus" / rules) for rules in config["rule_files"]]
    relay = grid.relays["relay-1"]
    found = {"master": f"127.0.0.1:{grid.api_port}", "relays": f"127.0.0.1:{relay.http_port}"}
    targets.mkdir(parents=True, exist_ok=True)
    for job in config["scrape_configs"]:
        if job["job_name"] == "idlegrid-relay":
            job["tls_config"]["ca_file"] = str(grid.authority.ca_file)
        for sd in job.get("file_sd_configs", []):
            files = []
            for name in sd["files"]:
                shipped = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())[0]  # its first group, labels and all
                path = targets / Path(name).name
                path.write_text(json.dumps([{**shipped, "targets": [found[Path(name).stem]]}]))
                files.append(str(path))
            sd["files"] = files
    config["scrape_configs"] = [job for job in config["scrape_configs"] if job["job_name"].startswith("idlegrid-")]
    return config


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    root = tmp_path_factory.mktemp("prometheus-grid")
    with running_grid(root / "grid", {"metrics_per_gpu": True, "telemetry_s": 0.5}) as grid:
        agent_ids = [grid.run_agent(name, simulate=spec)[0] for name, spec in HOSTS.items()]
        wait_for(lambda: len(grid.client.list("/api/v1/gpus")) == GPU_COUNT, 20, "every GPU listed")
        wait_for(
            lambda: sum(value for _, value in samples(master_metrics(grid), "idlegrid_gpus_sampled")) == GPU_COUNT,
            20,
            "a telemetry sample of every GPU",
        )
        server = PrometheusServer(
            root / "prometheus", [], port=free_port(), config=shipped_config(grid, root / "prometheus" / "targets")
        )
        server.start()
        try:
            wait_for(
                lambda: (t := server.targets()) and len(t) == 2 and all(target["health"] == "up" for target in t),
                30,
                f"the Master and the relay scraped\n{server.log}",
            )
            yield Scraped(grid, server, agent_ids)
        finally:
            server.stop()


def master_metrics(grid: Grid) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{grid.api_port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_promql_counts_the_fleets_gpus_by_tier_as_the_api_lists_them(scraped):
    listed = scraped.grid.client.list("/api/v1/gpus")
    by_tier_api = collections.Counter(gpu["tier"] or "none" for gpu in listed)
    assert sum(by_tier_api.values()) == GPU_COUNT
    assert len(by_tier_api) == 3, by_tier_api  # the H100s, the A10s and the T4s fall in three tiers

    def by_tier_promql() -> dict[str, float]:
        return {labels["tier"]: value for labels, value in scraped.prometheus.query("sum by (tier) (idlegrid_gpus)")}

    seen = wait_for(lambda: (found := by_tier_promql()) == by_tier_api and found, 20, f"PromQL to agree with {by_tier_api}")
    assert seen == by_tier_api
    by_region = scraped.prometheus.query("sum by (region) (idlegrid_agents)")
    assert by_region == [({"region": "eu-west"}, float(len(HOSTS)))]  # the series' own region, not a target's label
    per_gpu = scraped.prometheus.query("count(idlegrid_gpu_utilization_percent)")
    assert per_gpu == [({}, float(GPU_COUNT))]  # metrics_per_gpu: a series per GPU in service


def test_the_masters_and_the_relays_metrics_pass_promtool_with_the_fleet_series(scraped):
    grid = scraped.grid
    master = master_metrics(grid)
    relay = grid.relay_metrics(grid.relays["relay-1"])
    for text in (master, relay):
        check = check_metrics(text)
        assert check.clean, check.findings
    assert sum(value for _, value in samples(master, "idlegrid_gpus")) == GPU_COUNT
    assert sample(master, "idlegrid_agents", state="ready", region="eu-west") == len(HOSTS)
    assert sample(master, "idlegrid_workloads", state="running") == 0
    assert sample(master, "idlegrid_rentals_open", kind="on_demand") == 0
    assert {"idlegrid_gpu_utilization_mean_percent", "idlegrid_gpu_temperature_max_celsius"} <= names(master)


def shipped_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every alert rule and dashboard query shipped."""
    found = []
    for group in yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]:
        found += [(f"rule {rule['alert']}", rule["expr"]) for rule in group["rules"]]
    for path in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            found += [(f"{path.stem}: {panel['title']}", target["expr"]) for target in panel.get("targets", [])]
        found += [(f"{path.stem}: ${v['name']}", v["query"]["query"]) for v in board["templating"]["list"]]
    return found


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def declared(exposition: str) -> set[str]:
    """Every sample name a /metrics body declares (its HELP and TYPE lines), with or without samples yet: a counter
    with labels has none until the first increment, and its name is still one Prometheus will store."""
    found = set()
    for family in text_string_to_metric_families(exposition):
        found.add(family.name)
        found.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return found


SERIES = re.compile(r"\b(idlegrid_[a-z0-9_]+|process_[a-z_]+|up)\b")


def test_every_series_the_shipped_rules_and_dashboards_read_is_exported(scraped):
    grid = scraped.grid
    exported = declared(master_metrics(grid)) | declared(grid.relay_metrics(grid.relays["relay-1"]))
    missing = {
        (where, series)
        for where, expr in shipped_expressions()
        for series in SERIES.findall(expr)
        if series not in exported and series not in NOT_EXPORTED_HERE
    }
    assert not missing, sorted(missing)


def test_every_dashboard_query_runs_on_the_real_prometheus_and_the_rules_load_healthy(scraped):
    substitutions = {"$tier": ".*", "$region": ".*", "$model": ".*", "$instance": ".*", "$agent": scraped.agent_ids[0]}
    failed = []
    for where, expr in shipped_expressions():
        if expr.startswith("label_values("):
            continue  # a Grafana function, not PromQL
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        try:
            scraped.prometheus.query(expr)
        except (urllib.error.HTTPError, AssertionError) as exc:
            failed.append((where, expr, str(exc)))
    assert not failed, failed

    host_gpus = scraped.prometheus.query(f'count(idlegrid_gpu_utilization_percent{{agent="{scraped.agent_ids[0]}"}})')
    assert host_gpus == [({}, 4.0)]  # the host dashboard's $agent finds its four H100s

    rules = scraped.prometheus.rules()
    alert_names = {rule["name"] for rule in rules}
    assert {"IdlegridGpuOverheating", "IdlegridHostOffline", "IdlegridCommandFailureRate"} <= alert_names
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    # a quiet grid: nothing fires (the Master and the relay are up, no GPU is hot, faulty or idle while rented)
    assert not [rule["name"] for rule in rules if rule["state"] == "firing"]
