"""The agent's data plane against a real S3-compatible server (moto on 127.0.0.1: real HTTP, SigV4, multipart):
inputs through the per-host cache, checkpoints restored on another host, uploads of what changed, outputs at the
end, and the renter's errors as renter faults."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path

import pytest

from agent.storage.plane import DataPlane, StorageSettings
from common.containers import ContainerSpec
from common.errors import StorageNotFound, StorageTooLarge, StorageUnauthorized, is_renter_fault
from common.storage import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_TIME,
    ENV_INPUT_DIR,
    ENV_OUTPUT_DIR,
    ENV_RESTORED,
    CheckpointSpec,
    ContainerStorage,
    StorageActivity,
    StorageCredentials,
    StorageMount,
)
from tests.support.s3 import S3Server

MIB = 1024 * 1024


class Host:
    """One host's data plane, with the activities it reported."""

    def __init__(self, s3: S3Server, root: Path, **settings: int) -> None:
        """Its provider allows the test's store (moto on 127.0.0.1, a private address) by name."""
        self.reports: list[tuple[str, StorageActivity]] = []
        self.plane = DataPlane(
            StorageSettings(root=str(root), egress=s3.provider_allows, **settings),  # type: ignore[arg-type]
            lambda c, a: self.reports.append((c, a)),
        )

    def activities(self, what: str) -> list[StorageActivity]:
        return [a for _, a in self.reports if a.what == what]


def bucket(s3: S3Server) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name


def storage(s3: S3Server, **fields) -> ContainerStorage:
    creds = fields.pop("credentials", StorageCredentials(access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key))
    return ContainerStorage(credentials=creds, endpoint=s3.endpoint, **fields)


def container(name: str, st: ContainerStorage) -> ContainerSpec:
    return ContainerSpec(name=name, image="none", command=["true"], workload_id="wl-0123abcd", storage=st)


async def placed_with_checkpoint_and_outputs(s3: S3Server, root: Path) -> tuple[str, Host, Path, Path]:
    """A fresh bucket, and a host with one container placed whose checkpoint (hourly) and outputs go there: the bucket,
    the host, the container's checkpoint and output directories."""
    b = bucket(s3)
    st = storage(
        s3,
        checkpoint=CheckpointSpec(uri=f"s3://{b}/ck/", period_s=3600),
        outputs=[StorageMount(uri=f"s3://{b}/out/", path="/out")],
    )
    host = Host(s3, root)
    spec, _ = await host.plane.prepare(container("wl-0123abcd-r0-a1", st), host_paths=True)
    return b, host, Path(spec.env[ENV_CHECKPOINT_DIR]), Path(spec.env[ENV_OUTPUT_DIR])


async def test_inputs_are_fetched_once_per_host_and_placed_read_only(s3, tmp_path):
    b = bucket(s3)
    blob = os.urandom(3 * MIB)
    s3.client().put_object(Bucket=b, Key="sets/one/a.bin", Body=blob)
    s3.client().put_object(Bucket=b, Key="sets/one/sub/b.txt", Body=b"bee")
    st = storage(s3, inputs=[StorageMount(uri=f"s3://{b}/sets/one/", path="/data")])
    host = Host(s3, tmp_path / "host")

    first, mounts = await host.plane.prepare(container("wl-0123abcd-r0-a1", st), host_paths=True)
    data = Path(first.env[ENV_INPUT_DIR])
    assert (data / "a.bin").read_bytes() == blob and (data / "sub" / "b.txt").read_bytes() == b"bee"
    assert stat.S_IMODE((data / "a.bin").stat().st_mode) == 0o444
    assert [m.writable for m in mounts] == [False]
    second, _ = await host.plane.prepare(container("wl-0123abcd-r0-a2", st), host_paths=False)
    assert second.env[ENV_INPUT_DIR] == "/data"  # a runtime that mounts: the path in the container
    assert host.plane.cache.fetches == 2  # two objects, fetched once for both containers
    fetched = host.activities("inputs_fetched")
    assert [(a.bytes, a.cached, a.files) for a in fetched] == [(len(blob) + 3, 0, 2), (0, len(blob) + 3, 2)]
    assert all(a.workload_id == "wl-0123abcd" for a in fetched)

    # A changed object is another entry; the old one stays until the budget needs its room.
    s3.client().put_object(Bucket=b, Key="sets/one/sub/b.txt", Body=b"bee 2")
    third, _ = await host.plane.prepare(container("wl-0123abcd-r0-a3", st), host_paths=True)
    assert (Path(third.env[ENV_INPUT_DIR]) / "sub" / "b.txt").read_bytes() == b"bee 2"
    assert host.plane.cache.fetches == 3
    for name in ("wl-0123abcd-r0-a1", "wl-0123abcd-r0-a2", "wl-0123abcd-r0-a3"):
        await host.plane.finish(name)
    assert not (tmp_path / "host" / "wl-0123abcd-r0-a1").exists()


