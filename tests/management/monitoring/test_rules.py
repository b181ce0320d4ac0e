"""Alert rules from TOML: the shipped file parses, every rule names a wired metric, and a bad rule is refused with
the rule and the field named."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from common.errors import ConfigError
from management.api.resources.alerts import ScopeName
from management.monitoring.observe import WIRED
from management.monitoring.rules import SCOPES, load_rules


def test_the_shipped_rules_parse_and_watch_only_wired_metrics():
    rules = load_rules()
    assert {r.name for r in rules} == {
        "gpu_overheating",
        "gpu_hardware_error",
        "rented_gpu_idle",
        "host_offline",
        "renter_balance_low",
        "command_failures",
        "relay_down",
        "host_bandwidth_below_floor",
        "gpu_temperature_anomaly",
        "spend_cap_reached",
        "auto_topup_failed",
        "payout_unreconciled",
    }
    assert all(r.metric in WIRED for r in rules)
    [hot] = [r for r in rules if r.name == "gpu_overheating"]
    assert (hot.threshold, hot.for_s, hot.clear_threshold, hot.fault) == (85, 120, 80, True)
    assert hot.breached(86) and not hot.breached(85) and hot.still_breached(81) and hot.cleared(80)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ('name = "x"\nmetric = "m"\nop = "=>"\nthreshold = 1', "op"),
        ('name = "x"\nmetric = "m"\nop = ">"', "threshold"),
        ('name = "Bad Name"\nmetric = "m"\nop = ">"\nthreshold = 1', "name"),
        ('name = "x"\nmetric = "m"\nop = ">"\nthreshold = 1\nseverity = "loud"', "severity"),
        ('name = "x"\nmetric = "m"\nop = ">"\nthreshold = 1\nscope = "host"\nfault = true', "fault"),
        ('name = "x"\nmetric = "m"\nop = ">"\nthreshold = 1\nfor_s = -1', "for_s"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_rule_and_the_field(tmp_path: Path, table: str, named: str):
    path = tmp_path / "rules.toml"
    path.write_text(f"[[rule]]\n{table}\n")
    with pytest.raises(ConfigError, match="rule 1") as refused:
        load_rules(path)
    assert named in str(refused.value)


def test_a_name_used_twice_or_a_file_that_is_not_toml_is_refused(tmp_path: Path):
    path = tmp_path / "rules.toml"
    path.write_text('[[rule]]\nname = "x"\nmetric = "m"\nop = ">"\nthreshold = 1\n' * 2)
    with pytest.raises(ConfigError, match="used twice"):
        load_rules(path)
    path.write_text("[[rule]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_rules(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_rules(tmp_path / "absent.toml")


def test_the_api_takes_exactly_the_scopes_a_rule_may_have():
    assert set(get_args(ScopeName)) == set(SCOPES) and "relay" in SCOPES
