"""Issue 26 acceptance 5 on a real local grid: a gang whose host is lost is requeued as a whole, gets its network again
on the hosts left, and resumes from its checkpoint ("Work that survives its host", issue 25).

Real parts: the Master, a relay and three sandboxed process-runtime hosts as processes (simulated GPUs: none exists
here), each replica in a network namespace of its own with slirp4netns as its way out, Debian's nebula as every
replica's overlay client (started by the host's agent in the replica's namespace) and as the lighthouse and relay
(issued by ``write_lighthouse``, what the operator's ``idlegrid ca issue-lighthouse`` runs, from the Master's overlay
CA, run in a namespace of its own by the launcher: management/devgrid/lighthouse.py says why and how), and moto's S3
server on 127.0.0.1 for the checkpoints and outputs.

"A new network" here is the gang's overlay formed again on the hosts it lands on: its block, its replicas' ranks and
addresses stay the workload's (docs/overlay.md: a replica that moves keeps its rank and address), while each replica's
Nebula runs on its new host with a certificate the Master signed for that host's own key, and the replicas meet again
through it (rank 1 connects to MASTER_ADDR:MASTER_PORT served by rank 0). The certificate left with the lost host,
still valid for replica 1's address, is in every new replica's blocklist. Last, the lost host comes back and the
Master deletes the replica it left there.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.nebula import NebulaCertificate, decode_cert_pem, fingerprint, public_key_of_pem, verify
from tests.e2e.test_scheduler import SANDBOXED, wait_workload, workload
from tests.e2e.test_storage import checkpointed_step, hosts, new_bucket, outputs, starts, stored_renter, with_storage
from tests.support.grid import Grid, pid_alive, wait_for
from tests.support.lighthouse import LIGHTHOUSE_ADDRESS, lighthouse_unavailable, overlay_toml
from tests.support.s3 import S3Server

SYSTEM_PYTHON = "/usr/bin/python3"  # a sandboxed container's uid reads Debian's python, not the test's environment
_why = lighthouse_unavailable() or ("" if Path(SYSTEM_PYTHON).exists() else f"{SYSTEM_PYTHON} runs the replicas")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(_why), reason=_why or "runs")]

REPLICA = Path(__file__).resolve().parents[1] / "support" / "gang_replica.py"
STEPS = 60  # a step every 0.2 s
PERIOD_S = 1.0  # the checkpoint period: short, so a test sees several
MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "offer_sandboxed_hosts": True,
    "telemetry_s": 0.5,
    "requeue_offline_after_s": 3.0,
}


def master_toml(path: Path, lighthouse_endpoint: str, egress_allow: list[str]) -> Path:
    """MASTER_SETTINGS, the store the operator allows by name, and the lighthouse in ``[overlay]`` (TOML's tables:
    write_toml writes flat settings only)."""
    settings = {**MASTER_SETTINGS, "egress_allow": egress_allow}
    flat = "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
    path.write_text(flat + overlay_toml(LIGHTHOUSE_ADDRESS, lighthouse_endpoint))
    return path


@pytest.fixture
def grid(tmp_path: Path, s3: S3Server) -> Iterator[Grid]:
    g = Grid(tmp_path)
    g.egress_allow = [s3.allowed]  # moto on 127.0.0.1: the operator and the hosts' providers allow it by name
    try:
        endpoint = g.start_lighthouse().endpoint
        g.start_master("--config", str(master_toml(tmp_path / "master.toml", endpoint, g.egress_allow)))
        g.run_lighthouse()
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


def gang_spec(s3: S3Server, bucket: str, drop: Path, name: str) -> dict[str, Any]:
    shutil.copy(REPLICA, drop / REPLICA.name)
    return with_storage(
        s3,
        workload(name, f"exec {SYSTEM_PYTHON} {drop / REPLICA.name} {STEPS}", replicas=2, restart_policy="on_failure"),
        checkpoint={"uri": f"s3://{bucket}/{name}/ck/", "period_s": PERIOD_S},
        outputs=[{"uri": f"s3://{bucket}/{name}/out/", "path": "/out"}],
        stop_grace_s=10,
    )


def placement(w: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {a["replica"]: a for a in w["assignments"]}


def replica_certificate(grid: Grid, names: dict[str, str], assignment: dict[str, Any]) -> tuple[NebulaCertificate, bool, bytes]:
    """The certificate the replica's host runs its Nebula with, whether the grid's overlay CA signed it, and that
    host's own overlay public key (the one its agent sent in hello)."""
    agent_dir = grid.agent_dir(names[assignment["agent_id"]])
    workdir = Path(f"{agent_dir}-overlay") / assignment["container"]
    certificate = decode_cert_pem((workdir / "host.crt").read_text())
    ca = decode_cert_pem((grid.master_dir / "overlay-ca.crt").read_text())
    return certificate, verify(certificate, ca), public_key_of_pem((agent_dir / "overlay.pub").read_text())


