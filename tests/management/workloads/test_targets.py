"""At submit, a workload's storage endpoint and image registry must be public, or allowed by the operator by name
(the Master's egress_allow): the renter is told which field and what to change, and nothing is queued. Names resolve
through a resolver the test gives (no real DNS); nothing connects anywhere."""

from __future__ import annotations

import dataclasses
import time

import msgspec
import pytest

from common.storage import StorageAccess, StorageMount
from management.workloads.book import WorkloadBook
from management.workloads.spec import InvalidWorkloadSpec
from master.config import MasterConfig
from master.master import Master
from master.records import WorkloadSpec
from tests.management.workloads.test_runner import spec
from tests.support.egress import resolving


def book(master: Master, egress_allow: list[str] | None = None) -> WorkloadBook:
    names = resolving({"rebind.example": "10.0.0.1", "s3.example": "93.184.216.34"})
    rule = dataclasses.replace(MasterConfig(egress_allow=egress_allow or []).egress_rule(), resolver=names)
    return WorkloadBook(master.store, master, policy=master.policy, egress=rule)


def submitted(fields: dict) -> WorkloadSpec:
    image = fields.pop("image", None)
    made = spec(**fields)
    return made if image is None else msgspec.structs.replace(made, image=image)


def stored(endpoint: str) -> dict:
    return {
        "inputs": [StorageMount(uri="s3://data/in/", path="/in")],
        "storage": StorageAccess(credentials="keys", endpoint=endpoint),
    }


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (stored("http://127.0.0.1:9000"), "storage.endpoint: storage endpoint http://127.0.0.1:9000: 127.0.0.1 is 127.0.0.1"),
        (stored("http://0x7f.1:9000"), "storage.endpoint:"),
        (stored("http://169.254.169.254"), "link-local"),
        (stored("https://rebind.example"), "rebind.example resolves to 10.0.0.1: a private address"),
        ({"image": "10.1.2.3:5000/team/app:1"}, "image: image '10.1.2.3:5000/team/app:1': registry 10.1.2.3:5000"),
        ({"image": "localhost:5000/app"}, "localhost always resolves to a loopback address"),
        ({"image": "rebind.example/app:1"}, "rebind.example resolves to 10.0.0.1"),
    ],
)
async def test_a_private_storage_endpoint_or_registry_is_refused_at_submit_saying_what_to_change(master, fields, said):
    workloads = book(master)
    await workloads.load()
    await master.secrets.create("alice", "keys", "AKIA:secret")
    with pytest.raises(InvalidWorkloadSpec) as refused:
        await workloads.submit("alice", submitted(dict(fields)), time.time())
    assert said in str(refused.value)
    assert "name a target on a public address, or ask the operator to allow" in str(refused.value)
    assert "egress_allow in the Master's config" in str(refused.value)
    assert workloads.open_workloads() == []


async def test_public_targets_and_those_the_operator_allows_by_name_are_accepted(master):
    workloads = book(master, ["127.0.0.1:9000", "rebind.example"])
    await workloads.load()
    await master.secrets.create("alice", "keys", "AKIA:secret")
    for fields in (
        stored("https://s3.example"),
        stored("http://127.0.0.1:9000"),
        stored("https://rebind.example:8443"),
        {"image": "rebind.example/app:1"},
        {"image": "busybox"},
    ):
        await workloads.submit("alice", submitted(dict(fields)), time.time())
    assert len(workloads.open_workloads()) == 5
    with pytest.raises(InvalidWorkloadSpec, match="127.0.0.1:9001"):
        await workloads.submit("alice", submitted(stored("http://127.0.0.1:9001")), time.time())  # another port
