"""Issue 25 acceptance on a real local grid (a Master, a relay and sandboxed process-runtime hosts, each its own
process) and a real S3-compatible server (moto on 127.0.0.1: HTTP, SigV4, multipart). GPUs are simulated (none exists
here). The hosts' agents move the data; the Master and the relay never see a byte of it.

1. An interruptible workload that counts steps in its checkpoint directory is preempted by an on-demand one, requeued
   onto the other host, continues from its checkpoint, finishes, and its outputs are in the bucket.
2. A host SIGKILLed mid-run: the workload resumes on the other host from the last periodic checkpoint.
3. A 200 MB input is fetched once per host: the second workload on the host starts from the cache.
4. Wrong credentials, a missing bucket, inputs too large for the host: the workload fails with a reason the renter
   can act on and the host's reputation does not move; another account can use none of the renter's secrets.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from management.client.api import ApiClient, ApiError
from tests.e2e.test_market import PRICES, funded_renter
from tests.e2e.test_scheduler import SANDBOXED, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, Daemon, Grid, running_grid, wait_for
from tests.support.s3 import S3Server

MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "preemption_grace_s": 5.0,
    "offer_sandboxed_hosts": True,
    "telemetry_s": 0.5,
    "requeue_offline_after_s": 3.0,
}
PERIOD_S = 1.0  # the checkpoint period: short, so a test sees several
STEPS = 60  # the counter's end; a step every 0.2 s
# Counts from its checkpoint (or 0), writing the step there atomically; on SIGTERM writes it once more and exits 0.
# Each start leaves start-from-<step>-restored-<0|1> in its outputs, and its end result.txt.
COUNTER = (
    'ck="$IDLEGRID_CHECKPOINT_DIR"; out="$IDLEGRID_OUTPUT_DIR"; step=0; '
    '[ -f "$ck/step" ] && step=$(cat "$ck/step"); '
    'touch "$out/start-from-$step-restored-${IDLEGRID_RESTORED:-0}"; '
    'trap \'echo $step > "$ck/step.tmp"; mv "$ck/step.tmp" "$ck/step"; exit 0\' TERM; '
    f"while [ $step -lt {STEPS} ]; do step=$((step+1)); "
    'echo $step > "$ck/step.tmp"; mv "$ck/step.tmp" "$ck/step"; sleep 0.2; done; '
    'echo "done $step" > "$out/result.txt"'
)


@pytest.fixture
def grid(tmp_path: Path, s3: S3Server) -> Iterator[Grid]:
    # The store is moto on 127.0.0.1: the operator and the hosts' providers allow it by name (common/egress.py).
    with running_grid(tmp_path, MASTER_SETTINGS, egress_allow=[s3.allowed]) as g:
        yield g


@pytest.fixture
def home_grid(s3: S3Server) -> Iterator[Grid]:
    """A grid whose state directories all lie in ``<home>/clone``, ``<home>`` 0700 and outside /tmp (as /root is)."""
    home = Path(tempfile.mkdtemp(prefix="idlegrid-home-", dir="/run"))
    try:
        with running_grid(home / "clone", MASTER_SETTINGS, egress_allow=[s3.allowed]) as g:
            yield g
    finally:
        shutil.rmtree(home, ignore_errors=True)


def hosts(grid: Grid, count: int, **env: str) -> dict[str, Daemon]:
    """``count`` sandboxed hosts with one simulated A10 each, priced; their agents' processes by host id."""
    found = {}
    for n in range(count):
        agent_id, daemon = grid.run_agent(f"host-{n}", simulate="a10:1", env={**SANDBOXED, **env})
        found[agent_id] = daemon
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)
    return found


def new_bucket(s3: S3Server) -> str:
    name = f"e2e-{os.urandom(5).hex()}"
    s3.client().create_bucket(Bucket=name)
    return name


def stored_renter(grid: Grid, s3: S3Server, account: str, credentials: str | None = None) -> ApiClient:
    client = funded_renter(grid, account, "10")
    client.create_secret("s3", credentials or s3.credentials)
    return client


def with_storage(s3: S3Server, spec: dict[str, Any], **storage: Any) -> dict[str, Any]:
    return {**spec, "storage": {"credentials": "s3", "endpoint": s3.endpoint}, **storage}


def counter(s3: S3Server, bucket: str, name: str, **fields: Any) -> dict[str, Any]:
    return with_storage(
        s3,
        workload(name, COUNTER, restart_policy="on_failure", **fields),
        checkpoint={"uri": f"s3://{bucket}/{name}/ck/", "period_s": PERIOD_S},
        outputs=[{"uri": f"s3://{bucket}/{name}/out/", "path": "/out"}],
        stop_grace_s=10,
    )


def outputs(s3: S3Server, bucket: str, prefix: str) -> set[str]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix) :] for o in listed}


def starts(names: set[str]) -> list[tuple[int, int]]:
    """(step it started from, restored 0|1) of each start, in step order."""
    found = []
    for name in names:
        if name.startswith("start-from-"):
            step, _, restored = name.removeprefix("start-from-").partition("-restored-")
            found.append((int(step), int(restored)))
    return sorted(found)


