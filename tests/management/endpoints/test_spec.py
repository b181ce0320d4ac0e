"""The endpoint's records (management/endpoints/spec.py): the scaling policy refused by the autoscaler's own checks,
the request bounds, and the workload each worker is."""

from __future__ import annotations

import msgspec
import pytest

from management.endpoints.autoscaler import ScalingPolicy
from management.endpoints.spec import EndpointRecord, EndpointScaling, EndpointSpec, hash_key, new_invocation_key


def decode(**fields: object) -> EndpointSpec:
    return msgspec.json.decode(msgspec.json.encode({"name": "echo", "image": "busybox"} | fields), type=EndpointSpec)


def test_the_scaling_fields_make_the_autoscaler_s_policy() -> None:
    spec = decode(scaling={"min_workers": 1, "max_workers": 3, "idle_timeout_s": 5, "target_queue_delay_s": 2, "concurrency": 4})
    assert spec.scaling.policy() == ScalingPolicy(
        min_workers=1, max_workers=3, idle_timeout_s=5.0, target_queue_delay_s=2.0, concurrency=4
    )
    assert decode().scaling == EndpointScaling()  # scale to zero, one worker, one request at a time


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"scaling": {"min_workers": 2, "max_workers": 1}}, "min_workers (2) must not exceed max_workers (1)"),
        ({"scaling": {"concurrency": 0}}, "scaling.concurrency"),
        ({"scaling": {"max_workers": 101}}, "scaling.max_workers"),
        ({"scaling": {"warm": 1}}, "warm"),
        ({"execution_timeout_s": 100, "ttl_s": 10}, "execution_timeout_s (100) must not exceed ttl_s (10)"),
        ({"max_retries": 11}, "max_retries"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_a_bad_spec_does_not_decode_and_the_error_names_the_field(fields: dict[str, object], says: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        decode(**fields)


def test_each_worker_is_one_replica_with_no_network_that_is_not_restarted_in_place() -> None:
    spec = decode(
        command=["python", "h.py"],
        env={"A": "${secret:a}"},
        replica={"gpus": 2, "models": ["h100-sxm"]},
        constraints={"allow_process_runtime": True},
        registry_auth={"username": "u", "password": "p"},
        priority="high",
    )
    worker = spec.worker_spec()
    assert (worker.replicas, worker.network, worker.restart_policy) == (1, "none", "never")
    assert (worker.name, worker.image, worker.command, worker.env) == (
        "echo",
        "busybox",
        ["python", "h.py"],
        {"A": "${secret:a}"},
    )
    assert worker.replica == spec.replica and worker.constraints == spec.constraints and worker.priority == "high"
    assert worker.registry_auth == spec.registry_auth


def test_a_record_round_trips_and_a_key_is_stored_by_its_hash_alone() -> None:
    record = EndpointRecord(id="ep-1", account="ana", spec=decode(), created_at=1.0, updated_at=2.0)
    assert msgspec.json.decode(msgspec.json.encode(record), type=EndpointRecord) == record
    key_id, key = new_invocation_key()
    assert key_id.startswith("epk-") and key.startswith("igek_") and len(key) > 40
    assert hash_key(key) != key and len(hash_key(key)) == 64 and hash_key(key) == hash_key(key)
