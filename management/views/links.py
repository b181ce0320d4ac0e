"""A workload's HTTPS links (docs/links.md) as the API answers them: each link with its URL, and a link token minted
for one (shown once). management/services/links.py decides both."""

from __future__ import annotations

import msgspec

from management.services.links import IssuedLinkToken, WorkloadLink


class LinkView(msgspec.Struct, kw_only=True):
    """A workload's link as the API, the CLI and the console show it."""

    port: int
    url: str
    public: bool


class MintedToken(msgspec.Struct, kw_only=True):
    """A link token, shown once: ``url`` opens the link with it in a browser (it becomes a cookie there)."""

    token: str
    url: str
    expires_at: float


class LinkList(msgspec.Struct, kw_only=True):
    """A workload's links: one per http port it declared (``links`` in its spec)."""

    items: list[LinkView]


def link_list_view(links: list[WorkloadLink]) -> LinkList:
    return LinkList(items=[LinkView(port=link.port, url=link.url, public=link.public) for link in links])


def minted_token_view(issued: IssuedLinkToken) -> MintedToken:
    return MintedToken(token=issued.token, url=issued.url, expires_at=issued.expires_at)
