"""``python -m bench summaries``: the one-pass summaries of a whole fleet, timed (default 10,000 hosts, 80,000 GPUs).

- fleet figures: ``management.services.fleet.fleet_figures`` over every GPU with a telemetry sample each, what the fleet view
  of the console and the API adds up on each request (the records come from bench/api_pages.py's generated fleet,
  every 10th host offline). Target: under 0.5 s.
- reputation: ``master.reputation.reputation(host).score`` for every host, what the scheduler's snapshot reads per
  host and cycle. Target: under 0.5 s.
- fleet scrape: one Prometheus scrape of the Master's fleet series (``master.metrics.FleetGauges``, every GPU with a
  sample, temperatures included). Target: under 2 s (Prometheus's default scrape timeout is 10 s).

Each is run ``rounds`` times after one untimed warm-up; the figures are the median and the slowest round. The garbage
collector is set as the daemons set it (common/heap.py). These targets were timed assertions in unit tests
(tests/management/test_fleet.py, tests/master/test_reputation.py, tests/master/test_fleet_series.py); a busy machine
made them fail there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench.api_pages import generated_fleet
from common.heap import tune_for_daemon
from common.inventory import GpuSample
from management.services.fleet import fleet_figures, usage_of
from master.metrics import FleetGauges
from master.records import AgentRecord
from master.reputation import reputation

TARGET_S = {"fleet_figures": 0.5, "reputation": 0.5, "fleet_scrape": 2.0}


@dataclass(frozen=True)
class SummariesBenchOptions:
    hosts: int = 10_000
    gpus_per_host: int = 8
    rounds: int = 5


def _timed(rounds: int, run: Callable[[], object]) -> list[float]:
    run()  # warm-up: first-call costs (imports, caches) are not what a running daemon pays
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def _figures(name: str, times: list[float]) -> dict[str, Any]:
    return {
        "name": name,
        "median_s": round(statistics.median(times), 4),
        "max_s": round(max(times), 4),
        "target_s": TARGET_S[name],
        "met": max(times) < TARGET_S[name],
    }


def run_summaries_bench(options: SummariesBenchOptions) -> dict[str, Any]:
    tune_for_daemon()
    fleet = generated_fleet(options.hosts, options.gpus_per_host, now=1000.0)
    agents = {a.id: a for a in fleet.agents}
    latest = {
        g.uuid: GpuSample(
            uuid=g.uuid, ts=1000.0, utilization_pct=float(i % 100), memory_used_mib=i % 4096, temperature_c=40.0 + i % 50
        )
        for i, g in enumerate(fleet.gpus)
    }
    summed = fleet_figures(fleet.gpus, agents, usage_of(latest))
    if summed.total.total != len(fleet.gpus):  # a summary that misses GPUs is no figure to time
        raise AssertionError(f"fleet figures counted {summed.total.total} of {len(fleet.gpus)} GPUs")
    hosts = [
        AgentRecord(
            id=f"agt-{i:08d}",
            provider="p",
            state="ready",
            uptime_s=float(i),
            commands_succeeded=i % 7,
            rentals_failed=i % 3,
            gpus_verified=options.gpus_per_host,
        )
        for i in range(options.hosts)
    ]

    scraped = CollectorRegistry()
    scraped.register(FleetGauges(lambda: fleet.agents, lambda: fleet.gpus, lambda: [], lambda: 3, latest=lambda: latest))

    def score_every_host() -> None:
        for host in hosts:
            reputation(host).score  # noqa: B018  # the score is what is timed

    return {
        "hosts": options.hosts,
        "gpus": len(fleet.gpus),
        "rounds": options.rounds,
        "summaries": [
            _figures("fleet_figures", _timed(options.rounds, lambda: fleet_figures(fleet.gpus, agents, usage_of(latest)))),
            _figures("reputation", _timed(options.rounds, score_every_host)),
            _figures("fleet_scrape", _timed(options.rounds, lambda: generate_latest(scraped))),
        ],
    }


def summaries_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['hosts']:,} hosts / {r['gpus']:,} GPUs, {r['rounds']} rounds",
        f"{'summary':<15} {'median':>9} {'slowest':>9}  target",
    ]
    for s in r["summaries"]:
        verdict = "met" if s["met"] else "MISSED"
        median_ms, max_ms, target_ms = s["median_s"] * 1000, s["max_s"] * 1000, s["target_s"] * 1000
        lines.append(f"{s['name']:<15} {median_ms:>7.0f} ms {max_ms:>7.0f} ms  < {target_ms:.0f} ms {verdict}")
    return "\n".join(lines)
