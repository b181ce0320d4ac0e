"""A workload's object storage on the renter's pages (docs/storage.md): the launch and rent forms' storage block, and
what a workload's page says of its data.

The form block reads inputs, outputs, the checkpoint (location, container path, period), the store's endpoint and
region, the credentials secret (one of the account's, by name) and the stop grace into the spec's fields exactly as
``idlegrid workload submit --input/--output/--checkpoint/--checkpoint-period/--storage-*/--stop-grace`` builds them
(management/cli/workloads.py ``_storage_flags``); each problem is kept beside its field (``FormErrors``). The spec is
then checked as a submit checks it (``check_storage``: paths that overlap, a secret the account lacks), its message
put beside the field it names. Pure but for ``with_storage``, which reads the account's secret names.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from common.storage import (
    DEFAULT_CHECKPOINT_PATH,
    MAX_CHECKPOINT_PERIOD_S,
    MIN_CHECKPOINT_PERIOD_S,
    Endpoint,
    InvalidLocation,
    Region,
    clean_path,
    split_uri,
)
from management.console.forms import FormErrors, FormFields, number, text
from management.console.rendering import TemplateContext
from management.console.templating import when
from management.http.keys import SERVICES_KEY
from management.workloads.spec import InvalidWorkloadSpec
from management.workloads.storage import STORAGE_EVENT_PREFIX, StorageSummary, check_storage
from master.port import EventRecord, SpecJson, WorkloadSpec

MAX_LOCATIONS = 16  # of each kind, as the spec takes them
MIN_STOP_GRACE_S, MAX_STOP_GRACE_S = 1.0, 600.0  # the spec's bounds; the grid's policy may bound it lower still
LOCATION_HELP = "one per line: s3://BUCKET/KEY /path/in/container (or URI:PATH as on the command line)"


@dataclass(frozen=True)
class StorageChoices:
    """What the form's storage block offers: the account's secrets by name (for the credentials)."""

    secret_names: list[str]


def _location(line: str) -> dict[str, str]:
    """``s3://b/k /path`` or the command line's ``s3://b/k:/path`` -> {"uri", "path"}; InvalidLocation naming why."""
    parts = line.split()
    if len(parts) == 2:
        uri, path = parts
    elif len(parts) == 1:
        at = line.rfind(":/")  # the ':' that starts an absolute path, as the command line splits it
        if at <= len("s3:/"):
            raise InvalidLocation(f"{line[:80]!r}: write the location and the path in the container, e.g. s3://bucket/data /data")
        uri, path = line[:at], line[at + 1 :]
    else:
        raise InvalidLocation(f"{line[:80]!r}: one location and one path per line")
    split_uri(uri)
    clean_path(path)
    return {"uri": uri, "path": path}


def _locations(form: FormFields, field: str, errors: FormErrors, *, label: str) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    lines = [line.strip() for line in text(form, field, max_length=64 * 1024).splitlines()]
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            found.append(_location(line))
        except InvalidLocation as exc:
            errors.add(field, f"{label}, line {n}: {exc}")
    if len(found) > MAX_LOCATIONS:
        errors.add(field, f"{label}: at most {MAX_LOCATIONS}, not {len(found)}")
    return found


def _typed(value: str, kind: Any, field: str, errors: FormErrors, message: str) -> None:
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError:
        errors.add(field, message)


