"""A renter's CUDA job on this machine's real GPUs, through a whole local grid: what scripts/gpu-smoke runs.

A Master, a relay and an agent (each its own process, on the embedded store) in a temporary directory; the agent
reads the real GPUs through NVML and runs containers with the process runtime, sandboxed when this runs as root.
A renter account with a credit submits a CUDA job (a bf16 matrix product with PyTorch when this Python has it,
else a CUDA driver call through libcuda); the script watches the GPU's telemetry while it runs, reads the job's
output back after it ended, and the charge from the ledger. Where a Docker engine with the NVIDIA toolkit exists,
the same job would run through the docker runtime too; it says when there is none. Every check prints PASS or FAIL
with what was seen; the exit status is 0 only when all passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from management.client.api import ApiClient, ApiError  # noqa: E402
from management.devgrid.localgrid import LocalGrid  # noqa: E402

PROVIDER = "smoke-provider"
RENTER = "smoke-renter"
PRICE = {"on_demand": "2.00", "min_bid": "0.50", "reserved_discount": 0.25}  # per GPU-hour
CREDIT = "100.00"
MASTER_SETTINGS = {
    "IDLEGRID_MASTER_OFFER_SANDBOXED_HOSTS": "true",
    "IDLEGRID_MASTER_TELEMETRY_S": "1",
    "IDLEGRID_MASTER_METERING_PERIOD_S": "5",
    "IDLEGRID_MASTER_SCHEDULER_PERIOD_S": "1",
    "IDLEGRID_MASTER_VERIFY_SIMULATED": "true",  # a dry run (--simulate) checks the verification path too
}

# The renter's job: the GPU's name, then a bf16 matrix product for about SECONDS seconds, its throughput, and a
# line the script looks for. Without PyTorch: cuInit, cuDeviceGetCount and cuDeviceGetName through libcuda.
JOB = r"""
import os, sys, time
seconds = float(sys.argv[1])
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    name = torch.cuda.get_device_name(0)
    print("torch", torch.__version__, "sees", torch.cuda.device_count(), "GPU(s):", name, flush=True)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start, count = time.time(), 0
    while time.time() - start < seconds:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        count += 20
    took = time.time() - start
    print(f"bf16 {n}^3 matmul x{count}: {2 * n**3 * count / took / 1e12:.0f} TFLOP/s over {took:.1f} s", flush=True)
else:
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit failed"
    count = ctypes.c_int()
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    name = ctypes.create_string_buffer(100)
    assert cuda.cuDeviceGetName(name, 100, device) == 0
    print("libcuda sees", count.value, "GPU(s):", name.value.decode(), flush=True)
    time.sleep(seconds)
print("SMOKE-JOB-DONE", flush=True)
"""


# A renter's training job that checkpoints (storage mode, --storage): a small model trained on the GPU, its state saved
# with torch.save to IDLEGRID_CHECKPOINT_DIR after every step. The first start crashes at CRASH_AT (exit 1, after
# waiting out a checkpoint period, as a real crash loses what the last upload did not carry); its restart policy
# starts it again, the platform restores the checkpoint, and it goes on from there to STEPS and writes its result to
# its output directory. Without PyTorch (or in a dry run) the same with a counter in a file.
CKPT_JOB = r"""
import os, sys, time, json
steps, crash_at, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ck, out = os.environ["IDLEGRID_CHECKPOINT_DIR"], os.environ["IDLEGRID_OUTPUT_DIR"]
restored = os.environ.get("IDLEGRID_RESTORED") == "1"
path = os.path.join(ck, "state.pt")
try:
    import torch
except ImportError:
    torch = None
