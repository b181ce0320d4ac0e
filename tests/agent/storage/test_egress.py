"""A renter's storage endpoint reaches only what the egress rule allows (common/egress.py), through the agent's real
storage code: every refused target here is a counting listener on 127.0.0.1 that must see no connection at all, for
reads and for writes, and names are resolved by a resolver the test gives (nothing is looked up in real DNS). The
allowed paths run against moto on 127.0.0.1, which its provider allows by name."""

from __future__ import annotations

import http.server
import threading
import uuid
from pathlib import Path
from typing import BinaryIO

import pytest

from agent.storage.objects import ObjectStore, TransferLimits, bulk_pool
from agent.storage.plane import DataPlane, StorageSettings
from common.containers import ContainerSpec
from common.egress import EgressRule
from common.errors import EgressRefused, is_renter_fault
from common.storage import ContainerStorage, StorageCredentials, StorageMount
from tests.support.egress import resolving_to_loopback
from tests.support.s3 import S3Server

KEYS = StorageCredentials(access_key_id="AKIATEST", secret_access_key="not-a-real-secret")


def store_at(endpoint: str, rule: EgressRule | None = None, **limits: int) -> ObjectStore:
    storage = ContainerStorage(credentials=KEYS, endpoint=endpoint)
    return ObjectStore(storage, TransferLimits(egress=rule or EgressRule(), attempts=1, **limits))


def a_file(tmp_path: Path, data: bytes = b"output") -> BinaryIO:
    path = tmp_path / "result.txt"
    path.write_bytes(data)
    return open(path, "rb")  # noqa: SIM115 (the store reads it; the test's end closes it)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.1", "2130706433", "[::ffff:127.0.0.1]"])
async def test_a_storage_endpoint_on_the_hosts_loopback_is_refused_for_reads_and_writes_without_a_connection(
    listener, tmp_path, host
):
    store = store_at(f"http://{host}:{listener.port}")
    with pytest.raises(EgressRefused, match="connects only to public addresses") as read:
        await store.fetch("bucket", "input.bin", tmp_path / "input.bin")
    with pytest.raises(EgressRefused, match="egress_allow in the agent's config"):
        await store.put(a_file(tmp_path), "bucket", "out/result.txt")
    with pytest.raises(EgressRefused):
        await store.list("bucket", "")
    store.close()
    assert listener.connections() == 0
    assert is_renter_fault(read.value.code)  # the renter's failure: the host's reputation is untouched


async def test_a_name_that_resolves_to_loopback_when_the_connection_is_made_is_refused_before_connecting(listener, tmp_path):
    rule = EgressRule(resolver=resolving_to_loopback)
    store = store_at(f"http://store.example:{listener.port}", rule)
    with pytest.raises(EgressRefused, match=r"store.example resolves to 127.0.0.1: a loopback address"):
        await store.fetch("bucket", "input.bin", tmp_path / "input.bin")
    with pytest.raises(EgressRefused, match=r"store.example resolves to 127.0.0.1"):
        await store.put(a_file(tmp_path), "bucket", "out/result.txt")
    store.close()
    assert listener.connections() == 0


async def test_large_writes_moved_by_a_process_of_their_own_are_refused_too(listener, tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 4096)
    storage = ContainerStorage(credentials=KEYS, endpoint=f"http://127.0.0.1:{listener.port}")
    pool = bulk_pool(1)
    try:
        store = ObjectStore(storage, TransferLimits(part_bytes=1024, attempts=1), pool)
        with open(path, "rb") as source, pytest.raises(EgressRefused, match="public addresses"):
            await store.put(source, "bucket", "out/big.bin")
        with pytest.raises(EgressRefused):
            await store.fetch("bucket", "big.bin", tmp_path / "back.bin", size=4096)
    finally:
        pool.shutdown()
    assert listener.connections() == 0


async def test_a_workloads_inputs_on_the_hosts_loopback_fail_its_create_as_the_renters_fault(listener, tmp_path):
    plane = DataPlane(StorageSettings(root=str(tmp_path / "data"), bulk_processes=False), lambda c, a: None)
    storage = ContainerStorage(
        credentials=KEYS,
        endpoint=f"http://127.0.0.1:{listener.port}",
        inputs=[StorageMount(uri="s3://bucket/data/", path="/data")],
    )
    spec = ContainerSpec(name="wl-0123abcd-r0-a1", image="none", command=["true"], workload_id="wl-0123abcd", storage=storage)
    with pytest.raises(EgressRefused) as refused:
        await plane.prepare(spec, host_paths=True)
    await plane.close()
    assert refused.value.code == "egress_refused" and f"127.0.0.1:{listener.port}" in str(refused.value)
    assert listener.connections() == 0


async def test_the_provider_allows_its_own_store_by_name_and_the_connection_goes_to_the_address_judged(s3: S3Server, tmp_path):
    # renterstore exists in no DNS: the object arrives only because the connection used the resolver's answer.
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    port = int(s3.allowed.rsplit(":", 1)[1])
    rule = EgressRule.allowing([f"renterstore:{port}"], resolver=resolving_to_loopback)
    storage = ContainerStorage(
        credentials=StorageCredentials(access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key),
        endpoint=f"http://renterstore:{port}",
    )
    store = ObjectStore(storage, TransferLimits(egress=rule))
    await store.put(a_file(tmp_path, b"kept"), bucket, "out/result.txt")
    assert await store.get_bytes(bucket, "out/result.txt") == b"kept"
    store.close()


class Redirecting(http.server.BaseHTTPRequestHandler):
    """A store that answers every request with a permanent redirect to ``target`` (another region, another host)."""

    target = ""

    def _redirect(self) -> None:
        self.send_response(301)
        self.send_header("Location", self.target)
        self.send_header("x-amz-bucket-region", "eu-west-1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_HEAD = do_POST = _redirect

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_a_redirect_from_the_store_is_not_followed(listener, tmp_path):
    Redirecting.target = f"http://127.0.0.1:{listener.port}/bucket/input.bin"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        store = store_at(f"http://127.0.0.1:{port}", EgressRule.allowing([f"127.0.0.1:{port}"]))
        with pytest.raises(EgressRefused, match=r"redirect \(301"):
            await store.fetch("bucket", "input.bin", Path(tmp_path / "input.bin"))
        with pytest.raises(EgressRefused, match="not followed"):
            await store.put(a_file(tmp_path), "bucket", "out/result.txt")
        store.close()
    finally:
        server.shutdown()
        server.server_close()
    assert listener.connections() == 0
