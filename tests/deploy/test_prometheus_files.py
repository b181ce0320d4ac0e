"""The shipped Prometheus and Grafana files (deploy/): Prometheus's own checker accepts the scrape config and the
alert rules, the rules fire and stay quiet as their cases (rules_test.yml, ``promtool test rules``) say, and the
Grafana dashboards are complete and read the data source the provisioning file declares.

That every series these files read is exported, and that every dashboard query runs, is shown against a real grid
and a real Prometheus in tests/e2e/test_prometheus_grid.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.grid import REPO
from tests.support.prometheus import CHECK_TIMEOUT_S, promtool

DEPLOY = REPO / "deploy"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULE_CASES = Path(__file__).with_name("rules_test.yml")
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
# The idlegrid rules the Prometheus file must match (the Master's shipped rules, docs/monitoring.md).
SHIPPED_ALERTS = {
    "IdlegridGpuOverheating": ("> 85", "2m"),
    "IdlegridGpuUncorrectableEcc": ("> 0", None),
    "IdlegridGpuFaulted": ("xid|ecc", None),
    "IdlegridRentedGpuIdle": ("> 0", "30m"),
    "IdlegridHostOffline": (">= 300", None),
    "IdlegridHostBelowNetworkFloor": ("> 0", "10m"),
    "IdlegridRelayDown": ("== 0", "1m"),
    "IdlegridCommandFailureRate": ("> 0.1", None),
}


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def test_promtool_accepts_the_shipped_scrape_config_and_it_loads_the_rules():
    done = run_promtool("check", "config", str(SCRAPE_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout
    jobs = {job["job_name"] for job in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]}
    assert {"idlegrid-master", "idlegrid-relay"} <= jobs
    for target_file in ("master.yml", "relays.yml"):  # file_sd targets: each a list of targets with labels
        groups = yaml.safe_load((SCRAPE_CONFIG.parent / "targets" / target_file).read_text())
        assert all(re.fullmatch(r"[\w.-]+:\d+", target) for group in groups for target in group["targets"])


def test_promtool_accepts_the_shipped_rules_and_they_match_the_idlegrid_rules():
    done = run_promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    for name, (condition, duration) in SHIPPED_ALERTS.items():
        assert condition in rules[name]["expr"], (name, rules[name]["expr"])
        assert rules[name].get("for") == duration, name
        assert rules[name]["labels"]["severity"] in ("warning", "critical")


def test_the_alert_rules_fire_and_stay_quiet_as_their_cases_say():
    done = run_promtool("test", "rules", str(RULE_CASES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_four_dashboards_are_complete_and_read_the_provisioned_data_source():
    source = yaml.safe_load((PROVISIONING / "datasources" / "idlegrid.yml").read_text())["datasources"][0]
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "idlegrid.yml").read_text())["providers"][0]
    assert source["type"] == "prometheus" and provider["type"] == "file"

    boards = dashboards()
    assert set(boards) == {"fleet", "host", "relay", "market"}
    assert len({board["uid"] for board in boards.values()}) == 4
    for name, board in boards.items():
        panels = board["panels"]
        assert len({panel["id"] for panel in panels}) == len(panels), name
        queried = [panel for panel in panels if panel["type"] != "text"]
        assert queried, name
        for panel in queried:
            assert panel["datasource"]["uid"] == source["uid"], (name, panel["title"])
            assert panel["targets"] and all(target["expr"].strip() for target in panel["targets"]), (name, panel["title"])
        for variable in board["templating"]["list"]:
            assert variable["datasource"]["uid"] == source["uid"], (name, variable["name"])