if torch is not None and torch.cuda.is_available():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    if os.path.exists(path):
        state = torch.load(path, map_location="cuda")
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); step = state["step"]
    def save(step):
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
    def train():
        x = torch.randn(4096, 1024, device="cuda"); y = x[:, :1].clone()
        loss = torch.nn.functional.mse_loss(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        return loss.item()
    device = torch.cuda.get_device_name(0)
else:
    step = int(open(path).read()) if os.path.exists(path) else 0
    def save(step):
        open(path + ".tmp", "w").write(str(step)); os.replace(path + ".tmp", path)
    def train():
        time.sleep(0.05); return 0.0
    device = "no CUDA"
taken = os.environ.get("IDLEGRID_CHECKPOINT_TIME", "-")
print(f"CKPT-START step={step} restored={int(restored)} checkpoint_time={taken} on {device}", flush=True)
loss = None
while step < steps:
    for _ in range(50):
        loss = train()
    step += 1
    save(step)
    time.sleep(0.25)
    if step == crash_at and not restored:
        time.sleep(period * 2.5)  # a periodic upload carries this step
        print(f"CKPT-CRASH at step {step}", flush=True)
        sys.exit(1)
json.dump({"steps": step, "loss": loss, "device": device}, open(os.path.join(out, "result.json"), "w"))
print(f"CKPT-DONE step={step} loss={loss}", flush=True)
"""
CKPT_STEPS, CKPT_CRASH_AT, CKPT_PERIOD_S = 16, 8, 2.0
# The dry run's job (no Python needed in the sandbox): the same counter, crash and resume, in sh.
CKPT_DRY_JOB = (
    'ck="$IDLEGRID_CHECKPOINT_DIR"; out="$IDLEGRID_OUTPUT_DIR"; r="${IDLEGRID_RESTORED:-0}"; step=0; '
    '[ -f "$ck/state" ] && step=$(cat "$ck/state"); echo "CKPT-START step=$step restored=$r"; '
    f"while [ $step -lt {CKPT_STEPS} ]; do step=$((step+1)); "
    'echo $step > "$ck/state.tmp"; mv "$ck/state.tmp" "$ck/state"; sleep 0.25; '
    f'if [ $step -eq {CKPT_CRASH_AT} ] && [ "$r" != 1 ]; then sleep {CKPT_PERIOD_S * 2.5}; '
    'echo "CKPT-CRASH at step $step"; exit 1; fi; '
    f'done; echo \'{{"steps": {CKPT_STEPS}}}\' > "$out/result.json"; echo "CKPT-DONE step=$step"'
)


class Report:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    def check(self, name: str, ok: bool, seen: str) -> bool:
        self.results.append((name, ok, seen))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {seen}", flush=True)
        return ok

    def skip(self, name: str, why: str) -> None:
        print(f"[SKIP] {name}: {why}", flush=True)

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.results)


def nvml_gpus() -> list[tuple[str, str]]:
    """(uuid, name) of each GPU NVML sees; a clear error when it cannot."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SystemExit(f"gpu-smoke: NVML cannot start ({exc}): this needs an NVIDIA GPU and its driver") from None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append((_text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetName(handle))))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def wait(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def cli(grid: LocalGrid, key: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IDLEGRID_API": grid.api_url, "IDLEGRID_API_KEY": key}
    return subprocess.run(
        [sys.executable, "-m", "management.cli", *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO
    )


def run_job(
    grid: LocalGrid,
    renter: ApiClient,
    key: str,
    agent_id: str,
    gpu: str,
    seconds: float,
    report: Report,
    runtime: str,
    *,
    dry_run: bool,
) -> None:
    credit_micros = micros(renter.balance(RENTER)["available"])
    spec = {
        "name": f"cuda-smoke-{runtime}",
        "image": "none",
        # A dry run needs no Python in the sandbox (this one may lie where a container's uid cannot reach).
        "command": ["sh", "-c", f"echo dry run; sleep {seconds}; echo SMOKE-JOB-DONE"]
        if dry_run
        else [sys.executable, "-c", JOB, str(seconds)],
        "replica": {"gpus": 1},
        "constraints": {"allow_process_runtime": True},
    }
    submitted = renter.submit_workload(spec)
    workload_id = submitted["id"]
    print(f"submitted {workload_id} ({runtime} runtime): {' '.join(spec['command'][:2])} <job> {seconds:.0f}", flush=True)
    running = wait(
        lambda: (w := renter.workload(workload_id))["state"] in ("running", "succeeded", "failed") and w, 120, "the job to start"
    )
    report.check(f"{runtime}: the job starts", running["state"] != "failed", f"state {running['state']}")

    peak = 0.0
    samples = []
    while (w := renter.workload(workload_id))["state"] in ("scheduled", "starting", "running"):
        # The operator's view (a renter sees offers, not GPUs): the GPU's latest sample.
        seen = next((g for g in grid.client.agent(agent_id)["gpus"] if g["uuid"] == gpu), {})
        telemetry = seen.get("telemetry") or {}
        utilization = float(telemetry.get("utilization_pct") or 0.0)
        samples.append((utilization, telemetry.get("memory_used_mib"), telemetry.get("power_w"), telemetry.get("temperature_c")))
        peak = max(peak, utilization)
        if len(samples) == max(3, int(seconds / 2)) and w["state"] == "running":
            live = cli(grid, key, "workload", "logs", workload_id)
            print(f"--- idlegrid workload logs {workload_id} (while it runs) ---\n{(live.stdout + live.stderr).strip()}\n---")
        time.sleep(1.0)
        if len(samples) > seconds + 180:
            break
    ended = renter.workload(workload_id)
    print("telemetry while it ran (util %, memory MiB, power W, temp C):", samples[-8:], flush=True)
    report.check(f"{runtime}: the job succeeds", ended["state"] == "succeeded", f"state {ended['state']} {ended['state_reason']}")
    if dry_run:
        report.skip(f"{runtime}: the GPU's telemetry shows it busy", "a dry run: the simulated GPU is not busy")
    else:
        report.check(f"{runtime}: the GPU's telemetry shows it busy", peak >= 50.0, f"peak utilization {peak:.0f} %")

    time.sleep(2.0)  # the container is deleted by now
    logs = cli(grid, key, "workload", "logs", workload_id)
    output = logs.stdout + logs.stderr
    print(f"--- idlegrid workload logs {workload_id} (after it ended) ---\n{output.strip()}\n---", flush=True)
    report.check(f"{runtime}: its output is read back after it ended", "SMOKE-JOB-DONE" in output, f"exit {logs.returncode}")

    def charged() -> int:
        spent = credit_micros - micros(renter.balance(RENTER)["available"])
        return spent if spent > 0 else 0

    try:
        spent = wait(charged, 30, "a charge in the ledger")
    except TimeoutError:
        spent = 0
    report.check(f"{runtime}: the renter is charged", spent > 0, f"{spent / 1e6:.6f} of {CREDIT} spent")
    print("balance:", json.dumps(renter.balance(RENTER)), flush=True)


def run_checkpointed_job(renter: ApiClient, key: str, grid: LocalGrid, report: Report, *, dry_run: bool) -> None:
    """The storage mode: a real S3-compatible server (moto) on 127.0.0.1, the renter's keys in its secret store, and
    CKPT_JOB with a checkpoint and an output there; checks that it crashed once, resumed from its checkpoint (not from
    step 0) and succeeded, that its result is in the bucket, and what the workload's page says of its checkpoint."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        report.skip("storage: a checkpointed job resumes", f"moto and boto3 are not installed here ({exc})")
        return
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="smoke", aws_secret_access_key="smoke"
        )
        s3.create_bucket(Bucket="gpu-smoke")
        renter.create_secret("smoke-s3", "smoke:smoke")
        command = (
            ["sh", "-c", CKPT_DRY_JOB]
            if dry_run
            else [sys.executable, "-c", CKPT_JOB, str(CKPT_STEPS), str(CKPT_CRASH_AT), str(CKPT_PERIOD_S)]
        )
        spec = {
            "name": "checkpointed-smoke",
            "image": "none",
            "command": command,
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
            "restart_policy": "on_failure",
            "max_restarts": 2,
            "storage": {"credentials": "smoke-s3", "endpoint": endpoint},
            "checkpoint": {"uri": "s3://gpu-smoke/run-1/checkpoint/", "period_s": CKPT_PERIOD_S},
            "outputs": [{"uri": "s3://gpu-smoke/run-1/out/", "path": "/out"}],
        }
        workload_id = renter.submit_workload(spec)["id"]
        print(f"submitted {workload_id}: a checkpointed training job (crash at step {CKPT_CRASH_AT}, then resume)")
        ended = wait(
            lambda: (w := renter.workload(workload_id))["state"] in ("succeeded", "failed", "cancelled") and w,
            300,
            "the checkpointed job to end",
            interval_s=1.0,
        )
        time.sleep(2.0)
        logs = cli(grid, key, "workload", "logs", workload_id)
        output = logs.stdout + logs.stderr
        print(f"--- idlegrid workload logs {workload_id} ---\n{output.strip()}\n---", flush=True)
        starts = [line for line in output.splitlines() if "CKPT-START" in line]
        resumed = [line for line in starts if "restored=1" in line]
        report.check("storage: the checkpointed job succeeds", ended["state"] == "succeeded", f"state {ended['state']}")
        first_step = int(resumed[0].split("step=")[1].split()[0]) if resumed else -1
        report.check(
            "storage: it resumed from its checkpoint after the crash, not from step 0",
            bool(resumed) and first_step >= CKPT_CRASH_AT - 2,
            f"starts: {starts}",
        )
        listed = s3.list_objects_v2(Bucket="gpu-smoke", Prefix="run-1/").get("Contents", [])
        names = sorted(o["Key"] for o in listed)
        result = (
            s3.get_object(Bucket="gpu-smoke", Key="run-1/out/result.json")["Body"].read().decode()
            if ("run-1/out/result.json" in names)
            else ""
        )
        report.check("storage: its result is in the bucket", f'"steps": {CKPT_STEPS}' in result, result or f"objects: {names}")
        storage = renter.workload(workload_id).get("storage")
        print("the workload's storage summary:", json.dumps(storage)[:1500], flush=True)
        report.check("storage: the workload says when its last checkpoint was taken", bool(storage), "see above")
    finally:
        server.stop()


def micros(amount: str) -> int:
    units, _, fraction = amount.partition(".")
    sign = -1 if units.startswith("-") else 1
    return int(units) * 1_000_000 + sign * int((fraction + "000000")[:6])


def slirp4netns_works() -> bool:
    """Whether the process runtime can give containers a network of their own here (else they share the host's)."""
    if shutil.which("slirp4netns") is None:
        print("slirp4netns is not installed: containers share the host's network (process_network = host)", flush=True)
        return False
    if subprocess.run(["slirp4netns", "--version"], capture_output=True).returncode != 0:
        print("slirp4netns does not run here: containers share the host's network (process_network = host)", flush=True)
        return False
    return True


def docker_with_nvidia() -> str | None:
    """Why the docker runtime's variant cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"docker info failed: {info.stderr.strip()[:200]}"
    if "nvidia" not in info.stdout:
        return "Docker has no nvidia runtime (the NVIDIA Container Toolkit is not installed)"
    return None


def wait_verified(grid: LocalGrid, agent_id: str) -> list[dict[str, Any]]:
    """Each GPU's verification once the Master has one for every GPU (it challenges them when the host joins)."""

    def verdicts() -> list[dict[str, Any]] | None:
        gpus = grid.client.agent(agent_id)["gpus"]
        found = [g["verification"] for g in gpus if g["verification"]["status"]]
        return found if len(found) == len(gpus) else None

    return wait(verdicts, 120, "the Master's verification of the agent's GPUs")


def benchmark_directly(gpus: list[tuple[str, str]], report: Report) -> bool:
    """The agent's GPU benchmark (agent/benchmark/cuda.py) on each GPU, answering the Master's own challenge in this
    process: its figures, how long it took, and the verdict. What a GPU session calibrates the catalog from
    (common/catalog.py CALIBRATED) and writes into bench/README.md."""
    import asyncio

    from agent.benchmark.cuda import open_benchmark
    from agent.benchmark.responder import VerificationResponder
    from common.catalog import CATALOG, expected_figures
    from master.verification import ChallengeBook, ChallengeSettings, Outcome

    benchmark, why = open_benchmark()
    if benchmark is None:
        report.check("the GPU benchmark runs", False, why)
        return False

    async def nothing_held() -> set[str]:
        return set()

    async def one(uuid: str, name: str, forms: frozenset[str]) -> Outcome | None:
        model = next((m for m in CATALOG.values() if name in m.nvml_names), None)
        if model is None:
            report.skip(f"benchmark of {name}", "the catalog does not list this model")
            return None
        book = ChallengeBook(ChallengeSettings(), min_throughput_fraction=0.6)
        responder = VerificationResponder(benchmark, "", nothing_held)
        started = time.time()
        challenge = book.start("smoke", uuid, model, started, forms=forms)
        commit = await responder.on_challenge(challenge)
        step = book.on_commit("smoke", commit, time.time())
        if isinstance(step, Outcome):
            return step
        opened = responder.on_reveal(step) if step is not None else None
        return book.on_open("smoke", opened, time.time()) if opened is not None else None

    # The sum form (what older Masters ask), then the rounds form where the self-test passed: its TFLOP/s is what
    # common/catalog.py CALIBRATED's challenge_tflops is calibrated from (docs/verification.md).
    print(f"rounds form offered: {bool(benchmark.forms)}", flush=True)
    for uuid, name in gpus:
        for forms in (frozenset(), frozenset(benchmark.forms)) if benchmark.forms else (frozenset(),):
            form = "rounds" if forms else "sum"
            outcome = asyncio.run(one(uuid, name, forms))
            if outcome is None:
                break
            figures = json.dumps(msgspec.to_builtins(outcome.figures)) if outcome.figures is not None else "none"
            print(f"benchmark {name} ({uuid}), {form} form: figures {figures}", flush=True)
            expected = expected_figures(CATALOG[outcome.model])
            print(
                f"  challenge: {outcome.status} {outcome.code} in {outcome.commit_s} s, {outcome.challenge_tflops} TFLOP/s "
                f"(catalog: {expected.challenge_tflops if forms else expected.tensor_tflops}); {outcome.reason}",
                flush=True,
            )
            check = f"the benchmark verifies {name} ({form} form)"
            report.check(check, outcome.status == "verified", f"{outcome.code} {outcome.reason}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the job keeps the GPU busy (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the grid's directory (logs, store) afterwards")
    parser.add_argument(
        "--simulate", metavar="MODEL", help="a dry run without a GPU: a simulated one (e.g. h100), the job makes no CUDA call"
    )
    parser.add_argument(
        "--storage",
        action="store_true",
        help="also a checkpointed training job that crashes once and resumes from its checkpoint in a local S3 (moto)",
    )
    parser.add_argument(
        "--benchmark-only", action="store_true", help="only the agent's GPU benchmark and its challenge, without a grid"
    )
    args = parser.parse_args()

    gpus = [] if args.simulate else nvml_gpus()
    if not gpus and not args.simulate:
        raise SystemExit("gpu-smoke: NVML sees no GPU")
    print("NVML sees:", ", ".join(f"{name} ({uuid})" for uuid, name in gpus), flush=True)
    report = Report()
    benchmarks = bool(args.simulate) or (bool(gpus) and benchmark_directly(gpus, report))
    if args.benchmark_only:
        print("gpu-smoke:", "all checks passed" if report.passed else "FAILED", flush=True)
        return 0 if report.passed and report.results else 1
    root = Path(tempfile.mkdtemp(prefix="idlegrid-gpu-smoke-", dir="/run" if os.geteuid() == 0 else None))
    os.chmod(root, 0o711)  # a sandboxed container (a uid of its own) passes through to its working directory
    grid = LocalGrid(root)
    network = "private" if slirp4netns_works() else "host"
    try:
        grid.start_master(env=MASTER_SETTINGS)
        relay = grid.start_relay("relay-1", "local")
        grid.ensure_provider(PROVIDER)
        enrolled = grid.enroll("gpu-host", relay, grid.join_token(PROVIDER))
        if enrolled.returncode != 0:
            raise SystemExit(f"gpu-smoke: the agent could not enroll: {enrolled.stderr.strip()[-400:]}")
        agent_env = {"IDLEGRID_AGENT_PROCESS_NETWORK": network}
        args_agent = ["agent", "--state-dir", str(grid.agent_dir("gpu-host")), "--runtime", "process", "--no-bandwidth"]
        args_agent += ["--access", relay.agent_url, *(["--simulate", f"{args.simulate}:1"] if args.simulate else [])]
        daemon = grid.spawn("gpu-host", "agent", args_agent, env=agent_env)
        agent_id = grid.agent_id("gpu-host")
        try:
            grid.wait_agents_ready([agent_id], timeout_s=60)
        except Exception:
            print(daemon.tail(60), flush=True)
            raise
        agent = grid.client.agent(agent_id)
        print(
            f"agent {agent_id}: runtime {agent['runtime']}, isolation {agent['isolation']}, network {network}, "
            f"state {agent['state']}",
            flush=True,
        )
        listed = [(g["uuid"], g["name"], g["tier"], g["state"], g["offered"]) for g in agent["gpus"]]
        print("its GPUs in the Master (uuid, name, tier, state, offered):", listed, flush=True)
        if args.simulate:
            gpus = [(uuid, name) for uuid, name, *_ in listed]
        tested = agent.get("gpu_selftest") or []
        print("the GPU self-test in the sandbox:", json.dumps(tested), flush=True)
        report.check(
            "each GPU reaches a sandboxed container (self-test)",
            len(tested) == len(listed) and all(t["reachable"] for t in tested),
            "; ".join(f"{t['uuid'][:12]}: {t['detail']}" for t in tested) or "not tested",
        )
        report.check("the agent reports every NVML GPU", {u for u, *_ in listed} == {u for u, _ in gpus}, f"{len(listed)} GPU(s)")
        if benchmarks:
            verdicts = wait_verified(grid, agent_id)
            print("the Master's verification:", json.dumps(verdicts), flush=True)
            report.check(
                "the Master verifies each GPU by its challenge",
                all(v["status"] == "verified" for v in verdicts),
                "; ".join(f"{v['label']}: {v['reason']}" for v in verdicts),
            )
        else:
            report.skip("the Master's verification", "the agent has no GPU benchmark here (the gpu extra is missing)")

        grid.client.set_default_price(PRICE, provider=PROVIDER)
        grid.ensure_account(RENTER, "renter")
        key = grid.client.create_api_key(RENTER, "smoke")["key"]
        grid.client.credit(RENTER, CREDIT, memo="gpu-smoke", key="gpu-smoke")
        renter = ApiClient(grid.api_url, key)
        run_job(grid, renter, key, agent_id, gpus[0][0], args.seconds, report, "process", dry_run=bool(args.simulate))
        if args.storage:
            run_checkpointed_job(renter, key, grid, report, dry_run=bool(args.simulate))

        why = docker_with_nvidia()
        if why is None:
            report.skip(
                "docker runtime", "Docker with the NVIDIA toolkit is here, but this script runs it only with --docker-image"
            )
        else:
            report.skip("docker runtime", why)
    except (ApiError, TimeoutError, OSError) as exc:
        report.check("the grid runs the job", False, f"{type(exc).__name__}: {exc}")
        for name in ("master", "relay-1", "gpu-host"):
            log = grid.logs / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log (last lines) ---\n" + "\n".join(log.read_text().splitlines()[-25:]), flush=True)
    finally:
        grid.stop()
        if args.keep:
            print(f"the grid's files: {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("gpu-smoke:", "all checks passed" if report.passed else "FAILED", flush=True)
    return 0 if report.passed and report.results else 1


if __name__ == "__main__":
    sys.exit(main())
