"""The launch form's storage block and the workload page's data section, pure (management/console/workload_storage.py):
the spec the form builds is the one the command line's flags build; each bad value is said beside its field.

The form in Chromium: tests/console/test_storage_pages.py."""

from __future__ import annotations

import msgspec
import pytest

from management.cli.main import build_parser
from management.cli.workloads import spec_from
from management.console.forms import FormErrors
from management.console.workload_storage import (
    StorageChoices,
    apply_storage,
    size,
    storage_fields,
    storage_section,
    transfer_event,
)
from management.workloads.storage import StorageSummary, Transfer
from master.port import EventRecord, WorkloadSpec

CHOICES = StorageChoices(secret_names=["datasets-rw", "other"])
BASE = WorkloadSpec(name="train", image="python:3.12")


def form_spec(form: dict[str, str], names: list[str] | None = None) -> tuple[WorkloadSpec | None, FormErrors]:
    errors = FormErrors()
    fields = storage_fields(form, errors, CHOICES)
    spec = None if errors else apply_storage(BASE, fields, names or CHOICES.secret_names, errors)
    return spec, errors


def cli_spec(*flags: str) -> WorkloadSpec:
    args = build_parser().parse_args(["workload", "submit", "--name", "train", "--image", "python:3.12", *flags])
    return msgspec.convert(spec_from(args), WorkloadSpec)


def test_the_form_builds_the_spec_the_command_lines_flags_build():
    spec, errors = form_spec(
        {
            "inputs": "s3://datasets/imagenet/ /data\r\ns3://models/base.safetensors:/weights\r\n\r\n",
            "outputs": "s3://results/run-1/ /out",
            "checkpoint_uri": "s3://checkpoints/run-1/",
            "checkpoint_path": "/ckpt",
            "checkpoint_period": "60",
            "storage_credentials": "datasets-rw",
            "storage_endpoint": "http://127.0.0.1:9000",
            "storage_region": "eu-west-1",
            "stop_grace": "90",
        }
    )
    assert not errors, errors
    assert spec == cli_spec(
        "--input", "s3://datasets/imagenet/:/data",
        "--input", "s3://models/base.safetensors:/weights",
        "--output", "s3://results/run-1/:/out",
        "--checkpoint", "s3://checkpoints/run-1/:/ckpt",
        "--checkpoint-period", "60",
        "--storage-credentials", "datasets-rw",
        "--storage-endpoint", "http://127.0.0.1:9000",
        "--storage-region", "eu-west-1",
        "--stop-grace", "90",
    )  # fmt: skip
    assert spec is not None and spec.checkpoint is not None and spec.checkpoint.period_s == 60


def test_a_checkpoint_without_a_path_goes_to_the_default_directory_as_on_the_command_line():
    spec, errors = form_spec({"checkpoint_uri": "s3://checkpoints/run-1/", "storage_credentials": "datasets-rw"})
    assert not errors and spec == cli_spec("--checkpoint", "s3://checkpoints/run-1/", "--storage-credentials", "datasets-rw")
    assert spec is not None and spec.checkpoint is not None and spec.checkpoint.path == "/checkpoint"


def test_an_empty_block_leaves_the_spec_as_it_was():
    spec, errors = form_spec({"inputs": "", "outputs": "  ", "storage_credentials": ""})
    assert not errors and spec == BASE


