"""A gang replica for the overlay's tests, run inside a replica's namespace with the variables the agent gives it.

Rank 0 serves MASTER_ADDR:MASTER_PORT; every other rank connects to it. Each sends a greeting both ways, then an
all-reduce (sum) written with plain sockets: every rank sends its value, rank 0 adds them and sends the sum back.
Prints one JSON line: the variables it saw, what it heard, the sum.
"""

import json
import os
import socket
import sys
import time
from typing import TextIO

rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
value = float(sys.argv[1])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
names = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NNODES",
    "NODE_RANK",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "IDLEGRID_HOSTFILE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "IDLEGRID_OVERLAY_ADDR",
)
out: dict[str, object] = {"env": {n: os.environ[n] for n in names}, "hostfile": open(os.environ["IDLEGRID_HOSTFILE"]).read()}


def line(conn):
    return readers.setdefault(conn, conn.makefile("r")).readline().strip()


readers: dict[socket.socket, TextIO] = {}
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    peers, total, heard = [], value, []
    for _ in range(world - 1):
        conn, _ = server.accept()
        conn.sendall(b"hello from 0\n")
        heard.append(line(conn))
        total += float(line(conn))
        peers.append(conn)
    for conn in peers:
        conn.sendall(f"{total}\n".encode())
        conn.close()
    out |= {"heard": heard, "sum": total}
else:
    for _attempt in range(300):  # rank 0 may not listen yet: a refusal comes back through the tunnel at once
        try:
            conn = socket.create_connection((addr, port), timeout=60)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    else:
        raise SystemExit("rank 0 never listened")
    heard = [line(conn)]
    conn.sendall(f"hello from {rank}\n{value}\n".encode())
    out |= {"heard": heard, "sum": float(line(conn))}
print(json.dumps(out))
