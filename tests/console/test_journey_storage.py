"""A renter's storage journey on a running grid, in Debian's Chromium: store the store's keys as a secret, launch a
workload with a checkpoint and outputs from the console's form, watch its page say when the last checkpoint was
taken and how large it is while it runs, stop it and find its checkpoint in the bucket — a screenshot of each step.

A real Master, relay and agent, each its own process (tests/support/grid.py), and a real S3-compatible server (moto on
127.0.0.1, tests/support/s3.py); the host runs the process runtime sandboxed and its GPU is simulated (there is none
here). The agent moves the data; the console only shows what the Master recorded of it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.console.conftest import ACCOUNTS
from tests.e2e.test_scheduler import sandboxed_hosts
from tests.e2e.test_storage import MASTER_SETTINGS
from tests.support.grid import TEST_PROVIDER, Grid, running_grid
from tests.support.s3 import S3Server

pytestmark = pytest.mark.e2e

PRICE = {"on_demand": "3.60", "min_bid": "1.00"}
# Counts from its checkpoint (or 0), a step every half second, into the checkpoint directory; on SIGTERM it writes its
# step once more and exits 0. No single quote inside: the form's command is split as a shell would (sh -c '...').
JOB = (
    'ck="$IDLEGRID_CHECKPOINT_DIR"; step=0; [ -f "$ck/step" ] && step=$(cat "$ck/step"); '
    'save() { echo $step > "$ck/step"; exit 0; }; trap save TERM; '
    'while true; do step=$((step+1)); echo $step > "$ck/step"; echo step $step; sleep 0.5; done'
)


@pytest.fixture
def grid(tmp_path: Path, s3: S3Server) -> Iterator[Grid]:
    # The store is moto on 127.0.0.1: the operator and the hosts' providers allow it by name (common/egress.py).
    with running_grid(tmp_path, MASTER_SETTINGS, egress_allow=[s3.allowed]) as g:
        yield g


@pytest.fixture
def rita(grid: Grid) -> str:
    """The renter with its console password and 10.00 to spend; one sandboxed A10 host, priced."""
    account = ACCOUNTS["renter"]
    grid.client.create_account(account.id, "renter", name=account.name)
    grid.client.set_password(account.id, account.password)
    grid.client.credit(account.id, "10.00", memo="journey credit")
    sandboxed_hosts(grid, 1)
    grid.client.set_default_price(PRICE, provider=TEST_PROVIDER)
    return account.id


def test_a_renter_stores_keys_launches_with_a_checkpoint_and_sees_it_taken(grid, rita, s3: S3Server, page, shot):
    bucket = f"journey-{os.urandom(4).hex()}"
    s3.client().create_bucket(Bucket=bucket)
    account = ACCOUNTS["renter"]
    page.goto(f"{grid.api_url}/console/")
    page.get_by_label("Account").fill(account.id)
    page.get_by_label("Password").fill(account.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/offers$"))

    page.get_by_role("link", name="Secrets").click()
    page.get_by_label("Name", exact=True).fill("minio-keys")
    page.get_by_label("Value", exact=True).fill(s3.credentials)
    page.get_by_role("button", name="Store secret").click()
    expect(page.locator("#secrets")).to_contain_text("minio-keys")
    assert s3.secret_access_key not in page.content()
    shot(page, "secret-stored")

    page.get_by_role("link", name="Launch").click()
    page.get_by_label("Name", exact=True).fill("counter")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("Command", exact=False).fill(f"sh -c '{JOB}'")
    page.get_by_label("May run as a sandboxed process", exact=False).check()
    page.get_by_label("Outputs", exact=False).fill(f"s3://{bucket}/counter/out/ /out")
    page.get_by_label("Checkpoint location").fill(f"s3://{bucket}/counter/ck/")
    page.get_by_label("Upload every, seconds").fill("1")
    page.get_by_label("Credentials (your secret)").select_option("minio-keys")
    page.get_by_label("Endpoint", exact=False).fill(s3.endpoint)
    page.get_by_label("Stop grace", exact=False).fill("10")
    shot(page, "launch-form")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    workload_id = page.url.rsplit("/", 1)[1]

    # The page follows the workload by itself (htmx polls its live part, which holds the checkpoint's state).
    expect(page.locator("#workload-state")).to_have_text("running", timeout=60_000)
    expect(page.locator("#checkpoint-last")).to_contain_text("taken", timeout=30_000)
    expect(page.locator("#checkpoint-last")).to_contain_text("bytes in all")  # a step number: a few bytes
    assert "checkpoint uploaded" in page.locator("#transfers").inner_text()
    shot(page, "checkpoint-taken")

    page.get_by_role("button", name="Stop this workload").click()
    expect(page.locator("#workload-state")).to_have_text("cancelled", timeout=30_000)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket, Prefix="counter/ck/").get("Contents", [])]
    assert any(key.endswith(".idlegrid-checkpoint.json") for key in keys), keys  # whole: its manifest is written last
    page.reload()
    assert "checkpoint uploaded" in page.locator("#transfers").inner_text()
    shot(page, "stopped")
    assert workload_id in page.url
