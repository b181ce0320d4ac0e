"""The shell around master/verification.py: when GPUs are challenged, the frames out and in, and what an outcome
changes (the GPU's record, its tier and flags, its history of ``gpu.verification`` events).

When a GPU is challenged (``due``, pure):
- it has no verification yet: the host just joined, or its driver changed (a new driver's report drops the old one);
- its last verification is older than ``period_s`` (daily by default) and the GPU is idle;
- an operator asks (``POST /api/v1/agents/{id}/verify``), at once.
Never a GPU of a vendor the host's benchmark does not measure (``measures``): the agent's "cuda" benchmark runs on
NVIDIA cards only, so an AMD card beside them is never challenged and shows "unmeasured" until a ROCm benchmark exists
(docs/gpus.md); the simulated benchmark measures any simulated card. Never while a renter holds the GPU: a held GPU
is not challenged (the operator's request answers 409), and the agent refuses a challenge for a GPU a container of its
own holds.

While a challenge runs its GPU is held in the Master's allocations by ``VERIFY_HOLDER`` (shown ``reserved``), so
nothing is placed on it: a renter's workload that would go there waits until the run ends (at most its deadline plus
the opening timeout), then is placed as usual. Waiting, not preempting: a run is about half a minute at most (the
rounds form's default work), and a preempted benchmark would have to start over (docs/verification.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, fields

import msgspec

from common.catalog import CATALOG
from common.errors import Conflict, NotFound
from common.wire import VerifyCommit, VerifyOpen, VerifyReveal, encode
from master.allocations import GpuAllocations
from master.config import MasterConfig
from master.events import EventLog
from master.records import AgentRecord, GpuRecord
from master.registry import Registry
from master.states import AgentState
from master.tiers import TierPolicy
from master.verification import REFUSED, ChallengeBook, ChallengeSettings, Outcome, verification_of

log = logging.getLogger(__name__)

VERIFY_HOLDER = "verification"  # the holder's container name in the allocations while a challenge runs
HISTORY_KIND = "gpu.verification"  # the event every outcome is recorded as, under the GPU's uuid
_CHALLENGED_STATES = frozenset({AgentState.READY.value, AgentState.BUSY.value})

SendToAgent = Callable[[str, bytes], Awaitable[bool]]
# The GPU vendors each benchmark a hello may name measures; a benchmark not listed (the simulated one) measures any.
_BENCHMARK_VENDORS = {"cuda": frozenset({"nvidia"})}


def measures(benchmark: str, vendor: str) -> bool:
    """Whether the agent's ``benchmark`` can measure a GPU of ``vendor``."""
    vendors = _BENCHMARK_VENDORS.get(benchmark)
    return vendors is None or vendor in vendors


@dataclass(frozen=True)
class VerifySchedule:
    enabled: bool = True
    period_s: float = 86400.0  # an idle GPU is challenged again after this long
    retry_s: float = 600.0  # after a refusal (rented, disconnected), asked again no sooner than this
    max_concurrent: int = 32  # challenges open at once across the fleet
    # Simulated GPUs are challenged on schedule only when asked (a grid that tests verification, the demo); otherwise
    # only by an operator's request. Their runs prove nothing about hardware, and they would hold every simulated GPU
    # of a test grid reserved for a moment after it joins.
    simulated: bool = False


def due(gpu: GpuRecord, agent: AgentRecord, held: bool, now: float, schedule: VerifySchedule, refused_at: float) -> bool:
    """Whether ``gpu`` should be challenged now (the module docstring's rules)."""
    if held or agent.state not in _CHALLENGED_STATES or agent.drained or gpu.model not in CATALOG or gpu.fault is not None:
        return False
    if gpu.info.simulated and not schedule.simulated:
        return False
    if now - refused_at < schedule.retry_s:
        return False
    last = gpu.verification
    return last is None or now - last.at >= schedule.period_s