async def test_a_checkpoint_uploads_what_changed_and_restores_on_another_host(s3, tmp_path):
    b = bucket(s3)
    st = storage(
        s3,
        checkpoint=CheckpointSpec(uri=f"s3://{b}/runs/ck", period_s=3600),
        outputs=[StorageMount(uri=f"s3://{b}/runs/out/", path="/out")],
    )
    one = Host(s3, tmp_path / "one")
    spec, mounts = await one.plane.prepare(container("wl-0123abcd-r0-a1", st), host_paths=True)
    assert ENV_RESTORED not in spec.env  # nothing to restore yet
    ck = Path(spec.env[ENV_CHECKPOINT_DIR])
    (ck / "step").write_text("41")
    (ck / "weights").mkdir()
    weights = os.urandom(2 * MIB)
    (ck / "weights" / "w.bin").write_bytes(weights)
    await one.plane.sync("wl-0123abcd-r0-a1")
    (ck / "step").write_text("42")
    await one.plane.sync("wl-0123abcd-r0-a1")
    await one.plane.sync("wl-0123abcd-r0-a1")  # nothing changed: nothing sent
    uploads = one.activities("checkpoint_uploaded")
    assert [(u.files, u.total_bytes) for u in uploads] == [(2, 2 * MIB + 2), (1, 2 * MIB + 2)]
    assert uploads[1].bytes == 2
    (Path(spec.env[ENV_OUTPUT_DIR]) / "result.txt").write_text("done")
    await one.plane.finish("wl-0123abcd-r0-a1")
    assert s3.client().get_object(Bucket=b, Key="runs/out/result.txt")["Body"].read() == b"done"
    # the superseded version of "step" is gone from the store; the manifest names what is there
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=b, Prefix="runs/ck/")["Contents"]}
    assert keys == {"runs/ck/.idlegrid-checkpoint.json", "runs/ck/data/00000001/weights/w.bin", "runs/ck/data/00000002/step"}

    two = Host(s3, tmp_path / "two")  # another host: nothing of the first one's disk
    again, _ = await two.plane.prepare(container("wl-0123abcd-r0-a2", st), host_paths=True)
    assert again.env[ENV_RESTORED] == "1"
    assert float(again.env[ENV_CHECKPOINT_TIME]) == pytest.approx(uploads[1].taken_at, abs=1e-3)
    restored = Path(again.env[ENV_CHECKPOINT_DIR])
    assert (restored / "step").read_text() == "42"
    assert (restored / "weights" / "w.bin").read_bytes() == weights
    (restore,) = two.activities("checkpoint_restored")
    assert restore.total_bytes == 2 * MIB + 2 and restore.files == 2
    await two.plane.sync("wl-0123abcd-r0-a2")  # restored files are not sent back
    assert two.activities("checkpoint_uploaded") == []
    await two.plane.finish("wl-0123abcd-r0-a2")


