"""Bytes waiting in the kernel's TCP queues, from /proc/net/tcp: backlog that no process counter shows."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

PROC_NET_TCP = Path("/proc/net/tcp")


def queued_bytes(link_ports: Collection[int], agent_ports: Collection[int]) -> tuple[int, int]:
    """(relay -> Master, agents -> relays): unsent bytes on the sending side plus unread bytes on the receiving side.

    A server that falls behind stops reading; before any buffer of its own grows, its socket's receive
    queue and the sender's send queue fill, and that is where this looks.
    """
    link = agents = 0
    with PROC_NET_TCP.open() as table:
        next(table)  # header
        for line in table:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            tx, rx = (int(n, 16) for n in fields[4].split(":"))
            if local_port in link_ports:
                link += rx
            elif remote_port in link_ports:
                link += tx
            elif local_port in agent_ports:
                agents += rx
            elif remote_port in agent_ports:
                agents += tx
    return link, agents
