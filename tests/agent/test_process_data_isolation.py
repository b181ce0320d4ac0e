"""A container's data is its own (issue 36, D2): two renters' sandboxed containers on one process-runtime host, the
agent's real data plane against a real S3-compatible server (moto). The second renter is hostile and knows the
first's container name and every host path of its data; the first writes everything with umask 000 and opens up its
own directories. The host's directories lie under a 0700 directory outside /tmp (as a clone in /root would), which
the sandbox does not cover with a fresh tmpfs: the first renter's program still finds its data at fixed paths."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath

import msgspec
import pytest

from agent.output import OutputKeeper
from agent.runtime.process import ProcessRuntime
from agent.runtime.process_sandbox import SANDBOX_OVERLAY, Bind, data_path, setup_script
from agent.storage.plane import DataPlane, StorageSettings
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.errors import RuntimeFailure
from common.storage import ENV_CHECKPOINT_DIR, CheckpointSpec, ContainerStorage, StorageCredentials, StorageMount
from tests.support.s3 import S3Server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the agent's sandbox (uids, namespaces) needs it")

SECRET = "s3cr3t-of-renter-a"

# Writes its secret everywhere it may, as openly as a program can: umask 000, its own directories made 0777.
VICTIM = textwrap.dedent(
    """
    umask 000
    chmod 777 . "$IDLEGRID_CHECKPOINT_DIR" "$IDLEGRID_OUTPUT_DIR" 2>/dev/null
    mkdir -p "$IDLEGRID_CHECKPOINT_DIR/sub"
    echo "$SECRET_TOKEN" > "$IDLEGRID_CHECKPOINT_DIR/step"
    echo "$SECRET_TOKEN" > "$IDLEGRID_CHECKPOINT_DIR/sub/state"
    echo "$SECRET_TOKEN" > "$IDLEGRID_CHECKPOINT_DIR/locked" && chmod 000 "$IDLEGRID_CHECKPOINT_DIR/locked"
    echo "$SECRET_TOKEN" > "$IDLEGRID_OUTPUT_DIR/result.txt"
    echo "$SECRET_TOKEN" > mine.txt
    echo "$SECRET_TOKEN"
    cat "$IDLEGRID_INPUT_DIR/data.txt" > input-seen
    (echo planted > "$IDLEGRID_INPUT_DIR/planted") 2>/dev/null && echo written > input-write || echo refused > input-write
    echo "$IDLEGRID_CHECKPOINT_DIR $IDLEGRID_OUTPUT_DIR $IDLEGRID_INPUT_DIR" > paths
    touch ready
    sleep 600
    """
)

# Tries every path it was told, and the fixed paths in its own view; one line "path: outcome" each.
ATTACKER = textwrap.dedent(
    """
    import os, sys
    out = []
    def fail(exc):
        raise exc
    for path in sys.argv[1:]:
        try:
            if os.path.isdir(path):
                found = []
                for top, dirs, files in os.walk(path, onerror=fail):
                    found += [open(os.path.join(top, f)).read().strip() for f in files]
                outcome = "listed " + " ".join(found or ["nothing"])
            else:
                outcome = "read " + open(path).read().strip()
        except Exception as exc:
            outcome = f"refused {type(exc).__name__}"
        out.append(f"{path}: {outcome}")
    open("seen.tmp", "w").write("\\n".join(out) + "\\n")
    os.rename("seen.tmp", "seen")
    """
)


def base_dir(mode: int) -> Iterator[Path]:
    """A directory of ``mode`` outside /tmp, /var/tmp and /dev/shm (which the sandbox covers with fresh ones)."""
    path = Path(tempfile.mkdtemp(prefix="idlegrid-host-", dir="/run"))
    os.chmod(path, mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory only root may traverse (0700): a home directory, as /root is."""
    yield from base_dir(0o700)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory every uid may traverse (0755): what keeps a container's data then is the agent's modes alone."""
    yield from base_dir(0o755)


def labels(command_id: str) -> dict[str, str]:
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1"}


async def wait_for_file(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {path}")


def renters_storage(s3: S3Server, bucket: str) -> ContainerStorage:
    return ContainerStorage(
        credentials=StorageCredentials(access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key),
        endpoint=s3.endpoint,
        inputs=[StorageMount(uri=f"s3://{bucket}/in/", path="/data")],
        outputs=[StorageMount(uri=f"s3://{bucket}/out/", path="/out")],
        checkpoint=CheckpointSpec(uri=f"s3://{bucket}/ck/", path="/checkpoint", period_s=3600),
    )


class Host:
    """One agent's process runtime, data plane and output keeper, with its state under ``base``."""

    def __init__(self, base: Path, s3: S3Server) -> None:
        self.runtime = ProcessRuntime(base / "state")
        # moto listens on 127.0.0.1: the host's provider allows it by name (common/egress.py)
        settings = StorageSettings(root=str(base / "state-data"), bulk_processes=False, egress=s3.provider_allows)
        self.plane = DataPlane(settings, lambda c, a: None)
        self.keeper = OutputKeeper(base / "state" / "output")

    async def start(self, spec: ContainerSpec, command_id: str) -> ContainerSpec:
        ready, mounts = await self.plane.prepare(spec, host_paths=self.runtime.host_paths, data_root=self.runtime.data_root)
        await self.runtime.create_mounted(ready, labels=labels(command_id), mounts=mounts)
        return ready

    async def stop(self, name: str) -> None:
        await self.runtime.delete(name, timeout_s=2)
        await self.plane.finish(name)

    async def close(self) -> None:
        for info in await self.runtime.list():
            await self.stop(info.name)
        await self.plane.close()


