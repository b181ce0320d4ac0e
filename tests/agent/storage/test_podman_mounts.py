"""The data plane through the docker runtime on a real Podman (its Docker-compatible API): the inputs, outputs and
checkpoint appear at the paths the spec names (inputs read-only), and a restored checkpoint is what the container
reads. The object store is a real S3-compatible server (moto on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from agent.runtime.docker import DockerRuntime
from agent.storage.plane import DataPlane, StorageSettings
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.storage import CheckpointSpec, ContainerStorage, StorageCredentials, StorageMount

pytestmark = pytest.mark.podman

SCRIPT = (
    'cat /in/hello.txt > /out/copied.txt; echo "$IDLEGRID_RESTORED $(cat $IDLEGRID_CHECKPOINT_DIR/step)" > /out/seen.txt; '
    "echo 8 > /checkpoint/step; (echo x > /in/hello.txt) 2>/dev/null && echo writable > /out/inputs.txt; exit 0"
)


async def test_a_docker_runtime_container_sees_its_data_at_the_specs_paths(podman, s3, tmp_path):
    bucket = f"pod-{uuid.uuid4().hex[:10]}"
    client = s3.client()
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="in/hello.txt", Body=b"hello from s3")
    client.put_object(
        Bucket=bucket,
        Key="ck/.idlegrid-checkpoint.json",
        Body=b'{"time": 5.0, "generation": 1, "files": {"step": {"key": "ck/data/00000001/step", "size": 2}}}',
    )
    client.put_object(Bucket=bucket, Key="ck/data/00000001/step", Body=b"7\n")
    storage = ContainerStorage(
        credentials=StorageCredentials(access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key),
        endpoint=s3.endpoint,
        inputs=[StorageMount(uri=f"s3://{bucket}/in/", path="/in")],
        outputs=[StorageMount(uri=f"s3://{bucket}/out/", path="/out")],
        checkpoint=CheckpointSpec(uri=f"s3://{bucket}/ck/", path="/checkpoint"),
    )
    plane = DataPlane(StorageSettings(root=str(tmp_path / "data"), egress=s3.provider_allows), lambda c, a: None)
    runtime = DockerRuntime(podman.socket_path)
    spec = ContainerSpec(name="mounted", image=podman.image, command=["sh", "-c", SCRIPT], storage=storage)
    try:
        ready, mounts = await plane.prepare(spec, host_paths=runtime.host_paths)
        assert ready.env["IDLEGRID_CHECKPOINT_DIR"] == "/checkpoint" and ready.env["IDLEGRID_RESTORED"] == "1"
        await runtime.create_mounted(ready, labels={LABEL_COMMAND_ID: "cmd-m", LABEL_AGENT_ID: "agt-1"}, mounts=mounts)
        for _ in range(200):
            info = await runtime.inspect("mounted")
            if info is not None and info.state == "exited":
                break
            await asyncio.sleep(0.05)
        assert info is not None and info.exit_code == 0
        await runtime.delete("mounted")
        await plane.finish("mounted")
    finally:
        await runtime.close()
        podman.podman("rm", "--all", "--force", "--time", "0")
    out = {
        o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]
    }
    assert out == {"out/copied.txt": b"hello from s3", "out/seen.txt": b"1 7\n"}  # inputs were read-only: no inputs.txt
    manifest = client.get_object(Bucket=bucket, Key="ck/.idlegrid-checkpoint.json")["Body"].read()
    assert b'"generation":2' in manifest
    assert client.get_object(Bucket=bucket, Key="ck/data/00000002/step")["Body"].read() == b"8\n"
    assert not Path(tmp_path / "data" / "mounted").exists()