def checkpointed_step(s3: S3Server, bucket: str, prefix: str) -> int:
    """The step in the checkpoint the store holds now (what its manifest names), 0 for none."""
    client = s3.client()
    try:
        manifest = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}.idlegrid-checkpoint.json")["Body"].read())
    except client.exceptions.NoSuchKey:
        return 0
    return int(client.get_object(Bucket=bucket, Key=manifest["files"]["step"]["key"])["Body"].read())


def host_of(w: dict[str, Any]) -> str:
    return w["assignments"][0]["agent_id"]


def test_an_interruptible_counter_preempted_by_an_on_demand_rental_resumes_on_another_host(grid, s3):
    host_ids = hosts(grid, 2)
    bucket = new_bucket(s3)
    alice = stored_renter(grid, s3, "alice")
    bob = funded_renter(grid, "bob", "10")
    cheap = alice.submit_workload(counter(s3, bucket, "count", rental={"kind": "interruptible", "bid": "0.72"}))["id"]
    first = wait_workload(alice, cheap, "running", lambda w: w["state"] == "running", timeout=30)
    wait_workload(alice, cheap, "a checkpoint uploaded", lambda w: (w["storage"] or {}).get("checkpoint_uploads", 0) >= 2)
    busy = host_of(first)
    before = checkpointed_step(s3, bucket, "count/ck/")
    # The on-demand rental takes the interruptible one's host; the other host is free for the requeued counter.
    od = bob.rent_offer(busy, workload("urgent", "sleep 300", rental={"kind": "on_demand", "max_price": "5"}))["id"]
    wait_workload(bob, od, "running", lambda w: w["state"] == "running", timeout=40)
    moved = wait_workload(
        alice, cheap, "running on the other host", lambda w: w["state"] == "running" and host_of(w) != busy, timeout=40
    )
    assert moved["preemptions"] == 1 and host_of(moved) in host_ids
    done = wait_workload(alice, cheap, "succeeded", lambda w: w["state"] == "succeeded", timeout=60)

    names = wait_for(lambda: (o := outputs(s3, bucket, "count/out/")) and "result.txt" in o and o, 30, "the outputs")
    assert s3.client().get_object(Bucket=bucket, Key="count/out/result.txt")["Body"].read() == f"done {STEPS}\n".encode()
    (fresh, _), (resumed, restored) = starts(names)
    assert fresh == 0 and restored == 1 and 0 < resumed < STEPS, names  # it went on, not from zero
    assert resumed >= before, (resumed, before)  # from its last checkpoint (the one written at its SIGTERM), not older
    storage = done["storage"]
    assert storage["restored_from"] is not None and storage["checkpoint_bytes"] > 0, storage
    assert "outputs_uploaded" in [t["what"] for t in storage["recent"]]  # the first run's, at its preemption
    bob.cancel_workload(od)


def test_a_host_sigkilled_mid_run_resumes_elsewhere_from_its_last_periodic_checkpoint(grid, s3):
    resumes_after_a_sigkill(grid, s3)


def test_a_grid_run_from_a_home_directory_checkpoints_and_resumes_a_sigkilled_hosts_workload(home_grid, s3):
    """The demo from a clone in /root (issue 36): the hosts' storage directories lie under a directory no container's
    uid may traverse, and outside /tmp, which the sandbox would cover with a fresh one. The program still finds its
    checkpoint directory (at a fixed path, bound), its checkpoints go up, and it resumes elsewhere."""
    resumes_after_a_sigkill(home_grid, s3)


def resumes_after_a_sigkill(grid: Grid, s3: S3Server) -> None:
    agents = hosts(grid, 2)
    bucket = new_bucket(s3)
    alice = stored_renter(grid, s3, "alice")
    wid = alice.submit_workload(counter(s3, bucket, "lost"))["id"]
    first = wait_workload(alice, wid, "running", lambda w: w["state"] == "running", timeout=30)
    seen = wait_workload(alice, wid, "periodic checkpoints", lambda w: (w["storage"] or {}).get("checkpoint_uploads", 0) >= 3)
    checkpoint_at = seen["storage"]["checkpoint_at"]
    lost = host_of(first)
    agents[lost].kill()  # SIGKILL: no last upload, no goodbye
    killed_at = time.time()
    last = checkpointed_step(s3, bucket, "lost/ck/")  # the last periodic checkpoint: nothing uploads it any more
    moved = wait_workload(
        alice, wid, "running on the other host", lambda w: w["state"] == "running" and host_of(w) != lost, timeout=60
    )
    assert moved["storage"]["restored_from"] >= checkpoint_at
    wait_workload(alice, wid, "succeeded", lambda w: w["state"] == "succeeded", timeout=60)
    names = wait_for(lambda: (o := outputs(s3, bucket, "lost/out/")) and "result.txt" in o and o, 30, "the outputs")
    resumed = [step for step, restored in starts(names) if restored]
    # It resumed from exactly the last periodic checkpoint: what the lost host did after it (at most one period, as
    # its counter steps 5 times a second and the period is 1 s) is all it lost.
    assert resumed == [last] and last > 0, (names, last)
    assert time.time() - killed_at < 120


