"""``python -m bench BENCHMARK ...`` (fleet, ingest, api-pages, scheduler, offers, tunnel, link, ssh, storage, history, alerts,
summaries, console-pages, demo, cli-start, endpoints, challenge, takeover): run one, print, write JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench.alerts import AlertsBenchOptions, alerts_table, run_alerts_bench
from bench.api_pages import api_pages_table
from bench.api_pages import run as run_api_pages
from bench.challenge import ChallengeBenchOptions, challenge_table, run_challenge_bench
from bench.cli_start import CliStartBenchOptions, cli_start_table, run_cli_start_bench
from bench.console_pages import ConsolePagesBenchOptions, console_pages_table, run_console_pages_bench
from bench.demo import DemoBenchOptions, demo_table, run_demo_bench
from bench.endpoints import EndpointsBenchOptions, endpoints_table, run_endpoints_bench
from bench.fleet import PHASES, FleetOptions, run_fleet_bench
from bench.history import HistoryBenchOptions, history_table, run_history_bench
from bench.ingest import run_ingest_bench
from bench.link import LinkBenchOptions, link_table, run_link_bench
from bench.offers import OffersBenchOptions, offers_table, run_offers_bench
from bench.scheduler import SchedulerBenchOptions, run_scheduler_bench, scheduler_table
from bench.scheduler_snapshot import SnapshotBenchOptions, run_snapshot_bench, snapshot_table
from bench.ssh import SshBenchOptions, run_ssh_bench, ssh_table
from bench.storage import StorageBenchOptions, run_storage_bench, storage_table
from bench.summaries import SummariesBenchOptions, run_summaries_bench, summaries_table
from bench.takeover import TakeoverBenchOptions, run_takeover_bench, takeover_table
from bench.tunnel import TunnelBenchOptions, run_tunnel_bench, tunnel_table

TARGETS = {  # bench/README.md: the targets, beside which every figure is printed
    "ready_s": ("<=", 60.0),
    "cmd_rtt_p99_ms": ("<", 100.0),
    "relay_kib_per_agent": ("<=", 64.0),
    "master_kib_per_agent": ("<=", 32.0),
    "relay_vs_baseline": (">=", 0.5),
}


def _fleet_parser(sub: argparse._SubParsersAction) -> None:
    defaults = FleetOptions()
    p = sub.add_parser(
        "fleet",
        help="Master, relays and a simulated fleet under load",
        description="Enroll N simulated agents, start a Master and relays on the embedded store, ramp the "
        "fleet up, hold the load while issuing commands, flood the relays, and report.",
    )
    p.add_argument("--agents", type=int, default=defaults.agents, help=f"simulated agents (default {defaults.agents})")
    p.add_argument("--gpus-per-agent", type=int, default=defaults.gpus_per_agent, help="simulated GPUs per agent (default 8)")
    p.add_argument(
        "--gpu-model",
        default=defaults.gpu_model,
        help="catalog model of the simulated GPUs, or several comma-separated that the agents take in turn, e.g. h100,mi300x"
        " (default h100)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        help=f"seconds to hold the load once every agent is ready (default {defaults.duration:g})",
    )
    p.add_argument("--relays", type=int, default=defaults.relays, help=f"Access relays (default {defaults.relays})")
    p.add_argument(
        "--fleet-procs",
        type=int,
        default=defaults.fleet_procs,
        help="processes the simulated fleet is split over (default 0: one per relay from 5,000 agents on, else 1)",
    )
    p.add_argument(
        "--connect-rate",
        type=float,
        default=defaults.connect_rate,
        help=f"agents started per second during the ramp (default {defaults.connect_rate:g})",
    )
    p.add_argument("--heartbeat-s", type=float, default=defaults.heartbeat_s, help="heartbeat interval (default 5)")
    p.add_argument("--telemetry-s", type=float, default=defaults.telemetry_s, help="telemetry interval (default 10)")
    p.add_argument(
        "--cmd-rate",
        type=float,
        default=defaults.cmd_rate,
        help=f"create commands per second during the hold, each then deleted (default {defaults.cmd_rate:g})",
    )
    p.add_argument("--latency-ms", type=float, default=defaults.latency_ms, help="simulated runtime latency (default 20)")
    p.add_argument("--jitter-ms", type=float, default=defaults.jitter_ms, help="± jitter on that latency (default 5)")
    p.add_argument(
        "--failure-rate",
        type=float,
        default=defaults.failure_rate,
        help="share of simulated runtime operations that fail (default 0)",
    )
    p.add_argument("--flood-seconds", type=float, default=defaults.flood_seconds, help="throughput phase length (default 5)")
    p.add_argument(
        "--flood-agents",
        type=int,
        default=defaults.flood_agents,
        help=f"agents that flood, in the baseline and through the relays (default {defaults.flood_agents})",
    )
    p.add_argument(
        "--flood-rate",
        type=float,
        default=defaults.flood_rate,
        help=f"heartbeats per second asked of the flood agents in all (default {defaults.flood_rate:g})",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the echo-server baseline")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=0.0,
        help="give up waiting for readiness after this (default 60 s + 10 ms per agent)",
    )
    p.add_argument("--work-dir", default="", help="keep every state directory and log here (default: a temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--log-level", default=defaults.log_level, help="log level of every process (default warning)")
    p.add_argument(
        "--profile", dest="profile_dir", default="", help="py-spy every process during the hold; stacks and a summary here"
    )
    p.add_argument(
        "--relay-tls-buffer-kib",
        type=int,
        default=0,
        help="run the relays with asyncio's TLS read buffer at this size (default: the relay's own, 32)",
    )
    p.add_argument(
        "--fold-interval-s",
        type=float,
        default=None,
        help="the relays' report fold interval (0: folding off, every heartbeat and telemetry frame on its own; "
        "default: the relay's own, 1 s)",
    )
    p.add_argument(
        "--sample-s",
        type=float,
        default=0.0,
        help="backlog sampling period during the hold (default 1 s per 2,000 agents; reading the kernel's "
        "socket table costs CPU that grows with the number of connections)",
    )
    p.add_argument(
        "--competitor-share",
        type=float,
        default=0.0,
        help="overload: run a process per core spinning this share of it (0.5: about half) for the whole run (default 0)",
    )
    p.add_argument(
        "--storm",
        action="store_true",
        help="at the end, SIGKILL relay-1 and measure its agents failing over to the others (a reconnect storm)",
    )
    p.add_argument(
        "--relays-simulated",
        type=int,
        default=0,
        help="measure the Master alone behind this many simulated relays (bench/relay_sim.py), each with "
        "--agents-per-relay agents; --agents, the relays, the baseline and the flood are then not used (default 0: off)",
    )
    p.add_argument(
        "--agents-per-relay",
        type=int,
        default=defaults.agents_per_relay,
        help=f"agents behind each simulated relay (default {defaults.agents_per_relay:,})",
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_fleet)


def _run_fleet(args: argparse.Namespace) -> int:
    names = {f.name for f in fields(FleetOptions)}
    options = FleetOptions(**{k: v for k, v in vars(args).items() if k in names})
    options.baseline = not args.no_baseline
    if options.relays_simulated > 0:
        from bench.fleet_sim import run_simulated, simulated_table  # noqa: PLC0415  (only this mode needs it)

        result = asyncio.run(run_simulated(options))
        _write(args.json, result)
        print(simulated_table(result))
        return 0
    result = asyncio.run(run_fleet_bench(options))
    _write(args.json, result)
    print(fleet_table(result))
    return 0


def _ingest_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="telemetry rollups per second to SQLite and MongoDB, against raw inserts",
        description="Feed the Master's telemetry aggregator and flush its rollups to each store; "
        "compare with a raw insert loop on the same store.",
    )
    p.add_argument("--gpus", type=int, default=10_000, help="GPUs reporting (default 10000: one rollup each per minute)")
    p.add_argument("--minutes", type=int, default=3, help="minutes of telemetry (default 3)")
    p.add_argument("--samples-per-minute", type=int, default=6, help="samples per GPU per minute (default 6: every 10 s)")
    p.add_argument("--store", action="append", choices=["sqlite", "mongodb"], help="store(s) to measure (default both)")
    p.add_argument(
        "--mongo-url",
        default=os.environ.get("MONGODB_URI", ""),
        help="mongodb://HOST:PORT/DB of a real server (default: start nx-27017)",
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> int:
    results = asyncio.run(
        run_ingest_bench(
            gpus=args.gpus,
            minutes=args.minutes,
            samples_per_minute=args.samples_per_minute,
            stores=tuple(args.store or ("sqlite", "mongodb")),
            mongo_url=args.mongo_url,
        )
    )
    _write(args.json, results)
    print(ingest_table(results))
    return 0


def _api_pages_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "api-pages",
        help="page through a fleet's GPUs over the management API, timing each page",
        description="Seed a store with a generated fleet, start the real Master and API on it, follow "
        "next_cursor through GET /api/v1/gpus from the first page to the last, and report p50/p99/max per page.",
    )
    p.add_argument("--agents", type=int, default=10_000, help="generated agents (default 10000)")
    p.add_argument("--gpus-per-agent", type=int, default=8, help="GPUs per agent (default 8)")
    p.add_argument("--limit", type=int, default=100, help="GPUs per page (default 100)")
    p.add_argument("--query", default="", help="filters for every page, e.g. 'model=l4&state=available' (default none)")
    p.add_argument("--work-dir", default="", help="where the temporary state directory goes (default: the system's)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_api_pages)


def _run_api_pages(args: argparse.Namespace) -> int:
    result = run_api_pages(args.agents, args.gpus_per_agent, args.limit, args.query, args.work_dir)
    _write(args.json, result)
    print(api_pages_table(result))
    return 0 if result["every_gpu_once_in_order"] else 1


def _scheduler_parser(sub: argparse._SubParsersAction) -> None:
    d = SchedulerBenchOptions()
    p = sub.add_parser(
        "scheduler",
        help="the scheduler core on a generated grid: placements/s, cycle p50/p99, memory, utilization",
        description="Place a backlog of workloads on a generated grid, then run a steady arrival stream with "
        "completions, in simulated time, timing each scheduling cycle (one core).",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts (default {d.hosts})")
    p.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host, help=f"GPUs per host (default {d.gpus_per_host})")
    p.add_argument("--queued", type=int, default=d.queued, help=f"workloads queued at the start (default {d.queued})")
    p.add_argument("--accounts", type=int, default=d.accounts, help=f"accounts (default {d.accounts})")
    p.add_argument(
        "--steady-cycles", type=int, default=d.steady_cycles, help=f"cycles after the backlog (default {d.steady_cycles})"
    )
    p.add_argument("--arrivals", type=int, default=d.arrivals_per_cycle, help="workloads arriving per cycle in the steady phase")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the generated grid and workloads")
    p.add_argument("--no-freeze", action="store_true", help="leave the grid in the garbage collector's sight (gc.freeze off)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_scheduler)


def _run_scheduler(args: argparse.Namespace) -> int:
    options = SchedulerBenchOptions(
        hosts=args.hosts,
        gpus_per_host=args.gpus_per_host,
        queued=args.queued,
        accounts=args.accounts,
        steady_cycles=args.steady_cycles,
        arrivals_per_cycle=args.arrivals,
        seed=args.seed,
        freeze_heap=not args.no_freeze,
    )
    result = run_scheduler_bench(options)
    _write(args.json, result)
    print(scheduler_table(result))
    return 0


def _scheduler_snapshot_parser(sub: argparse._SubParsersAction) -> None:
    d = SnapshotBenchOptions()
    p = sub.add_parser(
        "scheduler-snapshot",
        help="what the scheduling loop pays per cycle before the core: the snapshot of Master records, the index",
        description="Build the scheduling loop's snapshot from generated Master records (with and without the unit "
        "cache) and the core's free-unit index from it, several times.",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts (default {d.hosts})")
    p.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host, help=f"GPUs per host (default {d.gpus_per_host})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"runs of each (default {d.repeats})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_scheduler_snapshot)


def _run_scheduler_snapshot(args: argparse.Namespace) -> int:
    result = run_snapshot_bench(SnapshotBenchOptions(hosts=args.hosts, gpus_per_host=args.gpus_per_host, repeats=args.repeats))
    _write(args.json, result)
    print(snapshot_table(result))
    return 0


def _offers_parser(sub: argparse._SubParsersAction) -> None:
    d = OffersBenchOptions()
    p = sub.add_parser(
        "offers",
        help="offer search on a generated market: p50/p99 per query and overall",
        description="Build the offer index of a generated market (mixed models, regions, prices) and time a set "
        "of realistic searches, first pages and deep cursor pages.",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts (default {d.hosts})")
    p.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host, help=f"GPUs per host (default {d.gpus_per_host})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"timed runs of each query (default {d.rounds})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the generated market (default {d.seed})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_offers)


def _run_offers(args: argparse.Namespace) -> int:
    options = OffersBenchOptions(hosts=args.hosts, gpus_per_host=args.gpus_per_host, rounds=args.rounds, seed=args.seed)
    result = run_offers_bench(options)
    _write(args.json, result)
    print(offers_table(result))
    return 0


def _summaries_parser(sub: argparse._SubParsersAction) -> None:
    d = SummariesBenchOptions()
    p = sub.add_parser(
        "summaries",
        help="one-pass summaries of a whole fleet: the fleet view's figures and every host's reputation",
        description="Generate a fleet, then time management.services.fleet.fleet_figures over every GPU and the reputation "
        "score of every host, each beside its target (bench/README.md).",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts (default {d.hosts})")
    p.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host, help=f"GPUs per host (default {d.gpus_per_host})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"timed runs of each summary (default {d.rounds})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_summaries)


def _run_summaries(args: argparse.Namespace) -> int:
    options = SummariesBenchOptions(hosts=args.hosts, gpus_per_host=args.gpus_per_host, rounds=args.rounds)
    result = run_summaries_bench(options)
    _write(args.json, result)
    print(summaries_table(result))
    return 0


def _console_pages_parser(sub: argparse._SubParsersAction) -> None:
    d = ConsolePagesBenchOptions()
    p = sub.add_parser(
        "console-pages",
        help="the console's hosts and fleet pages in Chromium with a large fleet: best and slowest visit",
        description="Seed a store with a generated fleet, start the real Master on it, sign in as the operator in "
        "Debian's Chromium and time each fleet page from the request to its table shown.",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts (default {d.hosts})")
    p.add_argument("--gpus-per-host", type=int, default=d.gpus_per_host, help=f"GPUs per host (default {d.gpus_per_host})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"timed visits of each page (default {d.rounds})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_console_pages)


def _run_console_pages(args: argparse.Namespace) -> int:
    options = ConsolePagesBenchOptions(hosts=args.hosts, gpus_per_host=args.gpus_per_host, rounds=args.rounds)
    result = run_console_pages_bench(options)
    _write(args.json, result)
    print(console_pages_table(result))
    return 0


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    d = DemoBenchOptions()
    p = sub.add_parser(
        "demo",
        help="how long idlegrid demo takes to say it is up, fresh and restarted",
        description="Start idlegrid demo on a fresh state directory, then again on the same one, timing each from the "
        "start to its 'idlegrid demo is up' line; stop each with SIGINT.",
    )
    p.add_argument("--runs", type=int, default=d.runs, help=f"runs, the first on a fresh state directory (default {d.runs})")
    p.add_argument(
        "--timeout-s", type=float, default=d.timeout_s, help=f"give up on a run not up by then (default {d.timeout_s:g})"
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    result = run_demo_bench(DemoBenchOptions(runs=args.runs, timeout_s=args.timeout_s))
    _write(args.json, result)
    print(demo_table(result))
    return 0


def _takeover_parser(sub: argparse._SubParsersAction) -> None:
    d = TakeoverBenchOptions()
    p = sub.add_parser(
        "takeover",
        help="how long a standby Master takes to serve after the leader's SIGKILL",
        description="Two Masters with ha on one database, a relay and N real agents; SIGKILL the leader with commands in "
        "flight and time the standby serving, the relay re-linked, every agent ready and every command done (once).",
    )
    p.add_argument("--runs", type=int, default=d.runs, help=f"takeovers, each on a fresh grid (default {d.runs})")
    p.add_argument("--agents", type=int, default=d.agents, help=f"agents on the relay (default {d.agents})")
    p.add_argument("--commands", type=int, default=d.commands, help=f"commands per run, half in flight (default {d.commands})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_takeover)


def _run_takeover(args: argparse.Namespace) -> int:
    result = run_takeover_bench(TakeoverBenchOptions(runs=args.runs, agents=args.agents, commands=args.commands))
    _write(args.json, result)
    print(takeover_table(result))
    return 0


def _endpoints_parser(sub: argparse._SubParsersAction) -> None:
    d = EndpointsBenchOptions()
    p = sub.add_parser(
        "endpoints",
        help="a serverless endpoint on a local grid: request overhead, requests/s, cold starts, scale-up",
        description="Start a Master, a relay and sandboxed process-runtime hosts; time runsync round trips of 1 KB "
        "against the handler called directly (1 client, then many), commands to a host beside that load, cold starts "
        "per phase and a scale-up from zero (bench/endpoints.py).",
    )
    for f in fields(EndpointsBenchOptions):
        default = getattr(d, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default, help=f"(default {default})")
    p.add_argument("--work-dir", default="", help="where the grid's state directory goes (default: a temporary one)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_endpoints)


def _run_endpoints(args: argparse.Namespace) -> int:
    options = EndpointsBenchOptions(**{f.name: getattr(args, f.name) for f in fields(EndpointsBenchOptions)})
    result = run_endpoints_bench(options, args.work_dir)
    _write(args.json, result)
    print(endpoints_table(result))
    return 0


def _history_parser(sub: argparse._SubParsersAction) -> None:
    d = HistoryBenchOptions()
    p = sub.add_parser(
        "history",
        help="telemetry history queries of one GPU among 80,000 (and one host among 10,000): p50/p99 for a week",
        description="Seed a SQLite store with a week of one GPU's one-minute rollups (and its hours) among GPUs that "
        "all report, then time the history queries the API makes.",
    )
    p.add_argument("--gpus", type=int, default=d.gpus, help=f"GPUs reporting (default {d.gpus})")
    p.add_argument(
        "--filler-minutes", type=int, default=d.filler_minutes, help=f"minutes of every other GPU (default {d.filler_minutes})"
    )
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"timed runs of each query (default {d.rounds})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the generated values (default {d.seed})")
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"hosts reporting themselves (default {d.hosts})")
    p.add_argument("--no-loop", action="store_true", help="do not time a pass of the history loop over every GPU")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_history)


def _run_history(args: argparse.Namespace) -> int:
    options = HistoryBenchOptions(
        gpus=args.gpus,
        filler_minutes=args.filler_minutes,
        rounds=args.rounds,
        seed=args.seed,
        loop=not args.no_loop,
        hosts=args.hosts,
    )
    result = run_history_bench(options)
    _write(args.json, result)
    print(history_table(result))
    return 0


def _alerts_parser(sub: argparse._SubParsersAction) -> None:
    d = AlertsBenchOptions()
    p = sub.add_parser(
        "alerts",
        help="one alert evaluation over 80,000 GPUs, quiet and with 1,000 hot",
        description="A Master whose registry holds the fleet, every GPU reporting each round through the sample "
        "listeners, the shipped alert rules evaluated once a round: time, series and points kept, memory.",
    )
    p.add_argument("--agents", type=int, default=d.agents, help=f"hosts (default {d.agents})")
    p.add_argument("--gpus-per-agent", type=int, default=d.gpus_per_agent, help=f"GPUs per host (default {d.gpus_per_agent})")
    p.add_argument("--hot", type=int, default=d.hot, help=f"GPUs overheating in the hot rounds (default {d.hot})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"evaluations per phase (default {d.rounds})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_alerts)


def _run_alerts(args: argparse.Namespace) -> int:
    options = AlertsBenchOptions(agents=args.agents, gpus_per_agent=args.gpus_per_agent, hot=args.hot, rounds=args.rounds)
    result = run_alerts_bench(options)
    _write(args.json, result)
    print(alerts_table(result))
    return 0


def _ssh_parser(sub: argparse._SubParsersAction) -> None:
    d = SshBenchOptions()
    p = sub.add_parser(
        "ssh",
        help="scp throughput through a relay, and control-frame latency meanwhile",
        description="A local grid with one relay: commands and heartbeats timed while idle, then while OpenSSH's scp "
        "copies --megabytes to a workload and back through the same relay (docs/ssh.md).",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"agents behind the relay (default {d.hosts})")
    p.add_argument("--megabytes", type=int, default=d.megabytes, help=f"MB each scp moves (default {d.megabytes})")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s, help=f"heartbeat interval (default {d.heartbeat_s:g})")
    p.add_argument("--cmd-rate", type=float, default=d.cmd_rate, help=f"commands a second (default {d.cmd_rate:g})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"uploads and downloads (default {d.rounds})")
    p.add_argument("--idle-s", type=float, default=d.idle_s, help=f"seconds of the idle phase (default {d.idle_s:g})")
    p.add_argument(
        "--relay-bytes-per-s", type=int, default=0, help="the relay's bandwidth per tunnel (default: the relay's default)"
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_ssh)


def _run_ssh(args: argparse.Namespace) -> int:
    options = SshBenchOptions(
        hosts=args.hosts,
        megabytes=args.megabytes,
        heartbeat_s=args.heartbeat_s,
        cmd_rate=args.cmd_rate,
        idle_s=args.idle_s,
        rounds=args.rounds,
        relay_bytes_per_s=args.relay_bytes_per_s,
    )
    result = run_ssh_bench(options)
    _write(args.json, result)
    print(ssh_table(result))
    return 0


def _tunnel_parser(sub: argparse._SubParsersAction) -> None:
    d = TunnelBenchOptions()
    p = sub.add_parser(
        "tunnel",
        help="control-frame latency through a relay while a tunnel moves bulk data",
        description="A local grid with one relay: commands and heartbeats timed while idle, then while a renter's "
        "tunnel moves --megabytes through the same relay.",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"agents behind the relay (default {d.hosts})")
    p.add_argument("--megabytes", type=int, default=d.megabytes, help=f"MB the tunnel moves (default {d.megabytes})")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s, help=f"heartbeat interval (default {d.heartbeat_s:g})")
    p.add_argument("--cmd-rate", type=float, default=d.cmd_rate, help=f"commands a second (default {d.cmd_rate:g})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"transfers in the tunnel phase (default {d.rounds})")
    p.add_argument("--idle-s", type=float, default=d.idle_s, help=f"seconds of the idle phase (default {d.idle_s:g})")
    p.add_argument(
        "--relay-bytes-per-s", type=int, default=0, help="the relay's bandwidth per tunnel (default: the relay's default)"
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_tunnel)


def _run_tunnel(args: argparse.Namespace) -> int:
    options = TunnelBenchOptions(
        hosts=args.hosts,
        megabytes=args.megabytes,
        heartbeat_s=args.heartbeat_s,
        cmd_rate=args.cmd_rate,
        idle_s=args.idle_s,
        rounds=args.rounds,
        relay_bytes_per_s=args.relay_bytes_per_s,
    )
    result = run_tunnel_bench(options)
    _write(args.json, result)
    print(tunnel_table(result))
    return 0


def _link_parser(sub: argparse._SubParsersAction) -> None:
    d = LinkBenchOptions()
    p = sub.add_parser(
        "link",
        help="an HTTPS link's throughput through a relay, and control-frame latency meanwhile",
        description="A local grid with one relay: commands and heartbeats timed while idle, then while a client "
        "downloads --megabytes from a renter's web server through its link (the Master, the relay, the agent).",
    )
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"agents behind the relay (default {d.hosts})")
    p.add_argument("--megabytes", type=int, default=d.megabytes, help=f"MB each download moves (default {d.megabytes})")
    p.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s, help=f"heartbeat interval (default {d.heartbeat_s:g})")
    p.add_argument("--cmd-rate", type=float, default=d.cmd_rate, help=f"commands a second (default {d.cmd_rate:g})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"downloads in the link phase (default {d.rounds})")
    p.add_argument(
        "--link-bytes-per-s", type=int, default=d.link_bytes_per_s, help="the Master's [links] bytes_per_s (default: its own)"
    )
    p.add_argument("--idle-s", type=float, default=d.idle_s, help=f"seconds of the idle phase (default {d.idle_s:g})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_link)


def _run_link(args: argparse.Namespace) -> int:
    options = LinkBenchOptions(
        hosts=args.hosts,
        megabytes=args.megabytes,
        heartbeat_s=args.heartbeat_s,
        cmd_rate=args.cmd_rate,
        idle_s=args.idle_s,
        rounds=args.rounds,
        link_bytes_per_s=args.link_bytes_per_s,
    )
    result = run_link_bench(options)
    _write(args.json, result)
    print(link_table(result))
    return 0


def _storage_parser(sub: argparse._SubParsersAction) -> None:
    d = StorageBenchOptions()
    p = sub.add_parser(
        "storage",
        help="checkpoint upload and restore throughput, and commands while a host uploads",
        description="A checkpoint of --gigabytes uploaded and restored by the agent's data plane against an S3 server on "
        "127.0.0.1; then a local grid: commands to a host timed while idle and while it uploads such a checkpoint.",
    )
    p.add_argument("--gigabytes", type=float, default=d.gigabytes, help=f"checkpoint size (default {d.gigabytes:g})")
    p.add_argument("--hosts", type=int, default=d.hosts, help=f"agents in the grid (default {d.hosts})")
    p.add_argument("--cmd-rate", type=float, default=d.cmd_rate, help=f"commands a second (default {d.cmd_rate:g})")
    p.add_argument("--idle-s", type=float, default=d.idle_s, help=f"seconds of the idle phase (default {d.idle_s:g})")
    p.add_argument("--part-mib", type=int, default=d.part_mib, help=f"multipart part size (default {d.part_mib})")
    p.add_argument("--skip-grid", action="store_true", help="throughput only (no grid)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_storage)


def _run_storage(args: argparse.Namespace) -> int:
    options = StorageBenchOptions(
        gigabytes=args.gigabytes,
        hosts=args.hosts,
        cmd_rate=args.cmd_rate,
        idle_s=args.idle_s,
        part_mib=args.part_mib,
        skip_grid=args.skip_grid,
    )
    result = run_storage_bench(options)
    _write(args.json, result)
    print(storage_table(result))
    return 0


def _write(path: Path | None, data: Any) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 or value == 0 else f"{value:.3g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _verdict(key: str, value: Any) -> str:
    if key not in TARGETS:
        return ""
    op, limit = TARGETS[key]
    if value is None:
        return f"target {op} {limit:g}: not measured"
    met = {"<=": value <= limit, "<": value < limit, ">=": value >= limit}[op]
    return f"target {op} {limit:g}: {'met' if met else 'MISSED'}"


def fleet_table(r: dict[str, Any]) -> str:
    backlog = r.get("backlog", {})
    commands = r.get("commands", {})
    rows = [
        ("agents x GPUs", f"{r['agents']} x {r['gpus_per_agent']}", ""),
        ("ready_s (all agents welcomed)", r.get("ready_s"), _verdict("ready_s", r.get("ready_s"))),
        ("connect rate, agents/s", r.get("connect_rate_per_s"), ""),
        ("reconnects during the ramp", r.get("reconnects"), ""),
        ("ramp backlog drained after s", f"{_fmt(r.get('drain_s'))} ({_fmt(r.get('drain_left_bytes'))} bytes left)", ""),
        (
            "report pace, msgs/s at the hold (waited s)",
            f"{_fmt(r.get('pace_at_hold'))}, {_fmt(r.get('rate_at_hold'))} ({_fmt(r.get('pace_wait_s'))})",
            "pace 1 = full",
        ),
        ("relay KiB per agent", r.get("relay_kib_per_agent"), _verdict("relay_kib_per_agent", r.get("relay_kib_per_agent"))),
        ("Master KiB per agent", r.get("master_kib_per_agent"), _verdict("master_kib_per_agent", r.get("master_kib_per_agent"))),
        ("msgs/s to the Master (expected)", f"{_fmt(r.get('msgs_per_s'))} ({_fmt(r.get('expected_msgs_per_s'))})", ""),
        (
            "frames/s into the Master: link / agent",
            f"{_fmt(r.get('master_link_frames_per_s'))} / {_fmt(r.get('master_agent_frames_per_s'))}",
            "a fold is one link frame",
        ),
        ("Master CPU per 1,000 agents (cores, hold)", r.get("master_cpu_per_1000_agents"), ""),
        ("heartbeats/s, telemetry samples/s", f"{_fmt(r.get('heartbeats_per_s'))}, {_fmt(r.get('telemetry_samples_per_s'))}", ""),
        (
            "backlog: relay frames end / max",
            f"{_fmt(backlog.get('relay_buffered_end'))} / {_fmt(backlog.get('relay_buffered_max'))}",
            "",
        ),
        (
            "backlog: link queue bytes end / max",
            f"{_fmt(backlog.get('link_queued_bytes_end'))} / {_fmt(backlog.get('link_queued_bytes_max'))}",
            "",
        ),
        ("commands: issued, states", f"{commands.get('issued')} {commands.get('states')}", ""),
        ("duplicate executions", commands.get("duplicate_executions"), "must be 0"),
        (
            "cmd RTT p50 / p99 / max ms",
            f"{_fmt(r.get('cmd_rtt_p50_ms'))} / {_fmt(r.get('cmd_rtt_p99_ms'))} / {_fmt(r.get('cmd_rtt_max_ms'))}",
            _verdict("cmd_rtt_p99_ms", r.get("cmd_rtt_p99_ms")),
        ),
        ("cmd phases p99 ms " + "/".join(PHASES), _phases_p99(r.get("cmd_phases")), _tail_held(r.get("cmd_phases"))),
        ("telemetry shed at the relays (hold)", r.get("telemetry_shed_at_relays"), "counted, latest kept"),
        (
            "Master intake: shed (hold), pace at end",
            f"{_fmt(r.get('master_intake', {}).get('shed'))}, {_fmt(r.get('master_intake', {}).get('pace_factor_end'))}",
            "",
        ),
        ("relay throughput msgs/s", r.get("relay_msgs_per_s"), ""),
        ("echo baseline msgs/s", r.get("baseline_msgs_per_s"), ""),
        ("echo server KiB per connection", r.get("baseline", {}).get("echo_kib_per_connection"), "transport alone"),
        ("relay / baseline", r.get("relay_vs_baseline"), _verdict("relay_vs_baseline", r.get("relay_vs_baseline"))),
    ]
    storm = r.get("storm")
    if storm:
        rows += [
            (f"storm: {storm.get('killed')} SIGKILLed, agents on it", storm.get("agents_on_it"), ""),
            (
                "storm: all back after s (fewest ready)",
                f"{_fmt(storm.get('all_back_s'))} ({_fmt(storm.get('fewest_ready'))})",
                "",
            ),
            (
                "storm: cmd RTT p50 / p99 / max ms",
                " / ".join(_fmt(storm.get(f"cmd_rtt_{q}_ms")) for q in ("p50", "p99", "max")),
                "through the surviving relays",
            ),
            ("storm: cmd phases p99 ms", _phases_p99(storm.get("cmd_phases")), _tail_held(storm.get("cmd_phases"))),
            ("storm: commands", f"{storm.get('commands')}", ""),
        ]
    for name, proc in r.get("processes", {}).items():
        cpu = " ".join(f"{k[4:-4]} {v}%" for k, v in proc.items() if k.startswith("cpu_") and v is not None)
        rss = f"{proc.get('rss_idle_mib', '-')} -> {proc.get('rss_end_mib', '-')} MiB" if "rss_end_mib" in proc else ""
        rows.append((f"process {name}", f"CPU {cpu}", rss))
    width = max(len(row[0]) for row in rows)
    return "\n".join(f"{name:<{width}}  {_fmt(value):<28} {note}".rstrip() for name, value, note in rows)


def _phases_p99(phases: dict[str, Any] | None) -> str:
    """A command's phases' p99s (bench.fleet.PHASES), in their order."""
    return " / ".join(_fmt((phases or {}).get(p, {}).get("p99_ms")) for p in PHASES) if phases else "-"


def _tail_held(phases: dict[str, Any] | None) -> str:
    held = (phases or {}).get("tail_held_in") or {}
    return "slowest 1 % held in: " + ", ".join(f"{p} {n}" for p, n in sorted(held.items(), key=lambda i: -i[1])) if held else ""


def ingest_table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'store':<22} {'rollups/s':>12} {'raw inserts/s':>14} {'ratio':>6}  {'target >= 0.5':<13} {'paced rollups/s':>16}"]
    for r in results:
        ratio = r.get("vs_baseline")
        verdict = "met" if ratio is not None and ratio >= 0.5 else "MISSED"
        lines.append(
            f"{r['store']:<22} {r['rollups_per_s']:>12,.0f} {r['baseline_per_s']:>14,.0f} {ratio:>6.2f}  "
            f"{verdict:<13} {r.get('paced_rollups_per_s') or 0:>16,.0f}"
        )
    return "\n".join(lines)


def _cli_start_parser(sub: argparse._SubParsersAction) -> None:
    d = CliStartBenchOptions()
    p = sub.add_parser(
        "cli-start",
        help="CPU an idlegrid command costs before its work (--help, workload list, offers search), and its imports",
        description="Run idlegrid --help, workload list and offers search (against a stub API answering empty pages) "
        "several times, interleaved with python -c pass, and report each one's CPU time (min/median/max) and, from "
        "one more run with -X importtime, the modules that cost most.",
    )
    p.add_argument("--runs", type=int, default=d.runs, help=f"runs of each command (default {d.runs})")
    p.add_argument(
        "--tree",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="also measure another checkout's code (PYTHONPATH=DIR) in the same rounds, e.g. a baseline (default: none)",
    )
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_cli_start)


def _run_cli_start(args: argparse.Namespace) -> int:
    result = run_cli_start_bench(CliStartBenchOptions(runs=args.runs, trees=tuple(args.tree)))
    _write(args.json, result)
    print(cli_start_table(result))
    return 0


def _challenge_parser(sub: argparse._SubParsersAction) -> None:
    d = ChallengeBenchOptions()
    p = sub.add_parser(
        "challenge",
        help="the Master's check of a verification challenge: CPU per check, event-loop stall",
        description="Answer a challenge of each form honestly here, then time the Master's check of the openings "
        "(CPU per check, and the longest stall of an event loop while it runs in a thread).",
    )
    p.add_argument("--round-n", type=int, default=d.round_n, help=f"rounds form n (default {d.round_n})")
    p.add_argument("--round-k", type=int, default=d.round_k, help=f"rounds form k (default {d.round_k})")
    p.add_argument("--rounds", type=int, default=d.rounds, help=f"rounds of the short challenge (default {d.rounds})")
    p.add_argument("--sum-n", type=int, default=d.sum_n, help=f"sum form n (default {d.sum_n})")
    p.add_argument("--sum-k", type=int, default=d.sum_k, help=f"sum form k (default {d.sum_k})")
    p.add_argument("--runs", type=int, default=d.runs, help=f"timed checks of each form (default {d.runs})")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=_run_challenge)


def _run_challenge(args: argparse.Namespace) -> int:
    options = ChallengeBenchOptions(
        round_n=args.round_n, round_k=args.round_k, rounds=args.rounds, sum_n=args.sum_n, sum_k=args.sum_k, runs=args.runs
    )
    result = run_challenge_bench(options)
    _write(args.json, result)
    print(challenge_table(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="idlegrid benchmarks (see bench/README.md)")
    sub = parser.add_subparsers(dest="benchmark", required=True)
    _fleet_parser(sub)
    _ingest_parser(sub)
    _api_pages_parser(sub)
    _scheduler_parser(sub)
    _scheduler_snapshot_parser(sub)
    _offers_parser(sub)
    _tunnel_parser(sub)
    _link_parser(sub)
    _ssh_parser(sub)
    _storage_parser(sub)
    _history_parser(sub)
    _alerts_parser(sub)
    _summaries_parser(sub)
    _console_pages_parser(sub)
    _demo_parser(sub)
    _cli_start_parser(sub)
    _endpoints_parser(sub)
    _challenge_parser(sub)
    _takeover_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