class Verifier:
    def __init__(
        self,
        registry: Registry,
        allocations: GpuAllocations,
        events: EventLog,
        send: SendToAgent,
        settings: ChallengeSettings,
        schedule: VerifySchedule,
        *,
        min_throughput_fraction: float,
    ) -> None:
        self._registry = registry
        self._allocations = allocations
        self._events = events
        self._send = send
        self.schedule = schedule
        self.book = ChallengeBook(settings, min_throughput_fraction=min_throughput_fraction)
        self._refused_at: dict[str, float] = {}  # GPU uuid -> when its last challenge was refused
        # Agent id -> the benchmark its hello named ("cuda", "simulated"); agents naming none are never challenged.
        # In memory: every connection starts with a hello, and a restarted Master asks for one.
        self.benchmarks: dict[str, str] = {}
        self.forms: dict[str, frozenset[str]] = {}  # agent id -> the challenge forms its hello named besides "sum"

    def on_hello(self, agent_id: str, benchmark: str, forms: Iterable[str] = ()) -> None:
        if benchmark:
            self.benchmarks[agent_id] = benchmark
            self.forms[agent_id] = frozenset(forms)
        else:
            self.benchmarks.pop(agent_id, None)
            self.forms.pop(agent_id, None)

    # -- starting -------------------------------------------------------------------------------------------------

    async def request(self, agent_id: str, gpu_uuids: Iterable[str] = ()) -> list[str]:
        """An operator's request: challenge the named GPUs of ``agent_id`` (all of them when none are named) now.
        Returns the challenge ids. NotFound for an unknown host or GPU; Conflict when a renter holds a named GPU or
        the host is not connected."""
        agent = self._registry.agents.get(agent_id)
        if agent is None:
            raise NotFound(f"no host {agent_id}")
        if agent_id not in self.benchmarks:
            raise Conflict(f"host {agent_id} runs an agent without a GPU benchmark (install its gpu extra, then restart it)")
        if agent.state not in _CHALLENGED_STATES:
            raise Conflict(f"host {agent_id} is {agent.state}; it can be verified while it is ready or busy")
        gpus = self._registry.gpus_of(agent_id)
        benchmark = self.benchmarks[agent_id]
        named = list(gpu_uuids) or [g.uuid for g in gpus if measures(benchmark, g.info.vendor)]
        by_uuid = {g.uuid: g for g in gpus}
        unknown = [u for u in named if u not in by_uuid]
        if unknown:
            raise NotFound(f"host {agent_id} has no GPU {', '.join(unknown)}")
        unmeasured = [u for u in named if not measures(benchmark, by_uuid[u].info.vendor)]
        if unmeasured:
            vendors = ", ".join(sorted({by_uuid[u].info.vendor for u in unmeasured}))
            raise Conflict(
                f"GPU {', '.join(unmeasured)}: the host's {benchmark} benchmark does not measure {vendors} GPUs; "
                "they stay unmeasured until a benchmark for them exists"
            )
        rented = [u for u in named if self._held_by_renter(u)]
        if rented:
            raise Conflict(f"GPU {', '.join(rented)} is held by a renter's container; a benchmark never runs on a rented GPU")
        started = []
        for uuid in named:
            if self.book.busy(uuid):
                continue
            challenge_id = await self._start(agent, by_uuid[uuid], time.time())
            if challenge_id:
                started.append(challenge_id)
        return started

    async def step(self) -> None:
        """The loop's step: end what expired, then challenge the GPUs that are due."""
        now = time.time()
        for outcome in self.book.expire(now):
            await self.finish(outcome)
        if not self.schedule.enabled:
            return
        for agent_id, benchmark in list(self.benchmarks.items()):
            if benchmark == "simulated" and not self.schedule.simulated:
                continue  # cheap for a fleet of simulated agents: their GPUs are not looked at
            agent = self._registry.agents.get(agent_id)
            if agent is None:
                continue
            for gpu in self._registry.gpus_of(agent.id):
                if len(self.book.open) >= self.schedule.max_concurrent:
                    return
                if not measures(benchmark, gpu.info.vendor):
                    continue  # no benchmark for its vendor on this host: it stays unmeasured
                held = self._allocations.covering(gpu.uuid) is not None or self.book.busy(gpu.uuid)
                if due(gpu, agent, held, now, self.schedule, self._refused_at.get(gpu.uuid, float("-inf"))):
                    await self._start(agent, gpu, now)

    async def _start(self, agent: AgentRecord, gpu: GpuRecord, now: float) -> str:
        model = CATALOG.get(gpu.model)
        if model is None:
            return ""  # an unknown model has nothing to be measured against: the catalog must list it first
        forms = self.forms.get(agent.id, frozenset())
        challenge = self.book.start(agent.id, gpu.uuid, model, now, simulated=gpu.info.simulated, forms=forms)
        try:
            self._allocations.claim(agent.id, VERIFY_HOLDER, _hold_id(challenge.challenge_id), [gpu.uuid])
        except Conflict:
            del self.book.open[challenge.challenge_id]  # placed on meanwhile: the renter goes first
            return ""
        await self._registry.settle_gpus(agent)
        await self._events.record("gpu.verification_started", gpu.uuid, agent_id=agent.id, challenge_id=challenge.challenge_id)
        await self._send(agent.id, encode(challenge))
        return challenge.challenge_id

    # -- frames in ------------------------------------------------------------------------------------------------

    async def on_commit(self, agent_id: str, frame: VerifyCommit) -> None:
        step = self.book.on_commit(agent_id, frame, time.time())
        if isinstance(step, VerifyReveal):
            await self._send(agent_id, encode(step))
        elif step is not None:
            await self.finish(step)

    async def on_open(self, agent_id: str, frame: VerifyOpen) -> None:
        # Recomputing the checked entries or rounds is milliseconds of numpy each (bench/README.md): off the event loop.
        wrong = await asyncio.to_thread(self.book.check, agent_id, frame)
        outcome = None if wrong is None else self.book.conclude(agent_id, frame, wrong, time.time())
        if outcome is not None:
            await self.finish(outcome)

    async def on_disconnect(self, agent_id: str) -> None:
        self.benchmarks.pop(agent_id, None)
        self.forms.pop(agent_id, None)
        for outcome in self.book.forget_agent(agent_id, time.time()):
            await self.finish(outcome)

    # -- outcomes -------------------------------------------------------------------------------------------------

    async def finish(self, outcome: Outcome) -> None:
        """Carry out an outcome: give the GPU back, add the run to its history, and record its verification."""
        self._allocations.abandon(_hold_id(outcome.challenge_id))
        agent = self._registry.agents.get(outcome.agent_id)
        if agent is not None:
            await self._registry.settle_gpus(agent)
        gpu = self._registry.gpus.get(outcome.gpu_uuid)
        history = {f.name: getattr(outcome, f.name) for f in fields(outcome)}
        history["figures"] = msgspec.to_builtins(outcome.figures) if outcome.figures is not None else None
        await self._events.record(HISTORY_KIND, outcome.gpu_uuid, **history)
        log.info(
            "gpu verification",
            extra={"gpu": outcome.gpu_uuid, "agent_id": outcome.agent_id, "status": outcome.status, "code": outcome.code},
        )
        if gpu is None or gpu.agent_id != outcome.agent_id:
            return
        if outcome.status == REFUSED:
            self._refused_at[gpu.uuid] = outcome.finished_at  # the card keeps its previous verification
            return
        simulated = gpu.info.simulated or (outcome.figures is not None and outcome.figures.simulated)
        await self._registry.set_verification(
            gpu.uuid, verification_of(outcome, simulated=simulated, driver_version=gpu.info.driver_version)
        )

    def _held_by_renter(self, uuid: str) -> bool:
        hold = self._allocations.covering(uuid)
        return hold is not None and hold.container != VERIFY_HOLDER


def _hold_id(challenge_id: str) -> str:
    return f"verify:{challenge_id}"


def verifier_for(config: MasterConfig, registry: Registry, events: EventLog, send: SendToAgent, policy: TierPolicy) -> Verifier:
    """The Master's verifier, from its settings."""
    settings = ChallengeSettings(
        n=config.verify_n,
        k=config.verify_k,
        rounds=config.verify_rounds,
        allowance_s=config.verify_allowance_s,
        round_n=config.verify_round_n,
        round_k=config.verify_round_k,
        work_ratio=config.verify_work_ratio,
        round_allowance_s=config.verify_round_allowance_s,
        sim_target_s=config.verify_sim_target_s,
        sim_allowance_s=config.verify_sim_allowance_s,
    )
    schedule = VerifySchedule(
        enabled=config.verify_enabled,
        period_s=config.verify_period_s,
        retry_s=config.verify_retry_s,
        max_concurrent=config.verify_max_concurrent,
        simulated=config.verify_simulated,
    )
    return Verifier(
        registry,
        registry.allocations,
        events,
        send,
        settings,
        schedule,
        min_throughput_fraction=policy.min_throughput_fraction,
    )
