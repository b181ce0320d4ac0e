"""Reading a daemon's /metrics as Prometheus would: ``promtool check metrics`` (Debian ``prometheus``), samples
by name and labels through prometheus_client's own parser, and a real Prometheus server scraping daemons.

promtool is required, not optional: ``scripts/setup-env --test`` installs it (as root, Debian ``prometheus``),
and a test that needs it fails saying so rather than skipping, so CI can never pass without the check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# --- a real Prometheus ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[str, ...]  # host:port
    scheme: str = "http"
    ca_file: Path | None = None  # the CA that signed an https target's certificate


class PrometheusServer:
    """A real Prometheus (Debian ``prometheus``) on 127.0.0.1 scraping ``jobs`` every ``interval_s``, its data in
    ``root``. ``start()`` waits until it is ready; ``stop()`` ends it (and is safe to call twice). ``config``: a whole
    configuration to run instead (e.g. the shipped deploy/prometheus/prometheus.yml, adapted), then ``jobs`` is unused."""

    def __init__(
        self,
        root: Path,
        jobs: list[ScrapeJob],
        *,
        port: int,
        interval_s: float = 1.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.jobs = jobs
        self.port = port
        self.interval_s = interval_s
        self.config = config
        self.log = root / "prometheus.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        executable = shutil.which("prometheus")
        if executable is None:
            raise PromtoolMissing("prometheus not found: run `scripts/setup-env --test` as root (Debian `prometheus`)")
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(json.dumps(self.config if self.config is not None else self._config()))  # JSON is YAML
        with open(self.log, "ab") as out:
            self._process = subprocess.Popen(
                [
                    executable,
                    f"--config.file={config}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--storage.tsdb.path={self.root / 'data'}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self._process.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout_s} s:\n{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, as the API reports them (``health``, ``lastError``, ``labels``...)."""
        return list(self._api("/api/v1/targets")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rules of every group, as the API reports them (``name``, ``health``, ``state``...)."""
        return [rule for group in self._api("/api/v1/rules")["groups"] for rule in group["rules"]]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series."""
        data = self._api("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        return [(dict(series["metric"]), float(series["value"][1])) for series in data["result"]]

    def _api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise AssertionError(f"prometheus API {path}: {body}")
        return body["data"]

    def _config(self) -> dict[str, Any]:
        def job(spec: ScrapeJob) -> dict[str, Any]:
            entry: dict[str, Any] = {
                "job_name": spec.name,
                "scheme": spec.scheme,
                "static_configs": [{"targets": list(spec.targets)}],
            }
            if spec.ca_file is not None:
                entry["tls_config"] = {"ca_file": str(spec.ca_file)}
            return entry

        interval = f"{max(1, round(self.interval_s * 1000))}ms"
        return {
            "global": {"scrape_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [job(j) for j in self.jobs],
        }