def storage_fields(form: FormFields, errors: FormErrors, choices: StorageChoices) -> SpecJson:
    """The spec's storage fields the form's block describes (none when it is left empty), as the command line's flags
    build them; ``errors`` gets each problem beside its field."""
    spec: SpecJson = {}
    inputs = _locations(form, "inputs", errors, label="inputs")
    outputs = _locations(form, "outputs", errors, label="outputs")
    if inputs:
        spec["inputs"] = inputs
    if outputs:
        spec["outputs"] = outputs
    checkpoint_uri, checkpoint_path = text(form, "checkpoint_uri", max_length=1100), text(form, "checkpoint_path", max_length=600)
    period = number(
        form, "checkpoint_period", errors, label="checkpoint period", low=MIN_CHECKPOINT_PERIOD_S, high=MAX_CHECKPOINT_PERIOD_S
    )
    if checkpoint_uri:
        try:
            split_uri(checkpoint_uri)
            spec["checkpoint"] = {"uri": checkpoint_uri, "path": checkpoint_path or DEFAULT_CHECKPOINT_PATH}
        except InvalidLocation as exc:
            errors.add("checkpoint_uri", f"checkpoint: {exc}")
        if checkpoint_path:
            try:
                clean_path(checkpoint_path)
            except InvalidLocation as exc:
                errors.add("checkpoint_path", f"checkpoint path: {exc}")
        if period is not None and "checkpoint" in spec:
            spec["checkpoint"]["period_s"] = period
    elif checkpoint_path or period is not None:
        errors.add("checkpoint_uri", "checkpoint: a path or period needs the checkpoint's location (s3://BUCKET/PREFIX/)")
    access: SpecJson = {}
    credentials = text(form, "storage_credentials", max_length=100)
    if credentials:
        if credentials not in choices.secret_names:
            errors.add("storage_credentials", f"credentials: you have no secret named {credentials[:70]!r} (any more?)")
        access["credentials"] = credentials
    elif inputs or outputs or checkpoint_uri:
        errors.add(
            "storage_credentials",
            "credentials: choose the secret that holds the store's keys (ACCESS_KEY_ID:SECRET_ACCESS_KEY; store one on "
            "the Secrets page)",
        )
    endpoint = text(form, "storage_endpoint", max_length=600)
    if endpoint:
        _typed(
            endpoint,
            Endpoint,
            "storage_endpoint",
            errors,
            f"endpoint: write it as https://HOST[:PORT], not {endpoint[:60]!r}",
        )
        access["endpoint"] = endpoint
    region = text(form, "storage_region", max_length=100)
    if region:
        _typed(
            region,
            Region,
            "storage_region",
            errors,
            f"region: lowercase letters, digits, '-' (us-east-1), not {region[:40]!r}",
        )
        access["region"] = region
    if access:
        spec["storage"] = access
    grace = number(form, "stop_grace", errors, label="stop grace", low=MIN_STOP_GRACE_S, high=MAX_STOP_GRACE_S)
    if grace is not None:
        spec["stop_grace_s"] = grace
    return spec


def field_of(message: str) -> str:
    """The storage field a spec check's message is about (``check_storage`` starts each with what it names)."""
    for prefix, field in (
        ("inputs", "inputs"),
        ("outputs", "outputs"),
        ("checkpoint", "checkpoint_uri"),
        ("storage.credentials", "storage_credentials"),
        ("storage.endpoint", "storage_endpoint"),
        ("storage.region", "storage_region"),
        ("storage", "storage_credentials"),
        ("stop_grace_s", "stop_grace"),
        ("no secret named", "storage_credentials"),
    ):
        if message.startswith(prefix):
            return field
    return "form"


def apply_storage(spec: WorkloadSpec, fields: SpecJson, secret_names: Collection[str], errors: FormErrors) -> WorkloadSpec | None:
    """``spec`` with the block's fields, checked as a submit checks them; None with ``errors`` filled otherwise."""
    if not fields:
        return spec
    try:
        stored = msgspec.convert(msgspec.to_builtins(spec) | fields, WorkloadSpec)
        check_storage(stored, secret_names)
    except msgspec.ValidationError as exc:
        message = str(exc)
        where = message.rpartition("`$.")[2].rstrip("`")
        errors.add(field_of(where), f"{where}: {message.partition(' - at ')[0]}")
        return None
    except InvalidWorkloadSpec as exc:
        errors.add(field_of(str(exc)), str(exc))
        return None
    return stored


