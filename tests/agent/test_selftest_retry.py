"""The GPU self-test meets an engine under load (agent/runtime/selftest.py): an error that passes (runc's, CNI's) is
tried again at once and, when it persists, again later; an answer about the GPU or the host's setup is not."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.runtime.process import SIMULATED_PROBE, ProcessRuntime
from agent.runtime.selftest import (
    TIMED_OUT_DETAIL,
    Probe,
    SelfTestRetry,
    reach_in_containers,
    retest_later,
    transient,
)
from bench.fleet_agents import agent_dir
from bench.provision import provision_agents
from common.containers import ContainerInfo, ContainerSpec
from common.errors import RuntimeFailure
from common.inventory import GpuInfo, GpuReach
from master.config import MasterConfig

# What Podman's API answered when runc failed under load on these machines (load 9-15, several Podman users at once).
RUNC_LOST_ITS_CHILD = (
    "starting container 'idlegrid-selftest-0' failed: the engine answered 500: runc: runc create failed: unable to start "
    "container process: can't get final child's PID from pipe: EOF: OCI runtime error"
)
RUNC_INIT_RESET = (
    "starting container 'idlegrid-selftest-1' failed: the engine answered 500: runc: runc create failed: unable to start "
    "container process: error during container init: read init-p: connection reset by peer: OCI runtime error"
)
CNI_HIDDEN = (
    "creating container 'idlegrid-selftest-0' failed: the engine answered 500: plugin type=\"bridge\" failed (add): "
    'unknown FS magic on "/run/netns/netns-8f1c": 1021994'
)
NO_SUCH_COMMAND = (
    "starting container 'idlegrid-selftest-0' failed: the engine answered 500: runc: runc create failed: unable to start "
    'container process: exec: "nvidia-smi": executable file not found in $PATH: OCI runtime error'
)
NO_CDI_DEVICE = (
    "creating container 'idlegrid-selftest-0' failed: the engine answered 500: setting up CDI devices: unresolvable CDI "
    "devices nvidia.com/gpu=GPU-aaaa"
)
PROBE_FAILED = "the self-test command exited with code 127: sh: nvidia-smi: not found"


@pytest.mark.parametrize("error", [RUNC_LOST_ITS_CHILD, RUNC_INIT_RESET, CNI_HIDDEN])
def test_the_engines_passing_errors_are_transient(error: str) -> None:
    assert transient(error)
    assert SelfTestRetry(tries=3, backoff_s=1.0).wait_before_next(1, error) == 1.0


@pytest.mark.parametrize("error", [NO_SUCH_COMMAND, NO_CDI_DEVICE, PROBE_FAILED, "no GPU", ""])
def test_an_answer_about_the_gpu_or_the_hosts_setup_is_not_tried_again(error: str) -> None:
    assert not transient(error)
    assert SelfTestRetry(tries=3).wait_before_next(1, error) is None


def test_a_passing_error_is_tried_again_with_a_doubling_backoff_a_bounded_number_of_times() -> None:
    retry = SelfTestRetry(tries=4, backoff_s=0.5)
    waits = [retry.wait_before_next(done, RUNC_LOST_ITS_CHILD) for done in range(1, 6)]
    assert waits == [0.5, 1.0, 2.0, None, None]
    assert SelfTestRetry(tries=1).wait_before_next(1, RUNC_LOST_ITS_CHILD) is None


def test_a_gpu_is_tested_again_later_only_when_its_failure_passes() -> None:
    def failed(detail: str) -> GpuReach:
        return GpuReach(uuid="GPU-a", reachable=False, detail=detail, fix="f")

    assert retest_later(failed(f"{TIMED_OUT_DETAIL}30 s"))
    assert not retest_later(failed(NO_SUCH_COMMAND))
    assert not retest_later(failed("a docker container given this GPU saw: no GPU"))
    assert not retest_later(GpuReach(uuid="GPU-a", reachable=True, detail="seen in a docker container"))


class Hiccups:
    """The process runtime whose first creates fail as runc fails under load: the one thing faked here, since such a
    failure cannot be made on demand. Everything else is the real runtime's."""

    def __init__(self, runtime: ProcessRuntime, errors: list[str]) -> None:
        self.runtime = runtime
        self.errors = errors
        self.retry = SelfTestRetry(backoff_s=0.0)  # no wait between tries: nothing here passes with time
        self.creates = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        self.creates += 1
        if self.errors:
            raise RuntimeFailure(self.errors.pop(0))
        return await self.runtime.create(spec, labels=labels)

    async def gpu_selftest(self, gpus: Sequence[GpuInfo]) -> list[GpuReach]:
        return await reach_in_containers(self, gpus, image="none", probe=by_name, timeout_s=60.0, retry=self.retry)