@pytest.fixture
async def host(home: Path, s3: S3Server) -> AsyncIterator[Host]:
    """A host whose state lies under a home directory."""
    found = Host(home / "clone", s3)
    yield found
    await found.close()


@pytest.fixture
async def open_host(open_base: Path, s3: S3Server) -> AsyncIterator[Host]:
    """A host whose state lies where any uid may look (its directories must keep its containers' data)."""
    found = Host(open_base / "srv", s3)
    yield found
    await found.close()


def new_bucket(s3: S3Server) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    s3.client().put_object(Bucket=name, Key="in/data.txt", Body=f"input of renter a: {SECRET}".encode())
    return name


async def test_a_hostile_renter_reads_nothing_of_another_renters_data_written_with_umask_000(s3, open_host):
    host = open_host
    bucket = new_bucket(s3)
    victim = await host.start(
        ContainerSpec(
            name="renter-a",
            image="none",
            command=["sh", "-c", VICTIM],
            env={"SECRET_TOKEN": SECRET},
            workload_id="wl-aaaa0001",
            storage=renters_storage(s3, bucket),
        ),
        "cmd-a",
    )
    workdir = host.runtime.workdir("renter-a")
    await wait_for_file(workdir / "ready")
    # The victim has all of its data, at fixed paths (inputs read-only).
    assert (workdir / "paths").read_text().split() == ["/idlegrid/mnt/checkpoint", "/idlegrid/mnt/out", "/idlegrid/mnt/data"]
    assert victim.env[ENV_CHECKPOINT_DIR] == "/idlegrid/mnt/checkpoint"
    assert (workdir / "input-seen").read_text() == f"input of renter a: {SECRET}"
    assert (workdir / "input-write").read_text() == "refused\n"
    kept = await host.keeper.keep(host.runtime, "renter-a")
    assert kept is not None and kept.kept > 0
    mnt = host.plane.root / "renter-a" / "mnt"
    [cache_entry] = list((host.plane.cache.root / "objects").iterdir())
    told = [
        mnt / "checkpoint" / "step",
        mnt / "checkpoint" / "sub" / "state",
        mnt / "checkpoint",
        mnt / "out" / "result.txt",
        mnt / "data" / "data.txt",
        mnt,
        host.plane.root,
        cache_entry,
        host.plane.cache.root,
        workdir / "mine.txt",
        workdir,
        host.keeper.root,
        *host.keeper.root.iterdir(),
        host.runtime._path("renter-a", ".log"),
        Path("/idlegrid/mnt/checkpoint/step"),  # the fixed paths, in the attacker's own view
        Path("/idlegrid/mnt/data/data.txt"),
    ]
    await host.start(
        ContainerSpec(name="renter-b", image="none", command=["python3", "-c", ATTACKER, *map(str, told)]),
        "cmd-b",
    )
    seen = (await wait_for_file(host.runtime.workdir("renter-b") / "seen")).splitlines()

    assert len(seen) == len(told), seen
    assert not [line for line in seen if SECRET in line], seen
    assert all(": refused" in line for line in seen), seen

    # And the victim's checkpoint and outputs still go up whole, read by the agent, whatever their modes (0000 too).
    await host.plane.sync("renter-a")
    assert s3.client().get_object(Bucket=bucket, Key="out/result.txt")["Body"].read() == f"{SECRET}\n".encode()
    manifest = json.loads(s3.client().get_object(Bucket=bucket, Key="ck/.idlegrid-checkpoint.json")["Body"].read())
    assert sorted(manifest["files"]) == ["locked", "step", "sub/state"]
    locked = s3.client().get_object(Bucket=bucket, Key=manifest["files"]["locked"]["key"])["Body"].read()
    assert locked == f"{SECRET}\n".encode()