async def storage_choices(request: web.Request, account: str) -> StorageChoices:
    return StorageChoices(secret_names=[s.name for s in await request.app[SERVICES_KEY].secrets.list(account)])


async def with_storage(
    request: web.Request, account: str, spec: WorkloadSpec | None, form: FormFields, errors: FormErrors
) -> WorkloadSpec | None:
    """The form's spec with its storage block: the block is read even when the rest of the form has errors (so that
    all are shown at once); None when there is any."""
    choices = await storage_choices(request, account)
    fields = storage_fields(form, errors, choices)
    if spec is None or errors:
        return None
    return apply_storage(spec, fields, choices.secret_names, errors)


# --- a workload's page -----------------------------------------------------------------------------------------


def size(n: int | None) -> str:
    """Bytes as people read them: "512 bytes", "3.4 MB", "1.20 GB" (powers of 1000, as stores bill)."""
    if n is None:
        return "-"
    if n < 1000:
        return f"{n} byte{'' if n == 1 else 's'}"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        if n < scale * 1000 or unit == "TB":
            shown = n / scale
            return f"{shown:.{2 if shown < 10 else 1 if shown < 100 else 0}f} {unit}"
    return f"{n} bytes"  # not reached


TRANSFER_WORDS = {
    "inputs_fetched": "inputs fetched",
    "checkpoint_restored": "checkpoint restored",
    "checkpoint_uploaded": "checkpoint uploaded",
    "outputs_uploaded": "outputs uploaded",
    "upload_failed": "upload failed",
}


def transfer_rate(bytes_: int, seconds: float) -> str:
    """ "12.5 MB/s", or "" when too short to say."""
    return f"{size(round(bytes_ / seconds))}/s" if seconds >= 0.001 and bytes_ else ""


def storage_section(spec: WorkloadSpec, summary: StorageSummary | None) -> TemplateContext | None:
    """What a workload's page shows of its data: where it lives (from the spec), the last checkpoint, what the latest
    run resumed from, the time spent moving data, the last failure and the latest transfers (newest first)."""
    if summary is None:
        return None
    latest = summary.recent[-1] if summary.recent else None
    return {
        # the latest failure, and whether the latest transfer is that failure (if not, the data moved again since)
        "failure": summary.last_error,
        "failed_last": latest is not None and bool(latest.error),
        "inputs": spec.inputs,
        "outputs": spec.outputs,
        "checkpoint": spec.checkpoint,
        "access": spec.storage,
        "stop_grace_s": spec.stop_grace_s,
        "summary": summary,
        "checkpoint_size": size(summary.checkpoint_bytes),
        "recent": [
            {
                "at": t.at,
                "what": TRANSFER_WORDS.get(t.what, t.what),
                "host": t.host,
                "size": "-" if t.error and not t.bytes else size(t.bytes),
                "seconds": t.seconds,
                "rate": transfer_rate(t.bytes, t.seconds),
                "error": t.error,
            }
            for t in reversed(summary.recent)
        ],
    }


def transfer_event(event: EventRecord) -> str:
    """A ``storage.*`` event in words for the workload's events: "checkpoint uploaded on agt-1: 300 MB in 3.00 s
    (100 MB/s), taken 2026-11-27 09:30:13 UTC"."""
    d = event.data
    said = f"{TRANSFER_WORDS.get(event.kind.removeprefix(STORAGE_EVENT_PREFIX), event.kind)} on {d.get('agent_id', '?')}"
    moved, seconds = int(d.get("bytes", 0)), float(d.get("seconds", 0.0))
    if moved or seconds:
        rate = transfer_rate(moved, seconds)
        said += f": {size(moved)} in {seconds:.2f} s" + (f" ({rate})" if rate else "")
    if d.get("cached"):
        said += f", {size(int(d['cached']))} already in the host's cache"
    if d.get("taken_at"):
        said += f", taken {when(float(d['taken_at']))} UTC"
    if d.get("error"):
        said += f": {d['error']}"
    return said
