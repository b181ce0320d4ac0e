"""The Master's verifier with a real Master (SQLite) and frames as a relay carries them (tests/master/linked.py); the
agent's side is the real responder with the simulated benchmark (no GPU here: the simulator stands in for the card)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from agent.benchmark.responder import VerificationResponder
from agent.benchmark.simulated import SimulatedBenchmark
from common.catalog import CATALOG, reference_gpu_info
from common.containers import ContainerSpec
from common.errors import Conflict
from common.wire import VerifyChallenge, VerifyReveal
from master.records import GpuVerification
from master.verification import verification_label
from master.verifier import VerifySchedule, due, measures
from tests.master.linked import connect, disconnect, events, gpus, hello, relay, relay_link, to_agent

FrameT = TypeVar("FrameT")

UUID = "GPU-h100-0"


async def connect_benchmarking(master, link, agent_id: str, gpu_list=None, *, driver: str = "550.54.15") -> None:
    """An agent whose hello names the simulated benchmark, on a host that isolates containers."""
    listed = [msgspec.structs.replace(g, driver_version=driver) for g in (gpu_list or gpus(1))]
    await connect(master, link, agent_id, listed, isolation="container", runtime="docker")
    frame = hello(listed, runtime="docker", isolation="container")
    await relay(master, link, agent_id, msgspec.structs.replace(frame, benchmark="simulated"))


def last(link, agent_id: str, kind: type[FrameT]) -> FrameT:
    return [f for f in to_agent(link, agent_id) if isinstance(f, kind)][-1]


async def answer(master, link, agent_id: str, responder: VerificationResponder) -> None:
    """The agent's side of one challenge: commit, then open the rows the Master names."""
    challenge = last(link, agent_id, VerifyChallenge)
    await relay(master, link, agent_id, await responder.on_challenge(challenge))
    opened = responder.on_reveal(last(link, agent_id, VerifyReveal))
    assert opened is not None
    await relay(master, link, agent_id, opened)


def honest_responder() -> VerificationResponder:
    async def nothing_held() -> set[str]:
        return set()

    return VerificationResponder(SimulatedBenchmark({UUID: CATALOG["h100-sxm"]}), "", nothing_held)


async def test_a_gpu_under_verification_is_reserved_and_a_renters_container_waits_for_the_run(master):
    link = relay_link()
    await connect_benchmarking(master, link, "agt-a")
    await master.verifier.request("agt-a")
    assert master.registry.gpus[UUID].state == "reserved"  # nothing is placed on it while the benchmark runs
    with pytest.raises(Conflict):
        await master.create_command("agt-a", ContainerSpec(name="job", image="none", gpus=["0"]))
    await answer(master, link, "agt-a", honest_responder())
    gpu = master.registry.gpus[UUID]
    assert gpu.state == "available" and gpu.verification is not None and gpu.verification.status == "verified"
    assert gpu.verification.simulated  # a simulated card's pass: shown "simulated", never "verified"
    await master.create_command("agt-a", ContainerSpec(name="job", image="none", gpus=["0"]))
    runs = [e for e in await events(master, "gpu.verification", UUID) if e.kind == "gpu.verification"]
    assert [r.data["status"] for r in runs] == ["verified"]  # the history the API and the console show


async def test_the_master_asks_the_rounds_form_of_an_agent_whose_hello_names_it_and_the_sum_form_otherwise(master):
    link = relay_link()
    await connect_benchmarking(master, link, "agt-a")  # its hello names no form: the sum form only
    await master.verifier.request("agt-a")
    assert last(link, "agt-a", VerifyChallenge).form == "sum"
    await answer(master, link, "agt-a", honest_responder())
    listed = [msgspec.structs.replace(g, driver_version="550.54.15") for g in gpus(1)]
    frame = hello(listed, runtime="docker", isolation="container")
    await relay(master, link, "agt-a", msgspec.structs.replace(frame, benchmark="simulated", challenge_forms=["rounds"]))
    await master.verifier.request("agt-a")
    assert last(link, "agt-a", VerifyChallenge).form == "rounds"
    await answer(master, link, "agt-a", honest_responder())
    runs = [e for e in await events(master, "gpu.verification", UUID) if e.kind == "gpu.verification"]
    assert [r.data["status"] for r in runs] == ["verified", "verified"]


async def test_an_operator_cannot_verify_a_gpu_a_renter_holds(master):
    link = relay_link()
    await connect_benchmarking(master, link, "agt-a")
    await master.create_command("agt-a", ContainerSpec(name="job", image="none", gpus=["0"]))
    with pytest.raises(Conflict, match="held by a renter"):
        await master.verifier.request("agt-a")
    assert not [f for f in to_agent(link, "agt-a") if isinstance(f, VerifyChallenge)]


