"""Which of the Masters sharing one store leads: the leader lease, held, renewed, lost (docs/ha.md).

A Master starts as a *standby* and tries to take the lease every ``renew_s``; once it holds it, it is the
*leader* and renews it every ``renew_s`` for ``ttl_s``. It counts itself leader only while its own monotonic
clock says the last renewal it sent is younger than ``ttl_s - margin_s``: a leader frozen (SIGSTOP) or cut off
from the store stops writing on its own, before any standby can take the lease (judged on the store's stored
expiry by the standby's wall clock). A refused renewal, a lease lapsed locally, or a store write refused by the
fence *deposes* it: the role becomes *stepped down* for good and ``on_deposed`` is told; the process then stops
serving and exits, to come back as a standby (the supervisor restarts it).

``fence()`` is what every store write consults (master/store/fenced.py): it raises ``Fenced`` unless this Master
leads right now, and a refused write wakes the loop so that the step-down happens at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from common.errors import ConfigError, Fenced
from master.records import LeaseRecord
from master.store.base import LeaseRepo

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class LeaderRole(str, Enum):
    STANDBY = "standby"
    LEADER = "leader"
    STEPPED_DOWN = "stepped_down"  # deposed: writes nothing more, serves nothing more, exits


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    ttl_s: float = 10.0  # how long a renewal holds the lease
    renew_s: float = 3.0  # how often the leader renews and a standby tries to take it
    margin_s: float = 2.0  # the leader stops this long before its lease lapses: covers clock skew between Masters

    def __post_init__(self) -> None:
        if self.renew_s <= 0 or self.margin_s < 0 or self.renew_s >= self.ttl_s - self.margin_s:
            raise ConfigError(
                f"lease timing: lease_renew_s ({self.renew_s}) must be above 0 and below lease_ttl_s - lease_margin_s "
                f"({self.ttl_s} - {self.margin_s}), or the leader would lose its lease between two renewals"
            )


Elected = Callable[[LeaseRecord], Awaitable[None]]
Deposed = Callable[[str], Awaitable[None]]


class Leadership:
    """One Master's part in the election; ``step`` is one tick (tests drive it with fake clocks), ``start`` runs it."""

    def __init__(
        self,
        leases: LeaseRepo,
        holder: str,
        *,
        timing: LeaseTiming,
        on_elected: Elected,
        on_deposed: Deposed,
        wall: Clock = time.time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self._leases = leases
        self.holder = holder
        self.timing = timing
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._wall = wall
        self._monotonic = monotonic
        self.role = LeaderRole.STANDBY
        self.lease: LeaseRecord | None = None  # ours, while leader
        self.leader: LeaseRecord | None = None  # the lease as last read: who leads, or led
        self.deposed_reason = ""
        self.url = ""  # where relays reach this Master's link, and API callers its API: set before start
        self.api_url = ""
        self._renewed_at = -float("inf")  # monotonic time a renewal that succeeded was sent
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._taking_over: asyncio.Task[None] | None = None
        self._deposed = asyncio.Event()

    # --- what the Master asks ---------------------------------------------------------------------

    def leads(self) -> bool:
        """Whether this Master may write now: leader, and its last renewal younger than ttl - margin."""
        return self.role is LeaderRole.LEADER and self._monotonic() < self._renewed_at + self.timing.ttl_s - self.timing.margin_s

    def fence(self) -> None:
        """Raise ``Fenced`` unless this Master leads now; a refusal wakes the loop to step down at once."""
        if self.leads():
            return
        if self.role is LeaderRole.LEADER:
            self._wake.set()
        epoch = self.lease.epoch if self.lease is not None else 0
        raise Fenced(f"Master {self.holder} is {self.role.value}, not the leader (epoch {epoch}): its store writes are refused")

    def leader_url(self) -> str:
        """The leader's link URL when another Master holds an unexpired lease, else "" (none known)."""
        lease = self.leader
        if lease is None or lease.holder == self.holder or lease.expires_at <= self._wall():
            return ""
        return lease.url

    def leader_api_url(self) -> str:
        lease = self.leader
        if lease is None or lease.holder == self.holder or lease.expires_at <= self._wall():
            return ""
        return lease.api_url

    @property
    def deposed(self) -> asyncio.Event:
        """Set once this Master stepped down."""
        return self._deposed

    # --- the loop ---------------------------------------------------------------------------------

    async def step(self) -> None:
        """One tick: the leader renews (or steps down); a standby tries to take the lease."""
        if self.role is LeaderRole.LEADER:
            await self._renew()
        elif self.role is LeaderRole.STANDBY:
            await self._try_to_lead()

    async def _try_to_lead(self) -> None:
        sent_at = self._monotonic()
        lease = await self._leases.acquire(self.holder, self.url, self.api_url, self.timing.ttl_s, self._wall())
        if lease is None:
            self.leader = await self._leases.current()
            return
        self.lease = self.leader = lease
        self._renewed_at = sent_at
        self.role = LeaderRole.LEADER
        log.info("leader lease taken", extra={"holder": self.holder, "epoch": lease.epoch})
        # Taking over (loading the state) runs beside the loop, which goes on renewing meanwhile: a large store takes
        # longer to load than a lease lasts.
        self._taking_over = asyncio.create_task(self._take_over(lease), name="taking-over")

    async def _take_over(self, lease: LeaseRecord) -> None:
        try:
            await self._on_elected(lease)
        except Exception as exc:  # half taken over is no state to serve in
            log.exception("taking over failed")
            await self.step_down(f"taking over failed: {exc}")

    async def taken_over(self) -> None:
        """Until ``on_elected`` has finished (at once when no take-over is under way)."""
        if self._taking_over is not None:
            await asyncio.shield(self._taking_over)

    async def _renew(self) -> None:
        assert self.lease is not None
        if not self.leads():
            await self.step_down(f"the lease lapsed here before it could be renewed (epoch {self.lease.epoch})")
            return
        sent_at = self._monotonic()
        try:
            lease = await self._leases.renew(self.holder, self.lease.epoch, self.timing.ttl_s, self._wall())
        except Exception as exc:  # the store is unreachable: keep trying while the lease lasts here
            log.warning("could not renew the leader lease: %s", exc, extra={"epoch": self.lease.epoch})
            return
        if lease is None:
            self.leader = await self._leases.current()
            holder = self.leader.holder if self.leader is not None else "no one"
            await self.step_down(f"the lease renewal was refused: {holder} holds it now")
            return
        if not self.leads():  # the answer came too late to count (the call itself took the rest of the lease)
            await self.step_down(f"the lease renewal came back after the lease lapsed here (epoch {lease.epoch})")
            return
        self.lease = self.leader = lease
        self._renewed_at = sent_at

    async def step_down(self, reason: str) -> None:
        """Stop leading for good: nothing more is written (the fence refuses it), ``on_deposed`` is told once."""
        if self.role is LeaderRole.STEPPED_DOWN:
            return
        self.role = LeaderRole.STEPPED_DOWN
        self.deposed_reason = reason
        log.error("stepping down: %s", reason, extra={"holder": self.holder})
        self._deposed.set()
        await self._on_deposed(reason)

    def _stepped_down(self) -> bool:
        return self.role is LeaderRole.STEPPED_DOWN

    async def run(self) -> None:
        while not self._stepped_down():
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a standby whose store is unreachable keeps trying
                log.exception("leader election step failed; trying again in %.1f s", self.timing.renew_s)
            if self._stepped_down():  # step() may have stepped down (a call, so the loop's test does not narrow it)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timing.renew_s)
            self._wake.clear()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="leadership")

    async def stop(self, *, release: bool) -> None:
        """Stop the loop; ``release``: a leader stopping cleanly lets its lease lapse now, so a standby takes over at once."""
        for task in (self._task, self._taking_over):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._taking_over = None
        if release and self.role is LeaderRole.LEADER and self.lease is not None:
            with contextlib.suppress(Exception):
                await self._leases.release(self.holder, self.lease.epoch)
