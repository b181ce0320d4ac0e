"""Reading a daemon's /metrics as Prometheus would: ``promtool check metrics`` (Debian ``prometheus``), and samples
by name and labels through prometheus_client's own parser.

promtool is required, not optional: ``scripts/setup-env --test`` installs it (as root, Debian ``prometheus``),
and a test that needs it fails saying so rather than skipping, so CI can never pass without the check.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

PROMTOOL_CANDIDATES = ("promtool", "/usr/bin/promtool", "/usr/local/bin/promtool")
CHECK_TIMEOUT_S = 30.0


class PromtoolMissing(AssertionError):
    """promtool is not installed: the metrics check cannot run."""


def promtool() -> str:
    """The promtool executable, or ``PromtoolMissing`` saying how to get it."""
    for candidate in PROMTOOL_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    raise PromtoolMissing(
        "promtool not found: run `scripts/setup-env --test` as root (it installs Debian's `prometheus`), "
        "or `apt-get install -y prometheus`"
    )


@dataclass(frozen=True)
class MetricsCheck:
    returncode: int
    findings: str  # promtool's lint findings and errors, one a line; empty when clean

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not self.findings.strip()


def check_metrics(exposition: str | bytes) -> MetricsCheck:
    """Pipe a /metrics body through ``promtool check metrics`` (format errors and lint findings)."""
    body = exposition.encode() if isinstance(exposition, str) else exposition
    done = subprocess.run([promtool(), "check", "metrics"], input=body, capture_output=True, timeout=CHECK_TIMEOUT_S, check=False)
    return MetricsCheck(done.returncode, (done.stdout + done.stderr).decode(errors="replace"))


def samples(exposition: str | bytes, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named ``name`` (a counter's ``_total`` included in the name)."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def sample(exposition: str | bytes, name: str, **labels: str) -> float | None:
    """The value of the one sample named ``name`` whose labels include ``labels``; None when there is none.

    More than one match is an error in the test (name the labels that tell them apart)."""
    matches = [value for have, value in samples(exposition, name) if labels.items() <= have.items()]
    if len(matches) > 1:
        raise AssertionError(f"{len(matches)} samples of {name} match {labels}; name more labels")
    return matches[0] if matches else None


def names(exposition: str | bytes) -> set[str]:
    """Every sample name present."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
