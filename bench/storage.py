"""``python -m bench storage``: how fast a host moves a checkpoint, and whether an upload slows the host's commands.

Part one, throughput: the agent's data plane (agent/storage/) against an S3-compatible server in a process of its own
(moto's server on 127.0.0.1: real HTTP and SigV4, multipart): a ``gigabytes`` checkpoint file uploaded, then restored
by a second data plane (another host's disk), each timed; at the host's default bandwidth bound and unbounded.

Part two, the command round trip: a real local grid (a Master, a relay, sandboxed process-runtime hosts). One host runs
a workload with a checkpoint; commands go to that same host (a delete of a container that is not there, which the agent
answers without starting anything) during an idle phase, then while the host uploads a ``gigabytes`` checkpoint the
workload wrote. The figure to compare is within one run: the upload phase's p99 against the idle phase's (the issue:
within 2x, as for tunnels).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from agent.storage.plane import DataPlane, StorageSettings
from bench.tunnel import CommandLoad, Phase, _phase_buckets, _ratio, heartbeat_histogram, start_sandboxed_hosts
from common.containers import ContainerSpec
from common.egress import EgressRule
from common.storage import CheckpointSpec, ContainerStorage, StorageCredentials
from management.client.api import ApiClient, AsyncApiClient
from management.devgrid.localgrid import LocalGrid, free_port, wait_until

RENTER = "bench-renter"
MIB = 1024 * 1024
BLOCK = 64 * MIB  # the checkpoint file is written as this block of random bytes again and again
# The bench's own polling must not meet the API's per-key limit (its 429s would be timed as latency).
MASTER_TOML = "offer_sandboxed_hosts = true\nscheduler_period_s = 0.5\napi_key_rate_per_s = 2000.0\napi_key_burst = 4000\n"


@dataclass(frozen=True)
class StorageBenchOptions:
    gigabytes: float = 1.0
    hosts: int = 2
    cmd_rate: float = 10.0
    idle_s: float = 10.0
    heartbeat_s: float = 0.25
    part_mib: int = 16
    skip_grid: bool = False  # part one only


class S3Process:
    """moto's S3 server as a process of its own (the bench's threads then do not share its interpreter)."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.allowed = f"127.0.0.1:{self.port}"  # its egress_allow entry: the rule refuses loopback unless allowed
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
        self._log = open(root / "moto.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        wait_until(self._answers, 30, "the S3 server to answer")
        iam = boto3.client(
            "iam", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        iam.create_user(UserName="bench")
        iam.put_user_policy(
            UserName="bench",
            PolicyName="all",
            PolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}',
        )
        keys = iam.create_access_key(UserName="bench")["AccessKey"]
        self.key_id, self.secret = keys["AccessKeyId"], keys["SecretAccessKey"]

    def _answers(self) -> bool:
        import urllib.request

        try:
            urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
            return True
        except OSError:
            return False

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            config=Config(s3={"addressing_style": "path"}),
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._log.close()


def _write_blob(path: Path, size: int) -> None:
    block = os.urandom(BLOCK)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(BLOCK, left)])
            left -= BLOCK