def test_a_spec_path_is_seen_under_the_fixed_root_and_one_that_would_leave_it_is_refused():
    assert data_path("/checkpoint") == PurePosixPath("/idlegrid/mnt/checkpoint")
    assert data_path("/data/sets") == PurePosixPath("/idlegrid/mnt/data/sets")
    for leaving in ("/../usr/bin", "/data/../../etc", "relative", "/"):
        with pytest.raises(RuntimeFailure, match="not a directory path in the container"):
            data_path(leaving)


def test_the_set_up_step_binds_only_below_the_fixed_root_never_over_it_the_working_directory_or_the_host():
    overlay = Bind(Path("/state/containers/wl-r0.overlay"), SANDBOX_OVERLAY, writable=False)
    script = setup_script(private_tmp=True, tmpfs_size_mib=None, resolv_conf=None, binds=[overlay])
    assert "--bind /state/containers/wl-r0.overlay /idlegrid/overlay" in script
    assert "remount,bind,ro,nosuid,nodev /idlegrid/overlay" in script
    for inside in ("/etc", "/idlegrid", "/idlegrid/work", "/idlegrid/../usr/bin", "/usr/idlegrid"):
        with pytest.raises(RuntimeFailure, match="not a place for a container's files"):
            setup_script(
                private_tmp=True, tmpfs_size_mib=None, resolv_conf=None, binds=[Bind(Path("/x"), PurePosixPath(inside), False)]
            )


async def test_a_checkpoint_written_at_its_fixed_path_under_a_private_home_comes_back_for_the_next_run(s3, host):
    bucket = new_bucket(s3)
    count = (
        'ck="$IDLEGRID_CHECKPOINT_DIR"; n=0; [ -f "$ck/n" ] && n=$(cat "$ck/n"); n=$((n+1)); '
        'echo $n > "$ck/n.tmp" && mv "$ck/n.tmp" "$ck/n"; echo "$n ${IDLEGRID_RESTORED:-0}" > run; sleep 600'
    )

    def spec(name: str) -> ContainerSpec:
        return ContainerSpec(
            name=name, image="none", command=["sh", "-c", count], workload_id="wl-aaaa0002", storage=renters_storage(s3, bucket)
        )

    await host.start(spec("count-a1"), "cmd-1")
    assert await wait_for_file(host.runtime.workdir("count-a1") / "run") == "1 0\n"
    await host.stop("count-a1")  # the last upload, then its data leaves the host
    assert not (host.plane.root / "count-a1").exists()

    await host.start(spec("count-a2"), "cmd-2")
    assert await wait_for_file(host.runtime.workdir("count-a2") / "run") == "2 1\n"


async def test_a_container_with_many_storage_directories_gets_each_at_its_fixed_path(s3, host):
    bucket = new_bucket(s3)
    outputs = [StorageMount(uri=f"s3://{bucket}/out{n}/", path=f"/results/run{n}") for n in range(12)]
    storage = msgspec.structs.replace(renters_storage(s3, bucket), outputs=outputs)
    writes = "; ".join(f"echo {n} > /idlegrid/mnt/results/run{n}/n" for n in range(12))
    await host.start(
        ContainerSpec(
            name="many", image="none", command=["sh", "-c", f"{writes} && touch done"], workload_id="wl-aaaa0003", storage=storage
        ),
        "cmd-m",
    )
    await wait_for_file(host.runtime.workdir("many") / "done")
    await host.plane.sync("many")
    for n in range(12):
        assert s3.client().get_object(Bucket=bucket, Key=f"out{n}/n")["Body"].read() == f"{n}\n".encode()
