"""The Master: starts and stops what master/composition.py builds, and holds (or waits for) the leader lease.

Its parts are built by ``compose`` (master/composition.py) and exposed as attributes; agent and relay frames are
handled by the agent channel (master/agent_channel.py); the requests management makes are ``MasterRequests``
(master/requests.py). Management uses a Master through ``MasterPort`` (master/port.py) only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from common.wire import CLOSE_NOT_LEADER, AccessStats
from master.accounts import BOOTSTRAP_ACCOUNT, AccountRole
from master.composition import compose
from master.config import MasterConfig
from master.leadership import LeaderRole, Leadership, LeaseTiming
from master.overlay import OverlayAuthority
from master.port import MasterPort
from master.private_state import PRIVATE_DIR, make_private
from master.records import LeaseRecord
from master.requests import MasterRequests
from master.store import open_store
from master.store.base import Store
from master.store.fenced import fenced

log = logging.getLogger(__name__)


class Master(MasterRequests):
    def __init__(self, config: MasterConfig, *, store: Store | None = None) -> None:
        self.config = config
        self.state_dir = config.state_path
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        store = store or open_store(config.resolved_store_url())
        # High availability (docs/ha.md): the leader lease decides whether this Master serves, and fences its writes.
        self.leadership: Leadership | None = None
        self._taken_over = False  # the state is loaded and the loops run (high availability: once elected)
        self._on_elected: list[Callable[[], Awaitable[None]]] = []  # what serving needs beyond the Master (the API's loops)
        if config.ha:
            self.leadership = Leadership(
                store.leases,
                config.node_id or f"{socket.gethostname()}:{config.api_port}",
                timing=LeaseTiming(ttl_s=config.lease_ttl_s, renew_s=config.lease_renew_s, margin_s=config.lease_margin_s),
                on_elected=self._elected,
                on_deposed=self._deposed,
            )
            store = fenced(store, self.leadership.fence)
        self.parts = parts = compose(config, store, link_refusal=self._link_refusal)
        self.store = parts.store
        self.authority = parts.authority
        self.policy = parts.policy
        self.events = parts.events
        self.allocations = parts.allocations
        self.changes = parts.changes  # the one change feed management subscribes to: master/changes.py
        self.registry = parts.registry
        self.health = parts.health
        self.telemetry = parts.telemetry
        self.history = parts.history
        self.network_floors = parts.network_floors
        self.accounts = parts.accounts
        self.enrollment = parts.enrollment
        self.hub = parts.hub
        self.commands = parts.commands  # the command ledger (``market.ledger`` is money; this one is commands)
        self.tunnels = parts.tunnels
        self.metrics = parts.metrics
        self.directory = parts.directory
        self.channel = parts.channel
        self.verifier = parts.verifier  # measured verification (master/verifier.py)
        self.overlay = OverlayAuthority.open(self.state_dir, config.overlay)  # gangs' networks (docs/overlay.md)
        self.secrets = parts.secrets  # renters' secrets (master/secrets.py)
        make_private(self.state_dir)  # what an older Master (or this one, just now: certificates) left open to others
        self.link_port = 0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def started_at(self) -> float:
        """When this process began serving (0 before)."""
        return self.parts.upkeep.started_at

    @started_at.setter
    def started_at(self, when: float) -> None:
        self.parts.upkeep.started_at = when

    @property
    def relay_stats(self) -> dict[str, AccessStats]:
        """Each linked relay's latest ``AccessStats``, by relay id."""
        return self.channel.relay_stats

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.leadership is not None:
            raise RuntimeError("a Master with ha on starts with start_standby(api_url)")
        await self.store.open()
        await self._load()
        self.link_port = await self.hub.start(self.config.host, self.config.link_port)
        self._run_loops()

    async def _load(self) -> None:
        """What serving starts from: the registry, open commands, accounts, revocations, as the store has them."""
        await self.registry.load()
        await self.commands.load()
        # Keys naming no account (the bootstrap operator key of a Master older than accounts) belong to this one.
        await self.accounts.ensure(BOOTSTRAP_ACCOUNT, AccountRole.OPERATOR, name="Operator")
        await self.accounts.adopt_legacy_keys()
        self.channel.revoked = await self._load_revocations()
        await self.parts.upkeep.report_quarantined()

    def _run_loops(self) -> None:
        self.parts.upkeep.began()
        self._tasks = [loop.start() for loop in self.parts.loops()]
        log.info("master started", extra={"link_port": self.link_port, "store": self.store.backend})

    async def _load_revocations(self) -> set[str]:
        try:
            return {r.serial for r in await self.store.revocations.list()}
        except Exception as exc:
            # Relays keep the list they have; revocations made from now on are still sent to them.
            log.error("could not load revocations; serving the rest: %s", exc)
            await self.events.record("master.load_failed", "revocations", problem=str(exc))
            return set()

    # --- high availability (master/leadership.py, docs/ha.md) ----------------------------------

    async def start_standby(self, api_url: str) -> None:
        """Open the store, listen for relays (refused until elected) and run the election; ``api_url``: where callers
        reach this Master's API, named in the lease. Serving starts when the lease is taken (``when_elected``)."""
        assert self.leadership is not None
        await self.store.open()
        self.link_port = await self.hub.start(self.config.host, self.config.link_port)
        advertised = self.config.advertise_host or self.config.host
        self.leadership.url = f"wss://{advertised}:{self.link_port}/link"
        self.leadership.api_url = api_url
        self.leadership.start()
        log.info("master standing by", extra={"link_port": self.link_port, "holder": self.leadership.holder})

    def when_elected(self, serve: Callable[[], Awaitable[None]]) -> None:
        """Run ``serve`` once this Master is elected and has loaded its state (what serving needs beyond the Master:
        management's state and loops), in the order given."""
        self._on_elected.append(serve)

    @property
    def role(self) -> str:
        """leader | standby | stepped_down; a Master without ha is always the leader."""
        return LeaderRole.LEADER.value if self.leadership is None else self.leadership.role.value

    def leads(self) -> bool:
        """Whether this Master may write now (always, without ha)."""
        return self.leadership is None or self.leadership.leads()

    def serves(self) -> bool:
        """Whether relays and API calls are taken: it leads, and has loaded the state it took over."""
        return self.leadership is None or (self._taken_over and self.leadership.leads())

    def _link_refusal(self) -> str | None:
        if self.leadership is None or self.serves():
            return None
        return self.leadership.leader_url()

    async def _elected(self, lease: LeaseRecord) -> None:
        """The lease is ours: load what the store holds now (the previous leader's last writes) and serve."""
        self.store.writes_by(lease.holder, lease.epoch)
        await self._load()
        self._run_loops()
        for take_over in self._on_elected:
            await take_over()
        self._taken_over = True
        log.info("master leading", extra={"epoch": lease.epoch, "holder": lease.holder})

    async def _deposed(self, reason: str) -> None:
        """The lease is lost: writes are refused already (the fence); stop the loops and hand the relays over."""
        self.channel.stopping = True
        for task in self._tasks:
            task.cancel()
        assert self.leadership is not None
        await self.hub.close_links(CLOSE_NOT_LEADER, self.leadership.leader_url())

    async def stop(self) -> None:
        """Graceful stop (SIGTERM): close the relay links, flush what is held in memory, close the store.

        Links close first, and their handlers run to the end: every frame a relay already sent is
        handled (a result stored and acknowledged) before the store closes. A relay counts a frame as
        delivered once it is written to the link, so this is what keeps them from being lost.
        """
        self.channel.stopping = True
        await self.hub.stop()
        await self.directory.stop()
        self.commands.wake_readers()  # a read waiting for a command's end answers now, with the state it has
        await self.channel.stop_worker_calls()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.leads():  # a standby holds nothing to flush; a deposed leader may write nothing more
            await self.telemetry.flush(time.time(), everything=True)
            await self.registry.flush()
        if self.leadership is not None:
            await self.leadership.stop(release=True)
        await self.store.close()
        log.info("master stopped")

    @property
    def link_url(self) -> str:
        return f"wss://{self.config.host}:{self.link_port}/link"


def implements_port(master: Master) -> MasterPort:
    """The Master as management sees it; mypy checks here that ``Master`` implements ``MasterPort`` (master/port.py)."""
    return master