async def _throughput(s3: S3Process, root: Path, size: int, bytes_per_s: int, part_mib: int, bulk: bool) -> dict[str, Any]:
    bucket = f"bench-{os.urandom(4).hex()}"
    s3.client().create_bucket(Bucket=bucket)
    storage = ContainerStorage(
        credentials=StorageCredentials(access_key_id=s3.key_id, secret_access_key=s3.secret),
        endpoint=s3.endpoint,
        checkpoint=CheckpointSpec(uri=f"s3://{bucket}/ck/", period_s=86400),
    )
    one = DataPlane(settings(root / "one", bytes_per_s, part_mib, bulk, s3), lambda c, a: None)
    spec = ContainerSpec(name="wl-00bench-r0-a1", image="none", command=["true"], storage=storage)
    ready, _ = await one.prepare(spec, host_paths=True)
    _write_blob(Path(ready.env["IDLEGRID_CHECKPOINT_DIR"]) / "model.bin", size)
    started = time.perf_counter()
    await one.sync(spec.name)
    upload_s = time.perf_counter() - started
    await one.finish(spec.name)
    two = DataPlane(settings(root / "two", bytes_per_s, part_mib, bulk, s3), lambda c, a: None)
    started = time.perf_counter()
    restored, _ = await two.prepare(msgspec_replace(spec, name="wl-00bench-r0-a2"), host_paths=True)
    restore_s = time.perf_counter() - started
    got = (Path(restored.env["IDLEGRID_CHECKPOINT_DIR"]) / "model.bin").stat().st_size
    await two.finish("wl-00bench-r0-a2")
    await one.close()
    await two.close()
    if got != size:
        raise RuntimeError(f"restored {got} bytes, not {size}")
    return {
        "bound_mbit_s": round(bytes_per_s * 8 / 1e6) if bytes_per_s else None,
        "bulk_processes": bulk,
        "upload_s": round(upload_s, 2),
        "upload_mib_s": round(size / upload_s / MIB, 1),
        "restore_s": round(restore_s, 2),
        "restore_mib_s": round(size / restore_s / MIB, 1),
    }


def settings(root: Path, bytes_per_s: int, part_mib: int, bulk: bool, s3: S3Process) -> StorageSettings:
    # moto listens on 127.0.0.1, which the egress rule refuses unless the provider allows it by name (common/egress.py)
    egress = EgressRule.allowing([s3.allowed])
    return StorageSettings(root=str(root), bytes_per_s=bytes_per_s, part_bytes=part_mib * MIB, bulk_processes=bulk, egress=egress)


def msgspec_replace(spec: ContainerSpec, **changes: Any) -> ContainerSpec:
    import msgspec

    return msgspec.structs.replace(spec, **changes)


async def _measure(grid: LocalGrid, load: CommandLoad, rate: float, until: Any) -> Phase:
    before = heartbeat_histogram(await asyncio.to_thread(_metrics, grid))
    stop = asyncio.Event()
    started = time.perf_counter()
    loading = asyncio.create_task(load.run(rate, stop))
    await until
    stop.set()
    timings = await loading
    seconds = time.perf_counter() - started
    after = heartbeat_histogram(await asyncio.to_thread(_metrics, grid))
    return Phase(timings, _phase_buckets(before, after), seconds)