@pytest.mark.parametrize(
    ("form", "field", "says"),
    [
        (
            {"inputs": "http://bucket/key /data", "storage_credentials": "other"},
            "inputs",
            "line 1: 'http://bucket/key' is not an s3://",
        ),
        ({"inputs": "s3://ok-bucket/k /data\ns3://Bad_Bucket/k /x", "storage_credentials": "other"}, "inputs", "line 2"),
        ({"outputs": "s3://results/run-1/", "storage_credentials": "other"}, "outputs", "write the location and the path"),
        ({"outputs": "s3://results/ /out/../etc", "storage_credentials": "other"}, "outputs", "no '..'"),
        ({"inputs": "s3://datasets/a /data"}, "storage_credentials", "choose the secret"),
        ({"checkpoint_uri": "s3://ck/", "storage_credentials": "gone"}, "storage_credentials", "no secret named 'gone'"),
        ({"checkpoint_period": "60"}, "checkpoint_uri", "needs the checkpoint's location"),
        (
            {"checkpoint_uri": "s3://ck/", "checkpoint_period": "0.1", "storage_credentials": "other"},
            "checkpoint_period",
            "from 1 to 86400",
        ),
        ({"checkpoint_uri": "s3://ck/", "checkpoint_path": "/", "storage_credentials": "other"}, "checkpoint_path", "not '/'"),
        ({"storage_endpoint": "minio:9000"}, "storage_endpoint", "https://HOST[:PORT]"),
        ({"storage_region": "EU West"}, "storage_region", "lowercase letters"),
        ({"stop_grace": "3600"}, "stop_grace", "from 1 to 600"),
    ],
)  # fmt: skip
def test_bad_input_is_said_beside_its_field(form, field, says):
    spec, errors = form_spec(form)
    assert spec is None and says in errors.get(field, ""), errors


def test_paths_that_overlap_are_refused_as_a_submit_refuses_them_beside_the_field_they_name():
    spec, errors = form_spec(
        {"inputs": "s3://datasets/a /data", "outputs": "s3://results/ /data/out", "storage_credentials": "other"}
    )
    assert spec is None and "overlaps inputs[0]" in errors["outputs"], errors


def test_a_secret_deleted_since_the_form_was_shown_is_refused_beside_the_credentials():
    spec, errors = form_spec({"inputs": "s3://datasets/a /data", "storage_credentials": "datasets-rw"}, names=["other"])
    assert spec is None and "no secret named 'datasets-rw'" in errors["storage_credentials"], errors


def test_sizes_read_as_people_read_them():
    assert [size(n) for n in (None, 1, 999, 1000, 3_400_000, 1_200_000_000, 52_000_000_000)] == [
        "-", "1 byte", "999 bytes", "1.00 kB", "3.40 MB", "1.20 GB", "52.0 GB",
    ]  # fmt: skip


def test_the_workload_page_shows_the_newest_transfer_first_with_its_rate():
    summary = StorageSummary(
        checkpoint_at=100.0,
        checkpoint_bytes=2_000_000,
        recent=[
            Transfer(90.0, "checkpoint_restored", "agt-1", 2_000_000, 0.5),
            Transfer(100.0, "checkpoint_uploaded", "agt-1", 1_000_000, 0.25),
        ],
    )
    section = storage_section(BASE, summary)
    assert section is not None and section["checkpoint_size"] == "2.00 MB"
    assert [(r["what"], r["rate"]) for r in section["recent"]] == [
        ("checkpoint uploaded", "4.00 MB/s"),
        ("checkpoint restored", "4.00 MB/s"),
    ]
    assert storage_section(BASE, None) is None  # a workload that names no storage has no such section


def test_a_storage_event_reads_as_words_in_the_workloads_events():
    uploaded = EventRecord(
        ts=100.0,
        kind="storage.checkpoint_uploaded",
        subject="wl-1",
        data={"agent_id": "agt-1", "what": "checkpoint_uploaded", "bytes": 300_000_000, "seconds": 3.0, "taken_at": 0.5},
    )
    assert transfer_event(uploaded) == (
        "checkpoint uploaded on agt-1: 300 MB in 3.00 s (100 MB/s), taken 1970-01-01 00:00:00 UTC"
    )
    fetched = EventRecord(
        ts=100.0,
        kind="storage.inputs_fetched",
        subject="wl-1",
        data={"agent_id": "agt-1", "bytes": 0, "cached": 200_000_000, "seconds": 0.2},
    )
    assert transfer_event(fetched) == "inputs fetched on agt-1: 0 bytes in 0.20 s, 200 MB already in the host's cache"
    failed = EventRecord(ts=1.0, kind="storage.upload_failed", subject="wl-1", data={"agent_id": "agt-1", "error": "no bucket"})
    assert transfer_event(failed) == "upload failed on agt-1: no bucket"
