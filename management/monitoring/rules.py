"""Alert rules: what is watched, when it breaches, how long before an alert fires and how it clears (hysteresis).

Rules come from a TOML file (the shipped ``rules.toml`` next to this module, or an operator's copy) as a list of
``[[rule]]`` tables. A rule is a value: parsing checks every field and names the one that is wrong.
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import msgspec

from common.config import TomlTable
from common.errors import ConfigError

SHIPPED_RULES = Path(__file__).with_name("rules.toml")

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
SEVERITIES = ("info", "warning", "critical")
SCOPES = ("fleet", "tier", "region", "provider", "host", "gpu", "workload", "relay")
_NAME = re.compile(r"^[a-z0-9_]{1,64}\Z")


class AlertRule(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    metric: str
    op: str
    threshold: float
    for_s: float = 0.0
    clear_threshold: float | None = None  # default: ``threshold``
    clear_for_s: float = 0.0
    severity: str = "warning"
    scope: str = "gpu"
    fault: bool = False  # while firing, the GPU is marked faulty (scope "gpu" only)
    summary: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be 1-64 of a-z, 0-9 and _")
        if self.op not in OPERATORS:
            raise ValueError(f"op {self.op!r} must be one of {', '.join(OPERATORS)}")
        if self.for_s < 0 or self.clear_for_s < 0:
            raise ValueError("for_s and clear_for_s must be 0 or more seconds")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} must be one of {', '.join(SEVERITIES)}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope {self.scope!r} must be one of {', '.join(SCOPES)}")
        if self.fault and self.scope != "gpu":
            raise ValueError('fault = true needs scope = "gpu": only a GPU can be marked faulty')

    def breached(self, value: float) -> bool:
        """The condition holds: a pending alert goes on towards firing."""
        return OPERATORS[self.op](value, self.threshold)

    def still_breached(self, value: float) -> bool:
        """For a firing alert: the condition, against the clear threshold, still holds (it does not clear yet)."""
        clear = self.threshold if self.clear_threshold is None else self.clear_threshold
        return OPERATORS[self.op](value, clear)

    def cleared(self, value: float) -> bool:
        """For a firing alert: ``value`` is past the clear threshold."""
        return not self.still_breached(value)


def parse_rules(document: TomlTable, *, source: str = "rules") -> list[AlertRule]:
    """The ``[[rule]]`` tables of a parsed TOML document; ConfigError names the rule and field that are wrong."""
    tables = document.get("rule", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: 'rule' must be a list of [[rule]] tables")
    rules: list[AlertRule] = []
    seen: set[str] = set()
    for number, table in enumerate(tables, 1):
        try:
            rule = msgspec.convert(table, AlertRule, strict=False)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ConfigError(f"{source}: rule {number}: {exc}") from exc
        if rule.name in seen:
            raise ConfigError(f"{source}: rule {number}: name {rule.name!r} is used twice")
        seen.add(rule.name)
        rules.append(rule)
    return rules


def load_rules(path: Path | None = None) -> list[AlertRule]:
    """The rules in ``path`` (default: the shipped rules)."""
    path = path or SHIPPED_RULES
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read alert rules {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"alert rules {path} are not valid TOML: {exc}") from exc
    return parse_rules(document, source=str(path))