def met(s3: S3Server, bucket: str, prefix: str, started_from: int) -> dict[str, Any]:
    body = s3.client().get_object(Bucket=bucket, Key=f"{prefix}met-from-{started_from}.json")["Body"].read()
    return dict(json.loads(body))


def test_a_gang_whose_host_is_lost_is_requeued_whole_meets_again_on_new_hosts_and_resumes_from_its_checkpoint(
    grid: Grid, s3: S3Server, drop: Path
) -> None:
    g = grid
    agents = hosts(g, 3)
    names = {agent_id: f"host-{n}" for n, agent_id in enumerate(agents)}
    bucket = new_bucket(s3)
    alice = stored_renter(g, s3, "alice")
    wid = alice.submit_workload(gang_spec(s3, bucket, drop, "gang"))["id"]
    first = wait_workload(alice, wid, "running", lambda w: w["state"] == "running", timeout=30)
    network = first["network"]["network"]
    addresses = {r["replica"]: r["address"] for r in first["network"]["replicas"]}
    before = placement(first)
    # Both replicas met over the overlay and count; each has checkpointed a few periods.
    for r in (0, 1):
        wait_for(lambda r=r: "met-from-0.json" in outputs(s3, bucket, f"gang/out/replica-{r}/"), 60, f"replica {r} to meet")
        wait_for(lambda r=r: checkpointed_step(s3, bucket, f"gang/ck/replica-{r}/") >= 10, 30, f"replica {r}'s checkpoints")
    assert met(s3, bucket, "gang/out/replica-1/", 0)["heard"] == f"rank 0 from 0 at {addresses[0]}"
    assert met(s3, bucket, "gang/out/replica-0/", 0)["heard"] == f"rank 1 from 0 at {addresses[1]}"
    # Each read its hostfile at the sandbox's fixed path, though its agent's state lies under pytest's 0700 directory.
    hostfile = f"{addresses[0]} slots=1\n{addresses[1]} slots=1\n"
    for r in (0, 1):
        first_met = met(s3, bucket, f"gang/out/replica-{r}/", 0)
        assert first_met["env"]["IDLEGRID_HOSTFILE"] == "/idlegrid/overlay/hostfile" and first_met["hostfile"] == hostfile

    lost = before[1]["agent_id"]  # replica 1's host goes, replica 0's stays
    # SIGKILL of the agent and its nebulas (its process group): no last upload, no goodbye. Its replica's process lives
    # on (process-runtime containers outlive their agent), off the overlay: its peers' addresses are fenced.
    agents[lost].kill()
    last = checkpointed_step(s3, bucket, "gang/ck/replica-1/")  # nothing uploads replica 1's checkpoint any more
    periodic = checkpointed_step(s3, bucket, "gang/ck/replica-0/")  # replica 0's, which its host goes on uploading

    moved = wait_workload(
        alice,
        wid,
        "running again on the hosts left",
        lambda w: w["state"] == "running" and w["attempts"] == 2 and lost not in {a["agent_id"] for a in w["assignments"]},
        timeout=60,
    )
    after = placement(moved)
    # Requeued as a whole: both replicas got new containers (the survivor's too), on the two hosts left.
    assert {a["agent_id"] for a in after.values()} == set(agents) - {lost}
    assert all(after[r]["container"] != before[r]["container"] for r in (0, 1)), (before, after)
    # Same block, ranks and addresses; each replica's Nebula runs with a certificate for its new host's own key.
    assert moved["network"]["network"] == network
    assert {r["replica"]: r["address"] for r in moved["network"]["replicas"]} == addresses
    now = time.time()
    for r, assignment in after.items():
        certificate, signed, host_key = replica_certificate(g, names, assignment)
        assert signed and certificate.ips == (f"{addresses[r]}/10",) and certificate.groups == (wid,), certificate
        assert certificate.not_before <= now < certificate.not_after
        assert certificate.public_key == host_key, f"replica {r}'s certificate is not for its new host's key"
    # The certificate left with the lost host (valid, naming replica 1's address) is blocked by every new replica.
    stale = Path(f"{g.agent_dir(names[lost])}-overlay") / before[1]["container"] / "host.crt"
    blocked = fingerprint(decode_cert_pem(stale.read_text())).hex()
    for assignment in after.values():
        workdir = Path(f"{g.agent_dir(names[assignment['agent_id']])}-overlay") / assignment["container"]
        assert blocked in json.loads((workdir / "nebula.json").read_text())["pki"]["blocklist"]

    # The gang met again over its re-formed network and resumed: the lost replica from its last periodic checkpoint,
    # the survivor from the checkpoint it wrote at its SIGTERM (at least as far as the last periodic one).
    # Each replica's agent reports how it reaches its peer on the new hosts (direct or through the relay), as the
    # workload's page shows it.
    reached = wait_workload(
        alice,
        wid,
        "its replicas reaching each other again",
        lambda w: all(addresses[1 - r["replica"]] in r["peers"] for r in w["network"]["replicas"]),
        timeout=30,
    )
    assert reached["state"] == "running" and reached["attempts"] == 2, reached
    for view in reached["network"]["replicas"]:
        assert set(view["peers"].values()) <= {"direct", "relay"}, view
    done = wait_workload(alice, wid, "succeeded", lambda w: w["state"] == "succeeded", timeout=90)
    for r in (0, 1):
        prefix = f"gang/out/replica-{r}/"
        names_out = wait_for(lambda p=prefix: (o := outputs(s3, bucket, p)) and "result.txt" in o and o, 30, f"{prefix}")
        (fresh, _), (resumed, restored) = starts(names_out)
        assert fresh == 0 and restored == 1 and 0 < resumed < STEPS, names_out
        if r == 1:  # lost with its host: it lost what came after its last periodic checkpoint, nothing before
            assert resumed == last, (names_out, last)
        else:  # stopped by the requeue: its checkpoint at SIGTERM, at least as far as the last periodic one
            assert resumed >= periodic, (names_out, periodic)
        body = s3.client().get_object(Bucket=bucket, Key=f"{prefix}result.txt")["Body"].read()
        assert body == f"done {STEPS}\n".encode()
        again = met(s3, bucket, prefix, resumed)
        assert again["env"]["MASTER_ADDR"] == addresses[0] and again["env"]["IDLEGRID_OVERLAY_ADDR"] == addresses[r]
        assert again["hostfile"] == hostfile, again  # the same ranks and addresses, on its new host
        peer = 1 - r
        peer_from = [s for s, restored in starts(outputs(s3, bucket, f"gang/out/replica-{peer}/")) if restored]
        assert again["heard"] == f"rank {peer} from {peer_from[0]} at {addresses[peer]}", again
    assert done["network"]["network"] == network

    # The lost host comes back: the Master deletes its stray replica, whose overlay directory and slirp4netns go too.
    stray = before[1]["container"]
    lost_dir = g.agent_dir(names[lost])
    record = json.loads((lost_dir / "containers" / f"{stray}.json").read_text())
    g.run_agent(names[lost], simulate="a10:1", env=SANDBOXED)
    wait_for(lambda: not (lost_dir / "containers" / f"{stray}.json").exists(), 30, "the stray replica to be deleted")
    assert not (Path(f"{lost_dir}-overlay") / stray).exists()
    wait_for(lambda: not pid_alive(record["slirp_pid"]), 10, "its slirp4netns to end")  # (SIGKILLed, not yet reaped)