async def test_a_large_checkpoint_file_goes_up_in_parts_and_comes_back_whole(s3, tmp_path):
    b = bucket(s3)
    st = storage(s3, checkpoint=CheckpointSpec(uri=f"s3://{b}/big/"))
    host = Host(s3, tmp_path / "h", part_bytes=5 * MIB)
    spec, _ = await host.plane.prepare(container("wl-0123abcd-r0-a1", st), host_paths=True)
    blob = os.urandom(12 * MIB)
    (Path(spec.env[ENV_CHECKPOINT_DIR]) / "model.pt").write_bytes(blob)
    await host.plane.finish("wl-0123abcd-r0-a1")
    head = s3.client().head_object(Bucket=b, Key="big/data/00000001/model.pt")
    assert head["ETag"].strip('"').endswith("-3")  # three parts of 5, 5 and 2 MiB: a multipart upload
    other = Host(s3, tmp_path / "other")
    spec2, _ = await other.plane.prepare(container("wl-0123abcd-r0-a2", st), host_paths=True)
    assert (Path(spec2.env[ENV_CHECKPOINT_DIR]) / "model.pt").read_bytes() == blob
    await other.plane.finish("wl-0123abcd-r0-a2")


async def test_a_file_rewritten_in_place_while_it_goes_up_is_sent_as_read_without_a_stall(s3, tmp_path, monkeypatch):
    """The CI failure of 2026-11-27: a job writes its step with ``echo $step > step`` twice a second, which empties the
    file before writing it. Caught between the moment the upload measured it (3 bytes) and its read, the upload
    announced 3 bytes, sent 1, and the store waited a minute for the rest (the test saw no checkpoint in 30 s). Here
    the container's rewrite lands in that gap every time; the plane sends what it read, at once, and says so."""
    import agent.storage.plane as plane_module

    b, host, ck, out = await placed_with_checkpoint_and_outputs(s3, tmp_path / "h")
    st = storage(s3, checkpoint=CheckpointSpec(uri=f"s3://{b}/ck/", period_s=3600))  # where the other host restores from
    (ck / "step").write_text("100")
    (out / "log.txt").write_text("step 100\n")
    opened = plane_module.open_inside

    class RewrittenAtFirstRead:
        """The opened file, emptied and written shorter (as a shell's > does) just before its first read."""

        def __init__(self, source, path: Path) -> None:
            self.source, self.path, self.rewritten = source, path, False

        def read(self, n: int = -1) -> bytes:
            if not self.rewritten:
                self.rewritten = True
                with open(self.path, "r+") as same:
                    same.truncate(0)
                    same.write("7")
            return self.source.read(n)

        def __getattr__(self, name: str):
            return getattr(self.source, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.source.close()

    def opened_then_rewritten(root: Path, rel: str):
        source = opened(root, rel)
        return RewrittenAtFirstRead(source, root / rel) if source is not None else None

    monkeypatch.setattr(plane_module, "open_inside", opened_then_rewritten)
    await asyncio.wait_for(host.plane.sync("wl-0123abcd-r0-a1"), 20)  # streamed, it held until the read timeout, 60 s
    monkeypatch.setattr(plane_module, "open_inside", opened)
    assert s3.client().get_object(Bucket=b, Key="ck/data/00000001/step")["Body"].read() == b"7"
    assert s3.client().get_object(Bucket=b, Key="out/log.txt")["Body"].read() == b"7"
    (upload,) = host.activities("checkpoint_uploaded")
    assert (upload.bytes, upload.total_bytes) == (1, 1)  # what went up, not what the scan saw
    (outputs,) = host.activities("outputs_uploaded")
    assert outputs.bytes == 1
    await host.plane.finish("wl-0123abcd-r0-a1")
    other = Host(s3, tmp_path / "other")
    again, _ = await other.plane.prepare(container("wl-0123abcd-r0-a2", st), host_paths=True)
    assert (Path(again.env[ENV_CHECKPOINT_DIR]) / "step").read_text() == "7"
    await other.plane.finish("wl-0123abcd-r0-a2")


async def test_the_renters_storage_errors_are_renter_faults_naming_what_to_fix(s3, tmp_path):
    b = bucket(s3)
    s3.client().put_object(Bucket=b, Key="big.bin", Body=os.urandom(2 * MIB))
    host = Host(s3, tmp_path / "h", cache_budget_bytes=1 * MIB)
    wrong = StorageCredentials(access_key_id="AKIANOTAKEY", secret_access_key="nope")
    big = [StorageMount(uri=f"s3://{b}/big.bin", path="/in")]
    cases = [
        (
            storage(s3, credentials=wrong, inputs=[StorageMount(uri=f"s3://{b}/big.bin", path="/in")]),
            StorageUnauthorized,
            "credentials",
        ),
        (storage(s3, outputs=[StorageMount(uri="s3://no-such-bucket-here/x/", path="/out")]), StorageNotFound, "not found"),
        (storage(s3, inputs=[StorageMount(uri=f"s3://{b}/missing.bin", path="/in")]), StorageNotFound, "not found"),
        (storage(s3, inputs=big), StorageTooLarge, "does not fit"),
    ]
    for i, (st, error, words) in enumerate(cases):
        with pytest.raises(error, match=words) as caught:
            await host.plane.prepare(container(f"wl-0123abcd-r0-a{i + 1}", st), host_paths=True)
        assert is_renter_fault(caught.value.code)
        assert "nope" not in str(caught.value)
        assert not (tmp_path / "h" / f"wl-0123abcd-r0-a{i + 1}").exists()  # nothing left behind


async def test_links_a_container_plants_never_make_the_agent_upload_a_host_file(s3, tmp_path):
    host_secret = tmp_path / "host-only.key"
    host_secret.write_text("the host's own secret")
    b, host, ck, out = await placed_with_checkpoint_and_outputs(s3, tmp_path / "h")
    (ck / "step").write_text("1")
    (ck / "stolen").symlink_to(host_secret)
    (ck / "dir").symlink_to(tmp_path, target_is_directory=True)
    (out / "stolen").symlink_to(host_secret)
    os.mkfifo(out / "pipe")  # a FIFO must not hang the upload
    (out / "fine.txt").write_text("ok")
    await host.plane.finish("wl-0123abcd-r0-a1")
    listed = s3.client().list_objects_v2(Bucket=b)["Contents"]
    keys = {o["Key"] for o in listed}
    assert keys == {"ck/.idlegrid-checkpoint.json", "ck/data/00000001/step", "out/fine.txt"}
    for o in listed:
        assert b"host's own secret" not in s3.client().get_object(Bucket=b, Key=o["Key"])["Body"].read()


async def test_a_restarted_agent_goes_on_syncing_the_containers_still_there_and_forgets_the_others(s3, tmp_path):
    b = bucket(s3)
    st = storage(s3, checkpoint=CheckpointSpec(uri=f"s3://{b}/ck/", period_s=3600))
    before = Host(s3, tmp_path / "h")
    kept, _ = await before.plane.prepare(container("wl-0123abcd-r0-a1", st), host_paths=True)
    await before.plane.prepare(container("wl-0123abcd-r0-a2", st), host_paths=True)
    ck = Path(kept.env[ENV_CHECKPOINT_DIR])
    (ck / "a").write_text("1")
    (ck / "b").write_text("2")
    await before.plane.sync("wl-0123abcd-r0-a1")
    await before.plane.close()  # the agent stops; its containers go on

    after = Host(s3, tmp_path / "h")
    assert after.plane.resume({"wl-0123abcd-r0-a1"}) == ["wl-0123abcd-r0-a1"]
    assert not (tmp_path / "h" / "wl-0123abcd-r0-a2").exists()  # gone from the host: its data with it
    (ck / "b").write_text("22")
    await after.plane.sync("wl-0123abcd-r0-a1")
    [upload] = after.activities("checkpoint_uploaded")
    assert upload.files == 1 and upload.total_bytes == 3  # the manifest read back from the store: "a" not sent again
    await after.plane.finish("wl-0123abcd-r0-a1")
