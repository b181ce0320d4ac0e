"""Providers' prices (management/market/prices.py): a provider's default and its hosts' own, and the price in force
on a host with where it comes from.

``owner`` (as the API's auth decided it): the provider a call acts for, None for the operator. A host of another
provider answers NotFound, as a missing one does. The price in force on a host is public: ``host_price`` takes no
owner. The price book is loaded by the composition root (management/app.py) before the first call.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import NotFound
from management.market.prices import HostPrice, PriceBook, PriceSetting, reserved_price
from management.services.hosts import HostsService
from master.port import AgentRecord, MasterPort, PriceRecord

PRICE_CHANGED = "price.changed"  # the event kind of a price set or cleared


@dataclass(frozen=True)
class PriceListing:
    """Providers' price records (defaults have agent_id ""), the grid's default, and the currency they are in."""

    records: list[PriceRecord]
    grid_default: HostPrice
    currency: str


@dataclass(frozen=True)
class PriceRecordDetail:
    record: PriceRecord
    currency: str


@dataclass(frozen=True)
class HostPriceDetail:
    """The price in force on one host and where it comes from (``price.source``: host | provider | grid)."""

    agent_id: str
    provider: str
    price: HostPrice
    currency: str


class PricesService:
    def __init__(self, master: MasterPort, book: PriceBook, hosts: HostsService, currency: str) -> None:
        self._master = master
        self.book = book  # the one writer of providers' prices; the offer index and the scheduler read the same book
        self._hosts = hosts
        self._currency = currency

    async def list_prices(self, *, owner: str | None = None, provider: str | None = None) -> PriceListing:
        """A provider's own records (its default and its hosts'), or the operator's view of all (of ``provider``)."""
        if owner is not None:
            if provider is not None and provider != owner:
                raise NotFound(f"no provider {provider!r}")
            provider = owner
        return PriceListing(self.book.records(provider), self.book.grid_default, self._currency)

    async def set_default_price(self, provider: str, setting: PriceSetting) -> PriceRecordDetail:
        """``provider``'s default for its hosts without a price of their own (an enabled provider account)."""
        await self._master.accounts.require_provider(provider)
        record = await self.book.set_default(provider, setting)
        await self._record_change(provider, record)
        return PriceRecordDetail(record, self._currency)

    async def set_host_price(self, agent_id: str, setting: PriceSetting, *, owner: str | None = None) -> HostPriceDetail:
        agent = self._hosts.owned_agent(agent_id, owner)
        await self._record_change(agent.id, await self.book.set_host(agent.provider, agent.id, setting))
        return self._host_price(agent)

    async def clear_host_price(self, agent_id: str, *, owner: str | None = None) -> HostPriceDetail:
        """The host goes back to its provider's default (or the grid's); clearing a host with no price of its own
        changes nothing and answers the price in force as well."""
        agent = self._hosts.owned_agent(agent_id, owner)
        if await self.book.clear_host(agent.provider, agent.id):
            await self._record_change(agent.id, None, provider=agent.provider)
        return self._host_price(agent)

    async def _record_change(self, subject: str, record: PriceRecord | None, *, provider: str = "") -> None:
        """A ``price.changed`` event (subject: the host, or the provider for its default) with what it charges from
        now on; an offer's price history is read from them (management/market/offer_history.py). ``record`` None: the
        host's own price was cleared (it takes its provider's default again)."""
        if record is None:
            await self._master.record_event(PRICE_CHANGED, subject, provider=provider, agent_id=subject, on_demand=None)
            return
        await self._master.record_event(
            PRICE_CHANGED,
            subject,
            provider=record.provider,
            agent_id=record.agent_id,
            on_demand=record.on_demand,
            min_bid=record.min_bid,
            reserved=reserved_price(record.on_demand, record.reserved_discount),
            max_duration_s=record.max_duration_s,
        )

    async def host_price(self, agent_id: str) -> HostPriceDetail:
        return self._host_price(self._master.registry.get(agent_id))

    def _host_price(self, agent: AgentRecord) -> HostPriceDetail:
        price = self.book.price(agent.provider, agent.id)
        return HostPriceDetail(agent.id, agent.provider, price, self._currency)
