"""What a workload's replica becomes on its host: the typed container spec, and the body its create command carries."""

from __future__ import annotations

from common.containers import ContainerSpec, RegistryAuth, parse_create_spec, wire_spec
from management.workloads.spec import container_name, container_spec, workload_of
from master.records import Assignment, ReplicaSpec, WorkloadRecord, WorkloadSpec

WL = "wl-00000000000000aa"


def record(**fields: object) -> WorkloadRecord:
    spec = WorkloadSpec(name="train", image="busybox", replica=ReplicaSpec(gpus=1, **fields.pop("replica", {})), **fields)  # type: ignore[arg-type]
    return WorkloadRecord(id=WL, account="alice", spec=spec, state="scheduled", created_at=0.0, queued_at=0.0)


def placed(replica: int = 0) -> Assignment:
    return Assignment(replica=replica, agent_id="agt-a", units=["GPU-1", "GPU-2"], container=container_name(WL, replica, 1))


def test_a_replicas_container_spec_carries_what_the_renter_asked_and_what_was_placed():
    auth = RegistryAuth(username="me", password="s3cret")
    rec = record(
        command=["python", "train.py"],
        env={"TOKEN": "s3cret"},
        labels={"team": "ml"},
        ports=[8888],
        registry_auth=auth,
        replica={"cpu_cores": 4.0, "ram_mib": 8192},
    )
    spec = container_spec(rec, placed(1))
    assert spec == ContainerSpec(
        name=f"{WL}-r1-a1",
        image="busybox",
        command=["python", "train.py"],
        env={"TOKEN": "s3cret"},
        gpus=["GPU-1", "GPU-2"],
        labels={"team": "ml"},
        workload_id=WL,
        replica=1,
        ports=[8888],
        cpus=4.0,
        memory_mib=8192,
        registry_auth=auth,
    )
    assert parse_create_spec(wire_spec(spec)) == spec  # the agent reads back what was sent


def test_the_create_body_leaves_out_what_is_at_its_default_so_an_older_agent_takes_it():
    """ContainerSpec refuses unknown fields: an agent from before ports or registry credentials existed refuses a body
    naming them, even empty, so a body names only what differs from the default (as the hand-built dict did for ports)."""
    body = wire_spec(container_spec(record(), placed()))
    assert body == {
        "name": f"{WL}-r0-a1",
        "image": "busybox",
        "gpus": ["GPU-1", "GPU-2"],
        "workload_id": WL,
        "replica": 0,
    }


def test_a_body_as_an_older_master_built_it_parses_to_the_same_spec():
    old = {
        "name": f"{WL}-r0-a1",
        "image": "busybox",
        "command": [],
        "env": {},
        "gpus": ["GPU-1", "GPU-2"],
        "labels": {},
        "workload_id": WL,
        "replica": 0,
    }
    assert parse_create_spec(old) == container_spec(record(), placed())


def test_a_container_name_tells_its_workload_and_other_names_tell_none():
    assert workload_of(container_name(WL, 3, 2)) == WL
    assert workload_of("someone-elses") is None and workload_of(f"{WL}-r0") is None
