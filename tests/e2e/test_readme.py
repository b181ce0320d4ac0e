"""Every command of the README's shell sessions and of the demo's banner, run as written against a demo.

A reader starts ``idlegrid demo``, pastes the banner's ``export`` line into another shell, then types the README's
``$ `` lines in order (tests/support/readme.py extracts them), writing in the ids their own commands printed where the
README shows sample ones, and the demo's address where the README shows the default one. Then every command line of
the banner. Each must exit 0 (a command the README shows in the background, ``... &``, must still be running when the
session ends), and what the README says happens must happen: the workload runs, ``exec`` carries the exit status, the
forwarded port and SSH's ``-L`` answer with the web server's page, ``scp`` copies, the checkpointed job checkpoints
into the demo's object store and, when its host is SIGKILLed, resumes elsewhere from its checkpoint.

Real parts: the demo's processes (Master, relays, sandboxed process-runtime hosts with simulated GPUs: no GPU
here), its object store (moto), Debian's OpenSSH client and curl, bash. ``~/.ssh`` is the reader's own: each command
runs in a mount namespace of its own where a directory of the test's is bound over it, so the machine's is never read
or written.
"""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_demo import DemoRun, assert_stopped_cleanly
from tests.support.grid import REPO, free_port, wait_for
from tests.support.readme import Session, Step, banner_lines, sessions

_why = "" if os.geteuid() == 0 else "the demo's hosts sandbox workloads, and the test binds ~/.ssh, only as root"
for _tool in ("ssh", "scp", "curl", "unshare"):
    if not _why and subprocess.run(["which", _tool], capture_output=True).returncode != 0:
        _why = f"{_tool} is not installed (scripts/setup-env installs it)"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(_why), reason=_why or "runs")]

README = REPO / "README.md"
DEFAULT_API = "http://127.0.0.1:7000"  # what the README shows; the demo's own address is written in instead
DEFAULT_STORE = "http://127.0.0.1:7900"
COMMAND_TIMEOUT_S = 60
RUNNING_TIMEOUT_S = 30
BACKGROUND_SETTLE_S = 10.0  # how long a reader gives a command they sent to the background before the next