async def test_an_agent_without_a_benchmark_is_never_challenged(master):
    link = relay_link()
    await connect(master, link, "agt-old", gpus(1))  # its hello names no benchmark, as agents before verification
    with pytest.raises(Conflict, match="without a GPU benchmark"):
        await master.verifier.request("agt-old")
    await master.verifier.step()
    assert not [f for f in to_agent(link, "agt-old") if isinstance(f, VerifyChallenge)]


async def test_a_card_the_hosts_benchmark_cannot_measure_is_never_challenged_and_shows_unmeasured(master):
    """Issue 41: the CUDA benchmark measures NVIDIA cards only; an AMD card beside them stays unmeasured."""
    link = relay_link()
    nvidia = msgspec.structs.replace(gpus(1)[0], simulated=False)
    amd = msgspec.structs.replace(
        reference_gpu_info(CATALOG["mi300x"], index=0, uuid="GPU-4b2c4f5d21b5a3f0", pci_bus_id="0000:05:00.0"),
        driver_version="6.7.0",
    )
    await connect(master, link, "agt-mixed", [nvidia, amd], isolation="container", runtime="docker")
    frame = hello([nvidia, amd], runtime="docker", isolation="container")
    await relay(master, link, "agt-mixed", msgspec.structs.replace(frame, benchmark="cuda"))
    await master.verifier.step()
    challenged = [f.gpu_uuid for f in to_agent(link, "agt-mixed") if isinstance(f, VerifyChallenge)]
    assert challenged == [UUID]
    with pytest.raises(Conflict, match="does not measure amd GPUs"):
        await master.verifier.request("agt-mixed", [amd.uuid])
    assert verification_label(master.registry.gpus[amd.uuid]) == "unmeasured"
    assert measures("simulated", "amd") and measures("cuda", "nvidia") and not measures("cuda", "amd")


async def test_a_disconnect_during_a_run_gives_the_gpu_back_and_keeps_what_it_had(master):
    link = relay_link()
    await connect_benchmarking(master, link, "agt-a")
    await master.verifier.request("agt-a")
    await disconnect(master, link, "agt-a")
    assert master.allocations.covering(UUID) is None
    (outcome,) = [e for e in await events(master, "gpu.verification", UUID) if e.kind == "gpu.verification"]
    assert (outcome.data["status"], outcome.data["code"]) == ("refused", "disconnected")
    assert master.registry.gpus[UUID].verification is None


async def test_a_new_driver_drops_the_verification_so_the_gpu_is_run_again(master):
    link = relay_link()
    await connect_benchmarking(master, link, "agt-a", driver="550.54.15")
    await master.verifier.request("agt-a")
    await answer(master, link, "agt-a", honest_responder())
    assert master.registry.gpus[UUID].verification is not None
    await connect_benchmarking(master, link, "agt-a", driver="550.54.15")
    assert master.registry.gpus[UUID].verification is not None  # same driver: kept
    await connect_benchmarking(master, link, "agt-a", driver="580.65.06")
    assert master.registry.gpus[UUID].verification is None  # a driver change calls for a new run


def test_when_a_gpu_is_due():
    from master.records import AgentRecord, GpuRecord
    from tests.master.linked import gpus as infos

    info = msgspec.structs.replace(infos(1)[0], simulated=False)
    gpu = GpuRecord(uuid=UUID, agent_id="a", index=0, model="h100-sxm", info=info, state="available")
    agent = AgentRecord(id="a", provider="p", state="ready")
    schedule = VerifySchedule(period_s=100.0, retry_s=10.0)
    never = float("-inf")
    assert due(gpu, agent, False, 1000.0, schedule, never)  # joined, never measured
    assert not due(gpu, agent, True, 1000.0, schedule, never)  # held: by a renter or a run
    assert not due(gpu, agent, False, 1000.0, schedule, 995.0)  # refused a moment ago
    gpu.verification = GpuVerification(status="verified", at=950.0)
    assert not due(gpu, agent, False, 1000.0, schedule, never)  # measured within the period
    assert due(gpu, agent, False, 1050.0, schedule, never)  # the period passed
    assert not due(gpu, AgentRecord(id="a", provider="p", state="ready", drained=True), False, 1050.0, schedule, never)
    simulated = msgspec.structs.replace(gpu, info=msgspec.structs.replace(info, simulated=True), verification=None)
    assert not due(simulated, agent, False, 1000.0, schedule, never)  # simulated: only when the grid asks for it
    assert due(simulated, agent, False, 1000.0, VerifySchedule(simulated=True), never)