def _metrics(grid: LocalGrid) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{grid.api_url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


async def _round_trips(grid: LocalGrid, s3: S3Process, options: StorageBenchOptions, drop: Path) -> dict[str, Any]:
    await start_sandboxed_hosts(grid, options.hosts, egress_allow=[s3.allowed])
    operator = grid.client
    operator.create_account(RENTER, "renter")
    renter = ApiClient(grid.api_url, operator.create_api_key(RENTER, "bench")["key"])
    renter.create_secret("s3", f"{s3.key_id}:{s3.secret}")
    bucket = f"bench-{os.urandom(4).hex()}"
    s3.client().create_bucket(Bucket=bucket)
    size = int(options.gigabytes * 1e9)
    go = drop / "go"
    script = (
        f'while [ ! -e {go} ]; do sleep 0.2; done; head -c {size} /dev/urandom > "$IDLEGRID_CHECKPOINT_DIR/blob.tmp"; '
        f'mv "$IDLEGRID_CHECKPOINT_DIR/blob.tmp" "$IDLEGRID_CHECKPOINT_DIR/blob"; touch {drop}/written; exec sleep 3600'
    )
    submitted = renter.submit_workload(
        {
            "name": "checkpointer",
            "image": "none",
            "command": ["sh", "-c", script],
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
            "storage": {"credentials": "s3", "endpoint": s3.endpoint},
            "checkpoint": {"uri": f"s3://{bucket}/ck/", "period_s": 2.0},
        }
    )
    wid = submitted["id"]
    await asyncio.to_thread(wait_until, lambda: renter.workload(wid)["state"] == "running", 60, "the workload to run")
    host = renter.workload(wid)["assignments"][0]["agent_id"]

    def uploads() -> list[dict[str, Any]]:
        storage = renter.workload(wid)["storage"] or {}
        # the upload that carried the whole file (a period may have caught it half written before)
        return [t for t in storage.get("recent", []) if t["what"] == "checkpoint_uploaded" and t["bytes"] >= size]

    async def upload_done() -> None:
        go.touch()
        while not uploads():
            await asyncio.sleep(0.5)

    async with AsyncApiClient(grid.api_url, grid.client.api_key) as api:
        load = CommandLoad(api, [host])  # the same host as the upload
        idle = await _measure(grid, load, options.cmd_rate, asyncio.sleep(options.idle_s))
        busy = await _measure(grid, load, options.cmd_rate, upload_done())
    [upload] = uploads()[:1]
    renter.cancel_workload(wid)
    idle_s, busy_s = idle.summary(), busy.summary()
    return {
        "idle": idle_s,
        "upload": busy_s,
        "upload_transfer": {
            "bytes": upload["bytes"],
            "seconds": upload["seconds"],
            "mib_s": round(upload["bytes"] / upload["seconds"] / MIB, 1),
        },
        "ratios": {
            "cmd_p99": _ratio(busy_s["cmd_p99_ms"], idle_s["cmd_p99_ms"]),
            "hb_p99": _ratio(busy_s["hb_p99_ms"], idle_s["hb_p99_ms"]),
        },
        "errors": load.errors[:20],
    }


def run_storage_bench(options: StorageBenchOptions, work_dir: str = "") -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="idlegrid-storage-bench-", dir=work_dir or None) as root_name:
        root = Path(root_name)
        s3 = S3Process(root)
        try:
            size = int(options.gigabytes * 1e9)
            result: dict[str, Any] = {"options": asdict(options), "load_before": [round(x, 2) for x in load_before]}
            runs = [(0, True), (int(1000e6 / 8), True), (0, False)]  # unbounded, the default bound; in threads
            result["throughput"] = [
                asyncio.run(_throughput(s3, root / f"t{n}", size, bound, options.part_mib, bulk))
                for n, (bound, bulk) in enumerate(runs)
            ]
            if not options.skip_grid:
                drop = Path(tempfile.mkdtemp(prefix="idlegrid-storage-bench-", dir="/run"))
                os.chmod(drop, 0o777)  # the sandboxed container (a uid of its own) reads the go file here
                grid = LocalGrid(root / "grid", heartbeat_s=options.heartbeat_s)
                try:
                    config = root / "master.toml"
                    config.write_text(MASTER_TOML + f"egress_allow = [{json.dumps(s3.allowed)}]\n")
                    grid.start_master("--config", str(config))
                    grid.start_relay("relay-1")
                    result["round_trips"] = asyncio.run(_round_trips(grid, s3, options, drop))
                finally:
                    grid.stop()
                    for leftover in drop.iterdir():
                        leftover.unlink()
                    drop.rmdir()
            result["load_after"] = [round(x, 2) for x in os.getloadavg()]
            return result
        finally:
            s3.stop()


def storage_table(result: dict[str, Any]) -> str:
    lines = [f"load before {result['load_before']}, after {result.get('load_after')}"]
    for t in result["throughput"]:
        bound = f"{t['bound_mbit_s']} Mbit/s" if t["bound_mbit_s"] else "unbounded"
        bound += "" if t["bulk_processes"] else ", in the agent's threads"
        size = result["options"]["gigabytes"]
        lines.append(
            f"checkpoint of {size:g} GB, {bound}: upload {t['upload_s']} s ({t['upload_mib_s']} MiB/s), "
            f"restore {t['restore_s']} s ({t['restore_mib_s']} MiB/s)"
        )
    rt = result.get("round_trips")
    if rt:
        lines.append(
            f"commands to the uploading host: idle p50/p99 {rt['idle']['cmd_p50_ms']}/{rt['idle']['cmd_p99_ms']} ms "
            f"({rt['idle']['commands']}), during the upload {rt['upload']['cmd_p50_ms']}/{rt['upload']['cmd_p99_ms']} ms "
            f"({rt['upload']['commands']}); p99 ratio {rt['ratios']['cmd_p99']}; upload {rt['upload_transfer']}"
        )
    return "\n".join(lines)