@dataclass
class Reader:
    """A person at a shell: the banner's export line pasted, ``~/.ssh`` their own, ids learned as they go."""

    run: DemoRun
    export: str
    ssh_dir: Path
    cwd: Path
    session: Session = field(default_factory=Session)
    background: list[subprocess.Popen[str]] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (command as typed, what it printed)

    def script(self, command: str, *, operator: bool) -> list[str]:
        key = f'\nexport IDLEGRID_API_KEY="$(cat {self.run.state_dir / "operator.token"})"' if operator else ""
        body = f"{self.export}{key}\n{command}\n"
        home = pwd.getpwuid(os.getuid()).pw_dir
        # A mount namespace of its own, ~/.ssh the test's directory in it: the machine's is never touched.
        bind = 'mount --bind "$1" "$2/.ssh" && export HOME="$2" && exec bash -c "$3"'
        return ["unshare", "--mount", "--propagation", "private", "bash", "-c", bind, "_", str(self.ssh_dir), home, body]

    def type(self, step: Step | str, *, operator: bool = False, retry_s: float = 0.0, lasting: bool = False) -> str:
        """Run one command as typed (after the ids it names run); its output. A command the README sends to the
        background, or one that runs until Ctrl-C (``lasting``), is started and left running."""
        written = step.command if isinstance(step, Step) else step
        command = self.session.typed(written)
        self._wait_named_workloads_start(command)
        if command.rstrip().endswith("&") and not command.rstrip().endswith("&&"):
            return self._start_background(command.rstrip().removesuffix("&"), operator=operator)
        if lasting:
            return self._start_background(command, operator=operator)
        deadline = time.monotonic() + retry_s
        while True:
            done = subprocess.run(
                self.script(command, operator=operator),
                cwd=self.cwd,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            says_something = done.stdout or not (isinstance(step, Step) and step.sample)
            if (done.returncode == 0 and says_something) or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a reader tries again a moment later (a forward still opening)
        assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
        self.outputs.append((command, done.stdout))
        if isinstance(step, Step):
            self.session.learn(step.sample, done.stdout)
        return done.stdout

    def _start_background(self, command: str, *, operator: bool) -> str:
        process = subprocess.Popen(
            self.script(command, operator=operator),
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.background.append(process)
        first = ""
        if "port-forward" in command:  # it says when it listens
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first.startswith("Forwarding "), f"$ {command} &\n{first}"
        assert process.poll() is None, f"$ {command} & ended at once"
        return first

    def _wait_named_workloads_start(self, command: str) -> None:
        """A reader looks at ``workload list`` until what they submitted runs before reaching into it."""
        if " get " in command or " list" in command:  # what a reader looks at while it starts
            return
        renter = self.run.renter()
        for workload_id in re.findall(r"\bwl-[0-9a-f]{16}\b", command):

            def started(w: str = workload_id) -> bool:
                return renter.workload(w)["state"] not in ("queued", "scheduled", "starting")

            wait_for(started, RUNNING_TIMEOUT_S, f"{workload_id} to run")

    def stop_background(self) -> None:
        """Each command sent to the background must still run; then it is stopped."""
        running, self.background = self.background, []
        for process in running:
            if process.poll() is not None:
                said = process.stdout.read() if process.stdout is not None else ""
                raise AssertionError(f"a background command ended early ({process.returncode}): {process.args!r}\n{said}")
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def demo_reader(tmp_path: Path, *flags: str) -> Iterator[Reader]:
    """A demo with 3 process hosts (and ``flags``), and a reader at a shell beside it, the banner's export pasted."""
    run = DemoRun(tmp_path / "demo", free_port(), "--agents", "3", *flags)
    try:
        run.wait_up(90)  # a bound; how fast it is up is `python -m bench demo`
        reader = make_reader(run, tmp_path)
        try:
            yield reader
        finally:
            reader.stop_background()
    finally:
        assert_stopped_cleanly(run)


def make_reader(demo: DemoRun, tmp_path: Path) -> Reader:
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reader@demo", "-f", str(ssh_dir / "id_ed25519")])
    (Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh").mkdir(mode=0o700, exist_ok=True)  # the mount point
    cwd = tmp_path / "shell"
    cwd.mkdir()
    (cwd / "README.md").write_bytes(README.read_bytes())  # what the README's scp sends
    (cwd / ".idlegrid").mkdir()
    (cwd / ".idlegrid" / "demo").symlink_to(demo.state_dir)  # the README's paths are relative to a checkout
    banner = banner_lines(demo.output)
    r = Reader(demo, banner["export"], ssh_dir, cwd)
    r.session.text[DEFAULT_API] = f"http://127.0.0.1:{demo.api_port}"
    store = re.search(r"the demo's S3 at (http://\S+),", demo.output)
    assert store, f"the banner names no object store:\n{demo.output}"
    r.session.text[DEFAULT_STORE] = store.group(1)
    return r


def readme_steps() -> list[Step]:
    return [step for block in sessions(README.read_text()) for step in block]


def test_every_readme_session_command_runs_against_the_demo_and_does_what_the_readme_says(tmp_path: Path) -> None:
    # The README's sessions run on process hosts (image none): no Podman needed, so this runs beside other tests.
    with demo_reader(tmp_path, "--no-container-host") as reader:
        readme_sessions(reader)


def readme_sessions(reader: Reader) -> None:
    steps = readme_steps()
    assert len(steps) >= 25, [s.command for s in steps]
    for step in steps:
        operator = "operator" in step.heading.lower()
        retry = BACKGROUND_SETTLE_S if reader.background else 0.0
        out = reader.type(step, operator=operator, retry_s=retry)
        check_what_the_readme_says(reader, step, out)
    # Every cent: the rental cancelled in the market's session was charged for the seconds it ran.
    wait_for(lambda: " charge " in reader.type("idlegrid ledger"), 60, "the cancelled rental's charge in the ledger")
    reader.stop_background()  # the forwards still run (checked here); a host is lost next, perhaps theirs
    checkpointed_job_resumes_after_its_host_is_killed(reader)


def check_what_the_readme_says(reader: Reader, step: Step, out: str) -> None:
    """The outcomes the README's text promises for the commands whose output is not a sample of a moving grid."""
    command = step.command
    if "exit 4" in command:
        assert "exit=4" in out and re.search(r"^uid=\d+", out, re.M), out
    elif command.startswith("curl "):
        assert out.splitlines()[0] == "<!DOCTYPE HTML>", out
    elif "uname -s" in command:
        assert re.fullmatch(r"Linux as uid \d+\n", out), out
    elif "wc -l /tmp/README.md" in command:
        assert out.split()[0] == str(len(README.read_text().splitlines())), out
    elif " secret create " in command:
        assert out.startswith("secret s3 stored"), out
    elif command.startswith("idlegrid workload submit") or command.startswith("idlegrid rent"):
        assert re.search(r"\bwl-[0-9a-f]{16}\b", out), out
        learned = [real for sample, real in reader.session.ids.items() if sample in "\n".join(step.sample)]
        assert learned, f"no id of the README's sample was found in what it printed:\n{out}"
    elif command.startswith("idlegrid endpoint run"):  # the demo's endpoint: a worker started for it from zero
        assert "status:     COMPLETED" in out and '"prompt": "hello from the readme"' in out, out
    elif command.startswith("idlegrid ledger"):
        assert "the demo's welcome credit" in out, out


def checkpointed_job_resumes_after_its_host_is_killed(reader: Reader) -> None:
    """The README's checkpointed job checkpoints into the demo's store; its host SIGKILLed, it resumes elsewhere."""
    [workload_id] = [real for sample, real in reader.session.ids.items() if sample == "wl-5b0e7a3c2d1f4e6a"]
    renter = reader.run.renter()
    first = wait_for(lambda: (w := renter.workload(workload_id))["storage"]["checkpoint_at"] and w, 40, "a checkpoint")
    [placed] = first["assignments"]
    kill_agent(reader.run, placed["agent_id"])
    seen: list[dict[str, Any]] = []

    def moved_on() -> dict[str, Any] | None:
        seen[:] = [renter.workload(workload_id)]
        return seen[0] if seen[0]["state"] == "running" and seen[0]["attempts"] >= 2 else None

    try:
        moved = wait_for(moved_on, 90, "the checkpointed job to run again on another host")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None
    assert moved["assignments"][0]["agent_id"] != placed["agent_id"], moved
    resumed = wait_for(lambda: renter.workload(workload_id)["storage"]["restored_from"], 30, "its restore")
    assert resumed, moved


def kill_agent(run: DemoRun, agent_id: str) -> None:
    for identity in (run.state_dir / "agents").glob("*/identity.json"):
        if agent_id in identity.read_text():
            name = identity.parent.name
            [pid] = [p for p in agent_pids(run, name)]
            os.kill(pid, signal.SIGKILL)
            return
    raise AssertionError(f"no agent of the demo is {agent_id}")


def agent_pids(run: DemoRun, name: str) -> list[int]:
    wanted = f"--state-dir {run.state_dir / 'agents' / name} "
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if wanted in cmdline and " agent " in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.podman
def test_every_command_line_of_the_banner_runs_as_pasted(tmp_path: Path) -> None:
    """The whole demo, its container host included (Podman: this runs in the suite's Podman part)."""
    with demo_reader(tmp_path) as reader:
        banner_commands(reader)


def banner_commands(reader: Reader) -> None:
    lines = banner_lines(reader.run.output)
    renter = reader.run.renter()
    ran: set[str] = set()

    def paste(label: str, *, lasting: bool = False) -> str:
        ran.add(label)
        return reader.type(lines[label], lasting=lasting)

    container_host = re.search(r"container host:  \S+ \((agt-[0-9a-f]+)\)", reader.run.output)
    assert container_host, f"the demo has no container host:\n{reader.run.output}"
    offers = paste("search")
    # The banner's rent line runs a process (image none): on a process host's offer, as the banner says.
    offer = next(row.split()[0] for row in offers.splitlines()[1:] if row.split()[0] != container_host.group(1))
    reader.session.text["OFFER"] = offer
    rented = paste("rent")
    assert f"rented {offer}" in rented, rented
    paste("balance")
    paste("ledger")
    submitted = paste("submit")
    workload_id = submitted.split()[1]
    reader.session.text[" ID"] = f" {workload_id}"
    wait_for(lambda: renter.workload(workload_id)["state"] == "running", RUNNING_TIMEOUT_S, f"{workload_id} to run")
    assert workload_id in paste("list")
    assert f"id:          {workload_id}" in paste("show")
    paste("why it waits")
    paste("a shell in it")  # its stdin at end of file: the shell ends at once, with status 0
    follow = reader.type(f"timeout 3 {reader.session.typed(lines['its output'])} || [ $? = 124 ]")
    ran.add("its output")
    assert "Traceback" not in follow
    assert paste("reach a port", lasting=True).startswith("Forwarding 127.0.0.1:8888 -> ")
    reader.stop_background()
    assert "cancelled" in paste("cancel")
    if "gang" in lines:  # where the demo runs its lighthouse (root, nebula: CI does)
        pair = paste("gang").split()[1]
        reader.session.text[" ID"] = f" {pair}"
        heard = wait_for(lambda: "hello from rank 0 at " in (said := paste("rank 1 says")) and said, 60, "rank 1 to reach rank 0")
        assert heard.startswith("rank 1 of 2, rank 0 at "), heard
        reader.type(f"idlegrid workload cancel {pair}")
    answered = paste("endpoint")  # the renter's endpoint: a worker starts for the request (from zero), then echoes it
    assert "status:     COMPLETED" in answered and '"prompt": "hello from the demo"' in answered, answered
    templated = paste("a template")  # the demo's own template on its container host: its link, once it answers
    assert re.search(r"^link \(port 8080.*: http", templated, re.M), templated
    listed = paste("templates")
    assert "hello-web" in listed and "jupyter" in listed, listed
    paste("storage")
    checkpointed = paste("checkpointed")
    job = checkpointed.split()[1]
    wait_for(lambda: renter.workload(job)["storage"]["checkpoint_at"], 40, "the banner's checkpointed job to checkpoint")
    missing = set(lines) - ran - {"export"}
    assert not missing, f"banner lines this test does not run yet: {sorted(missing)}"