def by_name(gpu: GpuInfo) -> Probe:
    return Probe(SIMULATED_PROBE, expect=gpu.uuid, fix="restart the engine")


GPUS = [
    GpuInfo(
        index=i,
        uuid=f"GPU-sim-{letter * 4}",
        name="NVIDIA L4",
        pci_bus_id=f"0000:0{i}:00.0",
        memory_total_mib=23034,
        compute_capability="8.9",
    )
    for i, letter in enumerate("ab")
]


async def selftest(runtime: Hiccups) -> list[GpuReach]:
    return await runtime.gpu_selftest(GPUS)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime's sandbox (uids, namespaces) needs root")


@needs_root
async def test_a_gpu_whose_container_runc_failed_once_is_tried_again_and_reaches_it(tmp_path: Path) -> None:
    runtime = Hiccups(ProcessRuntime(tmp_path, simulated_gpus=True), [RUNC_LOST_ITS_CHILD, CNI_HIDDEN])
    reached = await selftest(runtime)
    assert [(r.uuid, r.reachable) for r in reached] == [(g.uuid, True) for g in GPUS], reached
    assert runtime.creates == 4  # the first GPU's third try ran; the second's first did
    assert await runtime.runtime.list() == []


@needs_root
async def test_a_gpu_runc_fails_every_time_is_not_offered_says_why_and_is_left_to_a_later_retest(tmp_path: Path) -> None:
    runtime = Hiccups(ProcessRuntime(tmp_path, simulated_gpus=True), [RUNC_LOST_ITS_CHILD] * 3)
    first, second = await selftest(runtime)
    assert not first.reachable and "3 tries in a row" in first.detail and "can't get final child's PID" in first.detail
    assert retest_later(first) and second.reachable
    assert runtime.creates == 4


@needs_root
async def test_a_real_failure_is_tried_once_and_not_left_to_a_retest(tmp_path: Path) -> None:
    runtime = Hiccups(ProcessRuntime(tmp_path, simulated_gpus=True), [NO_SUCH_COMMAND])
    first, second = await selftest(runtime)
    assert (first.reachable, first.detail) == (False, NO_SUCH_COMMAND) and not retest_later(first)
    assert second.reachable and runtime.creates == 2


# --- the agent tests again later what failed for a reason that passes (agent/daemon.py) -------------------------------


@pytest.fixture
async def enrolled(tmp_path: Path) -> Path:
    """An agent state directory, enrolled offline (as tests/agent/test_daemon.py makes one)."""
    await provision_agents(MasterConfig(state_dir=str(tmp_path / "master")), tmp_path / "agents", 1)
    return agent_dir(tmp_path / "agents", 0)


def agent_on(enrolled: Path, runtime: Hiccups) -> Agent:
    config = AgentConfig(
        state_dir=str(enrolled),
        access_urls=["wss://127.0.0.1:1"],
        simulate="l4:2",
        measure_bandwidth=False,
        runtime="process",
        gpu_selftest_retests=2,
        gpu_selftest_retest_s=0.01,
    )
    return Agent(config, runtime=runtime)


def reach_in_hello(agent: Agent) -> list[bool]:
    return [reach.reachable for reach in agent._hello().inventory.gpu_reach]


@needs_root
async def test_a_gpu_still_failing_for_a_passing_reason_is_tested_again_later_and_then_offered(enrolled, tmp_path) -> None:
    runtime = Hiccups(ProcessRuntime(tmp_path / "rt", simulated_gpus=True), [RUNC_LOST_ITS_CHILD] * 3)
    agent = agent_on(enrolled, runtime)
    try:
        await agent.probe_runtime()
        assert reach_in_hello(agent) == [False, True]
        assert agent._retesting is not None
        await agent._retesting
        assert reach_in_hello(agent) == [True, True]
        assert runtime.creates == 5  # three tries at first, the other GPU's one, one later: the passing GPU left alone
    finally:
        await agent.close()


@needs_root
async def test_a_gpu_failing_for_what_it_is_is_not_tested_again_until_the_runtime_is(enrolled, tmp_path) -> None:
    runtime = Hiccups(ProcessRuntime(tmp_path / "rt", simulated_gpus=True), [NO_SUCH_COMMAND])
    agent = agent_on(enrolled, runtime)
    try:
        await agent.probe_runtime()
        assert reach_in_hello(agent) == [False, True] and agent._retesting is None
    finally:
        await agent.close()
