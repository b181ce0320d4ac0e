"""A command line imports what its command uses (docs/cli.md, "Starting fast"): the daemons, the Master, the local grid,
the services, aiohttp, websockets and cryptography are for the commands that run or open them. What this costs in CPU
is measured by ``python -m bench cli-start`` (bench/README.md), never here."""

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from bench.cli_start import EmptyApi
from management.cli.main import build_parser, named_command
from tests.support.grid import REPO

# Parts of the grid (and libraries) that a command which only reads the API has no use for.
HEAVY = (
    "master",
    "agent",
    "access",
    "management.devgrid",
    "management.services",
    "management.app",
    "management.api",
    "aiohttp",
    "pymongo",
    "websockets",
    "cryptography",
)

# Runs the command line as the installed `idlegrid` script does, then writes what it imported.
PROBE = """
import json, sys
from management.cli.main import main
out, argv = sys.argv[1], sys.argv[2:]
try:
    code = main(argv)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


@pytest.fixture(scope="module")
def empty_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EmptyApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def imported_by(tmp_path, *args: str) -> tuple[int, set[str]]:
    out = tmp_path / "imported.json"
    done = subprocess.run([sys.executable, "-c", PROBE, str(out), *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.exists(), done.stderr
    probe = json.loads(out.read_text())
    return probe["code"], set(probe["modules"])


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_daemon_and_no_heavy_library(tmp_path):
    code, modules = imported_by(tmp_path, "--help")
    assert code == 0
    assert heavy_among(modules) == []


@pytest.mark.parametrize("command", [["workload", "list"], ["offers", "search"]], ids=" ".join)
def test_a_command_that_reads_the_api_imports_only_the_client(tmp_path, empty_api, command):
    code, modules = imported_by(tmp_path, *command, "--api", empty_api, "--api-key", "igak_test")
    assert code == 0
    assert "management.client.api" in modules  # it did call the API, with the blocking client
    assert heavy_among(modules) == []


def test_a_daemon_command_still_gets_its_whole_parser(tmp_path):
    code, modules = imported_by(tmp_path, "agent", "--help")
    assert code == 0
    assert "agent.config" in modules  # the defaults its help shows come from the agent's settings


def test_the_top_level_help_is_the_same_whether_the_daemons_parsers_are_built_or_not():
    # Their help lines then come from main.DAEMON_HELP, or from their own parsers: they must agree.
    assert build_parser("workload").format_help() == build_parser().format_help()


@pytest.mark.parametrize(
    ("argv", "command"),
    [([], ""), (["--help"], ""), (["--version"], ""), (["workload", "list", "--json"], "workload"), (["-h", "agent"], "agent")],
)
def test_the_command_a_command_line_names_is_its_first_word_that_is_not_an_option(argv, command):
    assert named_command(argv) == command
