"""Storage in the renter's console, in Debian's Chromium against a real Master (docs/console-pages.md, "Secrets and
storage"): the secrets page (store, errors beside the fields, delete after a confirmation), the launch form's storage
block (the spec it submits is the one ``idlegrid workload submit --input/--output/--checkpoint`` builds; bad input
said beside its field) and the checkpoint's state on a workload's page.

The hosts are simulated (no GPU here, and no agent runs behind them); the storage events a workload's page reads are
recorded as the Master records a host's reports (master/agent_channel.py ``_on_storage``); the agent's transfers
themselves are tested on a real grid with a real S3 server in tests/e2e/test_storage.py."""

from __future__ import annotations

import re
import time

import msgspec
import pytest

from common.storage import CheckpointSpec, StorageAccess, StorageActivity, StorageMount
from management.cli.main import build_parser
from management.cli.workloads import spec_from
from management.console.templating import when
from management.market.money import parse_amount
from management.market.prices import PriceSetting
from master.port import EventRecord, WorkloadSpec
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEYS = "AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def store_secret(page, name: str, value: str) -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Value", exact=True).fill(value)
    page.get_by_role("button", name="Store secret").click()


def test_secrets_are_stored_listed_by_name_and_deleted_after_a_confirmation(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Account").click()
    page.locator("#secrets-link").get_by_role("link", name="your secrets").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.url.endswith("/console/secrets") and "No secrets yet" in page.locator("main").inner_text()
    store_secret(page, "datasets-rw", KEYS)
    page.wait_for_url(re.compile(r"/console/secrets$"))
    assert "Its value is never shown again" in page.locator(".flashes").inner_text()
    assert "datasets-rw" in page.locator("#secrets").inner_text()
    assert "wJalr" not in page.content()
    shot(page, "stored")
    store_secret(page, "datasets-rw", "other:value")  # taken
    assert "you already have a secret named 'datasets-rw'" in page.locator("#name-error").inner_text()
    assert page.get_by_label("Name", exact=True).get_attribute("aria-invalid") == "true"
    assert page.get_by_label("Value", exact=True).input_value() == ""  # never sent back
    shot(page, "duplicate")
    store_secret(page, "bad name!", "x")
    assert "starting with a letter or digit" in page.locator("#name-error").inner_text()
    shot(page, "bad-name")
    page.get_by_role("link", name="Delete secret datasets-rw").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "can no longer" in page.locator("main").inner_text()
    shot(page, "confirm-delete")
    page.get_by_role("button", name="Delete datasets-rw").click()
    page.wait_for_url(re.compile(r"/console/secrets$"))
    assert "Deleted secret datasets-rw" in page.locator(".flashes").inner_text()
    assert "No secrets yet" in page.locator("main").inner_text()


@pytest.fixture
def market(console_master):
    """Provider acme's A10 host priced 1.20 per GPU-hour; the renter has 25.00 and its storage keys as a secret."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        await add_agent(master, "agt-a10", "a10:2", provider="acme", runtime="docker", isolation="container")
        await services.prices.book.set_default("acme", PriceSetting(on_demand="1.20", min_bid="0.40"))
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")
        await services.secrets.create("rita", "datasets-rw", KEYS)

    console_master.run(seed())
    return console_master


def fill_storage(page, **fields: str) -> None:
    for label, value in fields.items():
        page.locator(f"#{label}").fill(value)


def test_the_launch_form_submits_inputs_outputs_and_a_checkpoint_as_the_command_line_would(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Launch").click()
    page.get_by_label("Name", exact=True).fill("train")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("Inputs", exact=False).fill("s3://datasets/imagenet/ /data\ns3://models/base.bin:/weights")
    page.get_by_label("Outputs", exact=False).fill("s3://results/run-1/ /out")
    page.get_by_label("Checkpoint location").fill("s3://checkpoints/run-1/")
    page.get_by_label("Upload every, seconds").fill("60")
    page.get_by_label("Endpoint", exact=False).fill("http://127.0.0.1:9000")
    page.get_by_label("Credentials (your secret)").select_option("datasets-rw")
    page.get_by_label("Stop grace", exact=False).fill("90")
    shot(page, "filled")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    workload_id = page.url.rsplit("/", 1)[1]
    record = market.run(market.services.workloads.get_workload(workload_id, account="rita"))
    args = build_parser().parse_args(
        ["workload", "submit", "--name", "train", "--image", "python:3.12", "--gpus", "1",
         "--input", "s3://datasets/imagenet/:/data", "--input", "s3://models/base.bin:/weights",
         "--output", "s3://results/run-1/:/out", "--checkpoint", "s3://checkpoints/run-1/", "--checkpoint-period", "60",
         "--storage-endpoint", "http://127.0.0.1:9000", "--storage-credentials", "datasets-rw", "--stop-grace", "90"]
    )  # fmt: skip
    cli = msgspec.convert(spec_from(args), WorkloadSpec)
    storage_fields = ("inputs", "outputs", "checkpoint", "storage", "stop_grace_s")
    assert {f: getattr(record.spec, f) for f in storage_fields} == {f: getattr(cli, f) for f in storage_fields}
    assert KEYS not in page.content()  # the page names the secret, never its value
    shot(page, "launched")


def test_bad_storage_input_is_said_beside_its_field_and_what_was_typed_is_kept(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("train")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("Inputs", exact=False).fill("s3://datasets/a /data\nhttp://elsewhere/b /b")
    page.get_by_label("Outputs", exact=False).fill("s3://results/run-1/ /data/out")
    page.get_by_label("Checkpoint location").fill("s3://checkpoints/run-1/")
    page.get_by_label("Upload every, seconds").fill("0")
    page.get_by_label("Stop grace", exact=False).fill("3600")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "problems" in page.get_by_role("alert").first.inner_text()
    assert "line 2" in page.locator("#inputs-error").inner_text() and "s3://" in page.locator("#inputs-error").inner_text()
    assert "from 1 to 86400" in page.locator("#checkpoint_period-error").inner_text()
    assert "choose the secret" in page.locator("#storage_credentials-error").inner_text()
    assert "from 1 to 600" in page.locator("#stop_grace-error").inner_text()
    assert page.get_by_label("Checkpoint location").input_value() == "s3://checkpoints/run-1/"
    assert page.locator("#inputs").get_attribute("aria-invalid") == "true"
    shot(page, "storage-errors")
    # the overlap is the submit's own check, said beside the outputs once the rest is right
    page.get_by_label("Inputs", exact=False).fill("s3://datasets/a /data")
    page.get_by_label("Upload every, seconds").fill("")
    page.get_by_label("Stop grace", exact=False).fill("")
    page.get_by_label("Credentials (your secret)").select_option("datasets-rw")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "overlaps inputs[0]" in page.locator("#outputs-error").inner_text()
    shot(page, "overlap")


def test_renting_an_offer_takes_the_storage_block_too(market, page, sign_in):
    sign_in(page, "renter")
    page.get_by_role("link", name="Rent offer agt-a10", exact=False).click()
    page.get_by_label("Name", exact=True).fill("on-a10")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("Checkpoint location").fill("s3://checkpoints/on-a10/")
    page.get_by_label("Credentials (your secret)").select_option("datasets-rw")
    page.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    record = market.run(market.services.workloads.get_workload(page.url.rsplit("/", 1)[1], account="rita"))
    assert record.spec.checkpoint is not None and record.spec.checkpoint.uri == "s3://checkpoints/on-a10/"
    assert record.spec.storage is not None and record.spec.storage.credentials == "datasets-rw"


def storage_event(what: str, workload_id: str, at: float, **data) -> EventRecord:
    """A host's transfer report as the Master records it (master/agent_channel.py ``_on_storage``)."""
    activity = msgspec.to_builtins(StorageActivity(what=what, workload_id=workload_id, **data))
    activity.pop("workload_id")
    return EventRecord(
        ts=at,
        kind=f"storage.{what}",
        subject=workload_id,
        data={"agent_id": "agt-a10", "container": f"{workload_id}-0", **activity},
    )


def test_a_workloads_page_says_when_the_last_checkpoint_was_taken_its_size_and_what_it_resumed_from(market, page, sign_in, shot):
    spec = WorkloadSpec(
        name="counter", image="python:3.12", inputs=[StorageMount(uri="s3://datasets/big.bin", path="/data")],
        outputs=[StorageMount(uri="s3://results/counter/", path="/out")],
        checkpoint=CheckpointSpec(uri="s3://checkpoints/counter/", period_s=60),
        storage=StorageAccess(credentials="datasets-rw", endpoint="http://127.0.0.1:9000"), stop_grace_s=45,
    )  # fmt: skip
    record = market.run(market.services.workloads.submit_workload("rita", spec))
    plain = market.run(market.services.workloads.submit_workload("rita", WorkloadSpec(name="plain", image="python:3.12")))
    now = time.time()
    GB12, GB125, MB300 = 1_200_000_000, 1_250_000_000, 300_000_000
    events = [
        storage_event("checkpoint_restored", record.id, now - 600, bytes=GB12, total_bytes=GB12, seconds=8.0, taken_at=now - 4e3),
        storage_event("inputs_fetched", record.id, now - 590, bytes=200_000_000, files=1, seconds=2.5),
        storage_event("checkpoint_uploaded", record.id, now - 120, bytes=MB300, total_bytes=GB125, seconds=3, taken_at=now - 125),
    ]  # fmt: skip
    market.run(market.server.master.store.events.append_many(events))
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/workloads/{record.id}")
    section = page.get_by_role("region", name="Data and checkpoints")
    last = page.locator("#checkpoint-last").inner_text()
    assert f"taken {when(now - 125)} UTC (2 min ago), 1.25 GB in all; 1 upload so far" == last, last
    assert page.locator("#checkpoint-restored").inner_text() == f"the checkpoint taken {when(now - 4e3)} UTC"
    assert "s3://checkpoints/counter/ at /checkpoint, uploaded every 1 min" in section.inner_text()
    assert "http://127.0.0.1:9000" in section.inner_text() and "datasets-rw" in section.inner_text()
    assert page.locator("#transfer-time").inner_text() == "13.5 s in all"
    rows = page.locator("#transfers tbody tr").all_inner_texts()
    assert len(rows) == 3 and "checkpoint uploaded" in rows[0] and "300 MB" in rows[0] and "100 MB/s" in rows[0]
    assert "checkpoint restored" in rows[2] and "1.20 GB" in rows[2] and "150 MB/s" in rows[2]
    assert page.locator("#storage-error").count() == 0
    events = page.get_by_role("table", name="The workload's events, oldest first").inner_text()
    assert f"checkpoint uploaded on agt-a10: 300 MB in 3.00 s (100 MB/s), taken {when(now - 125)} UTC" in events
    assert "taken_at" not in events  # the transfers in words, not as the report's fields
    shot(page, "checkpoint-state")
    failed = storage_event("upload_failed", record.id, now - 5, error="storage_unreachable: http://127.0.0.1:9000 did not answer")
    market.run(market.server.master.store.events.append(failed))
    page.reload()
    assert page.locator("#storage-error").inner_text().startswith("The latest upload failed: storage_unreachable")
    assert "upload failed" in page.locator("#transfers tbody tr").first.inner_text()
    shot(page, "upload-failed")
    market.run(market.server.master.store.events.append(storage_event("checkpoint_uploaded", record.id, now, bytes=MB300)))
    page.reload()
    assert "An earlier upload failed" in page.locator("#storage-error").inner_text()  # the data is safe again
    page.goto(f"{market.url}/console/workloads/{plain.id}")
    assert page.locator("#storage").count() == 0  # a workload that names no storage has no such section


def test_the_checkpoint_state_and_the_storage_block_reflow_on_a_375_px_wide_screen(market, browser, sign_in, shot):
    spec = WorkloadSpec(
        name="counter", image="python:3.12", checkpoint=CheckpointSpec(uri="s3://checkpoints/a-rather-long-prefix/for-a-run/"),
        storage=StorageAccess(credentials="datasets-rw"),
    )  # fmt: skip
    record = market.run(market.services.workloads.submit_workload("rita", spec))
    market.run(
        market.server.master.store.events.append(
            storage_event("checkpoint_uploaded", record.id, time.time(), bytes=5_000, total_bytes=5_000, seconds=0.01)
        )
    )
    context = browser.new_context(viewport={"width": 375, "height": 800})
    page = context.new_page()
    try:
        sign_in(page, "renter")
        page.goto(f"{market.url}/console/workloads/{record.id}")
        assert "none yet" not in page.locator("#checkpoint-last").inner_text()
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than the screen"
        shot(page, "workload-375px")
        page.goto(f"{market.url}/console/launch")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the launch form is {overflow} px wider than the screen"
        assert page.get_by_label("Checkpoint location").is_visible()
        shot(page, "launch-375px")
    finally:
        context.close()
