"""``python -m bench cli-start``: what an ``idlegrid`` command costs before it does its work (issue 37, point 5).

Each command runs as the installed console script does (``idlegrid ARGS``: the venv's ``bin/idlegrid``, else
``python -m management.cli``), several times, interleaved, against a stub API on 127.0.0.1 that answers every GET with
an empty page: what is measured is the process's whole CPU time (user + system, from the kernel's rusage of the child),
start-up and imports nearly all of it. ``python -c pass`` runs beside them as the interpreter's own floor, so figures
from a busy machine can be read against it. One more run of each with ``-X importtime`` says which modules were loaded
and which cost most (self time, summed by top-level package), and whether the heavy parts of the grid (the Master,
the agent, the local grid, the services, aiohttp, pymongo) were among them.

``--tree DIR`` measures another checkout's code too (``PYTHONPATH=DIR``, ahead of the editable install), in the same
rounds: a before/after on the same machine at the same moment. Target: each command under 0.25 s of CPU (median).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TARGET_CPU_S = 0.25
REPO = Path(__file__).resolve().parent.parent
COMMANDS: dict[str, tuple[str, ...]] = {
    "--help": ("--help",),
    "workload list": ("workload", "list"),
    "offers search": ("offers", "search"),
}
INTERPRETER = "python -c pass"
# Parts of the grid a command that only talks to the API has no use for.
HEAVY = ("master", "agent", "access", "management.devgrid", "management.services", "management.app", "aiohttp", "pymongo")
EMPTY_PAGE = json.dumps({"items": [], "next_cursor": None, "offers": [], "total": 0}).encode()


@dataclass(frozen=True)
class CliStartBenchOptions:
    runs: int = 10
    trees: Sequence[Path] = field(default_factory=tuple)  # other checkouts measured in the same rounds
    top: int = 8  # modules and packages listed per command


class EmptyApi(BaseHTTPRequestHandler):
    """A management API with nothing in it: every GET is an empty page (what the commands measured here ask)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(EMPTY_PAGE)))
        self.end_headers()
        self.wfile.write(EMPTY_PAGE)

    def log_message(self, *_: Any) -> None:
        pass


def _idlegrid() -> list[str]:
    script = Path(sys.executable).parent / "idlegrid"
    return [str(script)] if script.exists() else ["-m", "management.cli"]


def _argv(command: str, api: str, xopts: Sequence[str] = ()) -> list[str]:
    if command == INTERPRETER:
        return [sys.executable, *xopts, "-c", "pass"]
    args = list(COMMANDS[command])
    if args != ["--help"]:
        args += ["--api", api, "--api-key", "bench"]
    return [sys.executable, *xopts, *_idlegrid(), *args]


def _env(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDLEGRID_", "PYTHON"))}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _cpu_of_one_run(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) the child spent, from the kernel's accounting of waited-for children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def parse_importtime(stderr: str) -> dict[str, tuple[int, int]]:
    """``-X importtime`` lines -> {module: (self us, cumulative us)}."""
    modules: dict[str, tuple[int, int]] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|")
        modules[name.strip()] = (int(self_us), int(cumulative_us))
    return modules


def _imports(command: str, api: str, tree: Path | None, top: int) -> dict[str, Any]:
    argv = _argv(command, api, ("-X", "importtime"))
    done = subprocess.run(argv, env=_env(tree), cwd=REPO, capture_output=True, text=True, check=False)
    modules = parse_importtime(done.stderr)
    packages: dict[str, int] = defaultdict(int)
    for name, (self_us, _) in modules.items():
        packages[name.split(".")[0]] += self_us
    by_self = sorted(modules.items(), key=lambda item: -item[1][0])[:top]
    return {
        "modules": len(modules),
        "import_ms": round(sum(s for s, _ in modules.values()) / 1000, 1),
        "top_modules_ms": {name: round(s / 1000, 1) for name, (s, _) in by_self},
        "top_packages_ms": {name: round(us / 1000, 1) for name, us in sorted(packages.items(), key=lambda i: -i[1])[:top]},
        "heavy_imported": [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)],
    }


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "min_s": round(min(samples), 3),
        "median_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
    }


def run_cli_start_bench(options: CliStartBenchOptions) -> dict[str, Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}"
    trees: dict[str, Path | None] = {"this tree": None} | {str(tree): tree.resolve() for tree in options.trees}
    commands = [INTERPRETER, *COMMANDS]
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    try:
        for _ in range(options.runs):  # round-robin, so load that comes and goes falls on every command alike
            for tree_name, tree in trees.items():
                for command in commands:
                    samples[tree_name, command].append(_cpu_of_one_run(_argv(command, api), _env(tree)))
        results = {
            tree_name: {
                command: _summary(samples[tree_name, command])
                | ({} if command == INTERPRETER else _imports(command, api, tree, options.top))
                for command in commands
            }
            for tree_name, tree in trees.items()
        }
    finally:
        server.shutdown()
    return {"runs": options.runs, "target_cpu_s": TARGET_CPU_S, "load_average": os.getloadavg(), "trees": results}


def cli_start_table(result: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in result["load_average"])
    lines = [f"{result['runs']} runs each, interleaved; load average {load}; target: median < {result['target_cpu_s']} s of CPU"]
    for tree_name, commands in result["trees"].items():
        lines.append(f"\n{tree_name}")
        lines.append(f"  {'command':<16} {'CPU min / median / max s':>26}  {'modules':>7}  {'imports ms':>10}  verdict")
        for command, r in commands.items():
            figures = f"{r['min_s']:.3f} / {r['median_s']:.3f} / {r['max_s']:.3f}"
            if command == INTERPRETER:
                lines.append(f"  {command:<16} {figures:>26}  {'':>7}  {'':>10}  the floor")
                continue
            verdict = "met" if r["median_s"] < result["target_cpu_s"] else "MISSED"
            lines.append(f"  {command:<16} {figures:>26}  {r['modules']:>7}  {r['import_ms']:>10.1f}  {verdict}")
        for command, r in commands.items():
            if command == INTERPRETER:
                continue
            lines.append(f"  {command}: heavy parts imported: {', '.join(r['heavy_imported']) or 'none'}")
            lines.append("    costliest packages ms: " + ", ".join(f"{n} {ms:g}" for n, ms in r["top_packages_ms"].items()))
            lines.append("    costliest modules ms: " + ", ".join(f"{n} {ms:g}" for n, ms in r["top_modules_ms"].items()))
    return "\n".join(lines)
