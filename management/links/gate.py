"""Who may pass a link (pure): the workload's declared link, its owner and state, and who the visitor is, in; a
verdict out. The proxy (management/links/proxy.py) only carries it out.

Rules, in order:
1. the workload must declare the port as an ``http`` link: otherwise 404 (as a workload that is not there);
2. a public link lets anyone in; a private one lets in only its owner and the operator: no credentials is 401,
   another account 404 (another account's workload is not there for it, as everywhere in the API);
3. a link reaches a replica only while it runs: 503 saying the state (the link opens again once it runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from master.port import PortLink, WorkloadRecord

LINK_STATES = ("running",)  # a replica in this state is reachable


@dataclass(frozen=True)
class Visitor:
    account: str
    operator: bool


@dataclass(frozen=True)
class Admitted:
    link: PortLink
    via: str  # "public", "owner", "operator": for the log


@dataclass(frozen=True)
class Refused:
    status: int
    code: str
    message: str


def declared_link(workload: WorkloadRecord, port: int) -> PortLink | None:
    for link in workload.spec.links:
        if link.port == port and link.kind == "http":
            return link
    return None


def admit(workload: WorkloadRecord | None, port: int, visitor: Visitor | None) -> Admitted | Refused:
    """Whether ``visitor`` (None: no credentials) may open ``workload``'s link on ``port`` now."""
    link = declared_link(workload, port) if workload is not None else None
    if workload is None or link is None:
        return _missing(workload, port)
    if link.public:
        via = "public"
    elif visitor is None:
        return Refused(
            401,
            "unauthorized",
            "this link is private: open it from the console, or send 'Authorization: Bearer <API key or link token>'",
        )
    elif visitor.account == workload.account:
        via = "owner"
    elif visitor.operator:
        via = "operator"
    else:
        return _missing(workload, port)  # the same answer as no link at all: another account learns nothing
    if not any(a.state in LINK_STATES for a in workload.assignments):
        return Refused(
            503,
            "link_unavailable",
            f"workload {workload.id} is {workload.state}: its link opens once a replica runs",
        )
    return Admitted(link, via)


def _missing(workload: WorkloadRecord | None, port: int) -> Refused:
    name = f"{workload.id}-{port}" if workload is not None else f"on port {port}"
    return Refused(404, "not_found", f"no link {name}: no workload of yours declares an http link there")