def test_a_200_mb_input_is_fetched_once_per_host(grid, s3):
    hosts(grid, 1)
    bucket = new_bucket(s3)
    s3.put_large(bucket, "weights/model.bin", os.urandom(200 * 1024 * 1024))
    alice = stored_renter(grid, s3, "alice")
    read = 'test "$(wc -c < "$IDLEGRID_INPUT_DIR/model.bin")" -eq 209715200'
    spec = with_storage(s3, workload("reader", read), inputs=[{"uri": f"s3://{bucket}/weights/model.bin", "path": "/in"}])
    runs = []
    for n in range(2):
        wid = alice.submit_workload({**spec, "name": f"reader-{n}"})["id"]
        done = wait_workload(alice, wid, "succeeded", lambda w: w["state"] in ("succeeded", "failed"), timeout=120)
        assert done["state"] == "succeeded", done["state_reason"]
        [fetch] = [t for t in done["storage"]["recent"] if t["what"] == "inputs_fetched"]
        runs.append(fetch)
    assert runs[0]["bytes"] == 200 * 1024 * 1024
    assert runs[1]["bytes"] == 0  # the second workload on the host read the cache: nothing fetched


def test_the_renters_storage_errors_fail_the_workload_with_its_reason_and_cost_the_host_nothing(grid, s3):
    [host] = hosts(grid, 1, IDLEGRID_AGENT_STORAGE_CACHE_GB="0.001")  # about 1 MB of input cache
    bucket = new_bucket(s3)
    s3.client().put_object(Bucket=bucket, Key="big.bin", Body=os.urandom(4 * 1024 * 1024))
    alice = stored_renter(grid, s3, "alice")
    alice.create_secret("wrong", "AKIAWRONGKEY:not-the-secret")
    cases = {
        "keys": (
            {
                "storage": {"credentials": "wrong", "endpoint": s3.endpoint},
                "outputs": [{"uri": f"s3://{bucket}/o/", "path": "/o"}],
            },
            "storage_unauthorized",
        ),
        "bucket": (
            {
                "storage": {"credentials": "s3", "endpoint": s3.endpoint},
                "outputs": [{"uri": "s3://no-such-bucket/o/", "path": "/o"}],
            },
            "storage_not_found",
        ),
        "disk": (
            {
                "storage": {"credentials": "s3", "endpoint": s3.endpoint},
                "inputs": [{"uri": f"s3://{bucket}/big.bin", "path": "/i"}],
            },
            "storage_too_large",
        ),
    }
    for name, (fields, code) in cases.items():
        wid = alice.submit_workload({**workload(name, "true"), **fields})["id"]
        failed = wait_workload(alice, wid, "failed", lambda w: w["state"] == "failed", timeout=40)
        assert f"({code})" in failed["state_reason"] and not failed["host_failure"], failed
        assert "not-the-secret" not in str(failed)
    evidence = grid.agent(host)["reputation"]["evidence"]
    assert evidence["containers_failed"] == 0 and evidence["containers_refused"] == 3, evidence

    # Another account cannot name alice's secret, nor list or delete it.
    bob = funded_renter(grid, "bob", "10")
    with pytest.raises(ApiError) as refused:
        bob.submit_workload({**workload("steal", "true"), **cases["bucket"][0]})
    assert refused.value.status == 400 and "no secret named 's3'" in str(refused.value)
    assert bob.secrets()["items"] == []
    with pytest.raises(ApiError) as gone:
        bob.delete_secret("s3")
    assert gone.value.status == 404
    assert [s["name"] for s in alice.secrets()["items"]] == ["s3", "wrong"]


def test_a_store_the_operator_allows_but_the_hosts_provider_does_not_fails_as_egress_refused_costing_the_host_nothing(grid, s3):
    # The operator lets renters name the store (on 127.0.0.1); this host's provider allows nothing private.
    [host] = hosts(grid, 1, IDLEGRID_AGENT_EGRESS_ALLOW="")
    bucket = new_bucket(s3)
    alice = stored_renter(grid, s3, "alice")
    fields = {"outputs": [{"uri": f"s3://{bucket}/o/", "path": "/o"}]}
    wid = alice.submit_workload(with_storage(s3, workload("private-store", "true"), **fields))["id"]
    failed = wait_workload(alice, wid, "failed", lambda w: w["state"] == "failed", timeout=40)
    assert "(egress_refused)" in failed["state_reason"] and not failed["host_failure"], failed
    assert "egress_allow in the agent's config" in failed["state_reason"]  # what the renter can ask for
    evidence = grid.agent(host)["reputation"]["evidence"]
    assert evidence["containers_failed"] == 0 and evidence["containers_refused"] == 1, evidence
    assert outputs(s3, bucket, "o/") == set()

    # A private endpoint the operator does not allow is refused at submit, naming the field.
    with pytest.raises(ApiError) as refused:
        alice.submit_workload(
            {**workload("loopback", "true"), **fields, "storage": {"credentials": "s3", "endpoint": "http://127.0.0.1:1"}}
        )
    assert refused.value.status == 400 and "storage.endpoint:" in str(refused.value), refused.value
