"""The demo's gangs get their overlay (docs/localgrid.md, "The demo's lighthouse"): a renter pastes the banner's gang
line into bash and its two replicas, sandboxed processes on the demo's hosts, each in a network namespace of its own,
meet over the overlay: each is told its rank, the world size and rank 0's overlay address and port, and rank 1 fetches
a file rank 0 serves there. The demo is started twice on one state directory (the second run lists a lighthouse of its
own in the Master's config), and each stop leaves no lighthouse process and no veth behind.

Real parts: the demo's Master, relays and agents as processes (simulated GPUs), slirp4netns, Debian's nebula for every
replica and for the lighthouse (in a namespace the demo makes), Debian's python3 in the replicas."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.runtime.process import BASE_PATH
from management.devgrid.lighthouse import LIGHTHOUSE_ADDRESS, VETH_PREFIX, lighthouse_unavailable
from tests.e2e.test_demo import UP_BOUND_S, DemoRun, assert_stopped_cleanly, banner_command
from tests.support.grid import free_port, wait_for

# The replicas run as an unprivileged uid with the sandbox's PATH: its python3 serves and fetches.
_why = lighthouse_unavailable() or ("" if shutil.which("python3", path=BASE_PATH) else f"no python3 on {BASE_PATH}")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(_why), reason=_why or "runs")]

ENDPOINT = re.compile(r"overlay: +gangs meet through lighthouse 100\.64\.0\.1 at udp (198\.1[89]\.[0-9.]+):4242")


def lighthouse_left(state_dir: Path) -> list[str]:
    """What a stopped demo's lighthouse must not leave: processes run from its directory, veths of its slot."""
    workdir = str(state_dir / "lighthouse")
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(f"/proc/{entry.name}/cwd").readlink().as_posix().startswith(workdir):
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"process {entry.name}: {args}")
        except OSError:
            pass
    return left


def veth_of(endpoint: str) -> list[str]:
    """The machine's end of the lighthouse's veth, found by the /30 the endpoint is on ([] once it is gone)."""
    near = endpoint.rsplit(".", 1)[0] + "." + str(int(endpoint.rsplit(".", 1)[1]) - 1)
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[1] for line in shown.splitlines() if f" {near}/30 " in line and VETH_PREFIX in line]


def up_with_lighthouse(run: DemoRun, state_dir: Path) -> tuple[str, str]:
    """The banner and the lighthouse's endpoint it names, checked against the Master's config and the machine."""
    banner = run.wait_up(UP_BOUND_S)  # a bound on waiting (a loaded machine took over 30 s); `python -m bench demo` times it
    found = ENDPOINT.search(banner)
    assert found, banner
    endpoint = found.group(1)
    config = (state_dir / "master.toml").read_text()
    assert f'address = "{LIGHTHOUSE_ADDRESS}"' in config and f'"{endpoint}:4242"' in config, config
    assert veth_of(endpoint), f"no veth on this side of {endpoint}"
    return banner, endpoint


def assert_lighthouse_gone(state_dir: Path, endpoint: str) -> None:
    wait_for(lambda: lighthouse_left(state_dir) == [], 10, "the lighthouse's processes to end")
    wait_for(lambda: veth_of(endpoint) == [], 10, "the lighthouse's veth to go with its namespace")


def test_a_gang_pasted_from_the_banner_meets_over_the_demos_overlay_and_a_restart_runs_a_lighthouse_again(tmp_path):
    state_dir, port = tmp_path / "demo", free_port()
    first = DemoRun(state_dir, port, "--agents", "2", "--no-container-host")
    try:
        _, first_endpoint = up_with_lighthouse(first, state_dir)
        print(f"demo with its lighthouse, first run: up after {time.time() - first.started:.1f} s")
    finally:
        assert_stopped_cleanly(first)
    assert_lighthouse_gone(state_dir, first_endpoint)

    run = DemoRun(state_dir, port, "--agents", "2", "--no-container-host")
    try:
        banner, endpoint = up_with_lighthouse(run, state_dir)
        print(f"demo with its lighthouse, second run: up after {time.time() - run.started:.1f} s")
        export = banner_command(banner, "export")

        def paste(label: str, workload_id: str = "", *, replica: int = 1) -> str:
            """The banner's ``label`` line run by bash as a person pastes it (``--replica 1`` as ``replica``)."""
            command = banner_command(banner, label).replace(" ID", f" {workload_id}")
            command = command.replace("--replica 1", f"--replica {replica}")
            done = subprocess.run(["bash", "-c", f"{export}\n{command}"], cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
            return done.stdout

        submitted = paste("gang")
        assert submitted.startswith("submitted wl-"), submitted
        workload_id = submitted.split()[1]
        renter = run.renter()
        running = wait_for(lambda: (w := renter.workload(workload_id))["state"] == "running" and w, 30, "the gang to run")
        network = running["network"]
        assert network is not None and network["network"].startswith("100.64."), running
        rank0, rank1 = (r["address"] for r in sorted(network["replicas"], key=lambda r: r["replica"]))

        # Replica 1 was told its place and fetched what rank 0 serves at MASTER_ADDR:MASTER_PORT, over the overlay.
        said = wait_for(lambda: "hello from" in (out := paste("rank 1 says", workload_id)) and out, 60, "rank 1 to fetch")
        assert f"rank 1 of 2, rank 0 at {rank0}:29500" in said, said
        assert f"hello from rank 0 at {rank0}" in said, said
        served = paste("rank 1 says", workload_id, replica=0)
        assert f"rank 0 of 2, rank 0 at {rank0}:29500" in served, served
        assert f"{rank1} - - " in served and '"GET /hello HTTP/1.1" 200' in served, served  # from rank 1's overlay address
        assert f"network:     {network['network']}: replica 0 {rank0}, replica 1 {rank1}" in paste("show", workload_id)
        assert "cancelled" in paste("cancel", workload_id)
    finally:
        assert_stopped_cleanly(run)
    assert_lighthouse_gone(state_dir, endpoint)
