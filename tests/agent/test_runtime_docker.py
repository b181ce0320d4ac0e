"""The Docker-API runtime, against the real Podman Docker-compatible service."""

import asyncio
import time

import pytest

from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.runtime import open_runtime
from agent.runtime.docker import DockerRuntime
from common.containers import (
    LABEL_AGENT_ID,
    LABEL_COMMAND_ID,
    LABEL_NAME,
    LABEL_RENTAL_ID,
    LABEL_REPLICA,
    LABEL_WORKLOAD_ID,
    ContainerSpec,
)
from common.errors import ConfigError, RuntimeFailure
from common.pki import CommandSigner, CommandVerifier
from common.wire import Command, CommandBody, signing_bytes

pytestmark = pytest.mark.podman
MIB = 1024 * 1024


@pytest.fixture
async def runtime(podman):
    rt = DockerRuntime(podman.socket_path)
    yield rt
    await rt.close()
    podman.podman("rm", "--all", "--force", "--time", "0")  # whatever a failed test left running


def spec(podman, name, **fields):
    return ContainerSpec(name=name, image=podman.image, **{"command": ["sleep", "300"], **fields})


def agent_labels(command_id, **extra):
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1", **extra}


async def test_a_container_runs_with_the_specs_limits_hardening_and_labels(runtime, podman):
    job = spec(podman, "limits", cpus=0.5, memory_mib=64, env={"MODE": "train"}, labels={"team": "vision"})
    info = await runtime.create(job, labels=agent_labels("cmd-1", **{LABEL_RENTAL_ID: "rent-7"}))

    assert info.state == "running" and info.name == "limits" and info.runtime == "docker"
    raw = podman.inspect("limits")
    host = raw["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 64 * MIB
    assert host["Privileged"] is False
    assert "no-new-privileges" in host["SecurityOpt"]
    assert "NET_RAW" in host["CapDrop"] and "MKNOD" in host["CapDrop"]
    assert raw["Config"]["Labels"] == {
        "team": "vision",
        LABEL_COMMAND_ID: "cmd-1",
        LABEL_AGENT_ID: "agt-1",
        LABEL_RENTAL_ID: "rent-7",
        LABEL_NAME: "limits",
    }
    assert "MODE=train" in raw["Config"]["Env"]
    assert raw["State"]["Running"] is True
    assert raw["Config"]["Cmd"] == ["sleep", "300"]


def test_a_renter_cannot_set_the_agents_own_labels(podman):
    with pytest.raises(ValueError, match="reserved"):
        spec(podman, "spoof", labels={LABEL_RENTAL_ID: "someone-elses", "team": "x"})


async def test_creating_twice_under_one_command_id_returns_the_same_container(runtime, podman):
    first = await runtime.create(spec(podman, "twice"), labels=agent_labels("cmd-2"))
    again = await runtime.create(spec(podman, "twice"), labels=agent_labels("cmd-2"))
    assert again.id == first.id and again.state == "running"
    _, listed = podman.api("GET", '/containers/json?all=true&filters={"name":["twice"]}')
    assert len(listed) == 1


async def test_a_name_taken_by_another_command_is_refused(runtime, podman):
    await runtime.create(spec(podman, "taken"), labels=agent_labels("cmd-3"))
    with pytest.raises(RuntimeFailure, match="'taken' already exists.*command cmd-3"):
        await runtime.create(spec(podman, "taken"), labels=agent_labels("cmd-4"))


async def test_a_restarted_agent_finds_its_containers_by_command_id_and_lists_only_its_own(runtime, podman):
    await runtime.create(spec(podman, "findme"), labels=agent_labels("cmd-5"))
    podman.podman("create", "--name", "not-ours", podman.image)  # the provider's own container: no idlegrid labels

    restarted = DockerRuntime(podman.socket_path)
    try:
        found = await restarted.find(LABEL_COMMAND_ID, "cmd-5")
        assert [c.name for c in found] == ["findme"]
        assert found[0].state == "running"
        assert await restarted.find(LABEL_COMMAND_ID, "cmd-never") == []
        assert [c.name for c in await restarted.list()] == ["findme"]
    finally:
        await restarted.close()


async def test_delete_stops_and_removes_the_container(runtime, podman):
    created = await runtime.create(spec(podman, "doomed"), labels=agent_labels("cmd-6"))
    deleted = await runtime.delete("doomed", timeout_s=1)
    assert deleted.id == created.id
    assert deleted.state == "removed"
    assert deleted.exit_code == 137  # sleep as PID 1 ignores SIGTERM, so the engine killed it after the timeout
    assert podman.inspect("doomed") is None
    assert await runtime.inspect("doomed") is None


async def test_deleting_an_unknown_name_returns_none(runtime):
    assert await runtime.delete("never-was", timeout_s=0) is None


async def test_a_finished_container_reports_its_exit_code(runtime, podman):
    await runtime.create(spec(podman, "quitter", command=["sh", "-c", "exit 3"]), labels=agent_labels("cmd-7"))
    info = await runtime.inspect("quitter")
    for _ in range(100):
        if info.state == "exited":
            break
        await asyncio.sleep(0.05)
        info = await runtime.inspect("quitter")
    assert (info.state, info.exit_code) == ("exited", 3)
    assert [(c.state, c.exit_code) for c in await runtime.find(LABEL_COMMAND_ID, "cmd-7")] == [("exited", 3)]


async def test_a_missing_image_fails_clearly_and_nothing_is_pulled(runtime, podman):
    job = ContainerSpec(name="noimage", image="example.invalid/nothing:1", command=["true"])
    with pytest.raises(
        RuntimeFailure, match="image 'example.invalid/nothing:1' not found locally on this host; no registry pull"
    ):
        await runtime.create(job, labels=agent_labels("cmd-8"))
    assert podman.inspect("noimage") is None


async def test_a_command_that_cannot_start_fails_and_frees_its_name(runtime, podman):
    with pytest.raises(RuntimeFailure, match="starting container 'broken' failed"):
        await runtime.create(spec(podman, "broken", command=["/no/such/program"]), labels=agent_labels("cmd-9"))
    assert podman.inspect("broken") is None


async def test_gpus_the_engine_does_not_grant_are_refused_and_the_container_removed(runtime, podman):
    # Podman's Docker API silently ignores DeviceRequests; no GPU is needed to see that the runtime notices.
    job = spec(podman, "gpu-job", gpus=["GPU-6f2c7a1e-0000-0000-0000-000000000000"])
    with pytest.raises(RuntimeFailure, match="dropped the request for GPUs GPU-6f2c7a1e"):
        await runtime.create(job, labels=agent_labels("cmd-10"))
    assert podman.inspect("gpu-job") is None


async def test_an_unreachable_socket_fails_clearly(tmp_path):
    rt = open_runtime("docker", socket=str(tmp_path / "missing.sock"))
    try:
        with pytest.raises(RuntimeFailure, match=rf"cannot reach the Docker API at unix://{tmp_path}/missing.sock: No such file"):
            await rt.inspect("anything")
    finally:
        await rt.close()


def test_an_unknown_runtime_kind_or_option_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown container runtime 'lxc'"):
        open_runtime("lxc")
    with pytest.raises(ConfigError, match="bad options for the docker runtime"):
        open_runtime("docker", sokcet="/run/docker.sock")


async def test_a_workload_replicas_container_carries_the_workload_and_replica_labels(runtime, podman, tmp_path):
    """Set by the agent's executor from the signed spec (as it sets the rental id), read back from Podman."""
    signer = CommandSigner.generate()
    executor = CommandExecutor(
        "agt-1",
        CommandLog(tmp_path / "commands.db"),
        runtime,
        CommandVerifier({signer.key_id: signer.public_key_b64()}),
        host_gpus=list,
    )
    name = "wl-0123456789abcdef-r1-a1"
    job = {"name": name, "image": podman.image, "command": ["sleep", "300"], "workload_id": "wl-0123456789abcdef", "replica": 1}
    body = CommandBody(
        id="cmd-wl", agent_id="agt-1", kind="create_container", spec=job, issued_at=time.time(),
        deadline=time.time() + 60, key_id=signer.key_id,
    )  # fmt: skip
    result = await executor.execute(Command(body=body, signature=signer.sign(signing_bytes(body))))
    assert result.ok, result
    labels = podman.inspect(name)["Config"]["Labels"]
    assert (labels[LABEL_WORKLOAD_ID], labels[LABEL_REPLICA], labels[LABEL_COMMAND_ID]) == ("wl-0123456789abcdef", "1", "cmd-wl")
    executor.ledger.close()


def test_a_renter_cannot_set_the_workload_labels_itself(podman):
    with pytest.raises(ValueError, match="reserved"):
        spec(podman, "spoof", labels={"io.idlegrid.workload-id": "wl-someone-elses"})
