"""A gang replica that trains in steps and survives its host (tests/e2e/test_gang_resume.py). Run by Debian's python3 as
a sandboxed container's command, with the variables the agent gives a gang replica and its storage.

At each start it reads its step from $IDLEGRID_CHECKPOINT_DIR/step (0 without one), then meets its gang over the
overlay: rank 0 serves MASTER_ADDR:MASTER_PORT, every other rank connects to it, and each sends the other a line
naming its rank, the step it starts from and its overlay address. It records the start in its outputs as
``start-from-<step>-restored-<0|1>`` and the meeting as ``met-from-<step>.json`` (the line it heard, its variables,
the hostfile as it read it from $IDLEGRID_HOSTFILE or why it could not),
then counts to STEPS, writing its step atomically at each one and once more on SIGTERM (then exits 0). At the end it
writes ``result.txt``. A meeting that does not happen within MEET_TIMEOUT_S exits 3.

Each step is collective, as an all-reduce is: after it, a replica sends its peer a byte and waits for the peer's. A
replica whose peer is lost (its host gone, its packets dropped) waits there and counts no further, whatever the time the
Master takes to requeue the gang; a peer that finished its steps closes the connection, and the other counts on alone.
"""

import json
import os
import signal
import socket
import sys
import time

STEPS = int(sys.argv[1])
STEP_S = 0.2
MEET_TIMEOUT_S = 60.0
VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NODE_RANK",
    "RANK",
    "WORLD_SIZE",
    "IDLEGRID_OVERLAY_ADDR",
    "IDLEGRID_HOSTFILE",
)

checkpoint, outputs = os.environ["IDLEGRID_CHECKPOINT_DIR"], os.environ["IDLEGRID_OUTPUT_DIR"]
rank = int(os.environ["NODE_RANK"])
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
me = os.environ["IDLEGRID_OVERLAY_ADDR"]
try:
    with open(os.path.join(checkpoint, "step")) as f:
        step = int(f.read())
except FileNotFoundError:
    step = 0
started_from = step


def save() -> None:
    with open(os.path.join(checkpoint, "step.tmp"), "w") as f:
        f.write(f"{step}\n")
    os.replace(os.path.join(checkpoint, "step.tmp"), os.path.join(checkpoint, "step"))


def stop(*_: object) -> None:
    save()
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
open(os.path.join(outputs, f"start-from-{step}-restored-{os.environ.get('IDLEGRID_RESTORED', '0')}"), "w").close()


def meet() -> tuple[socket.socket, str]:
    """The connection to the peer and the line it sent (rank 0 hears rank 1; the gang here has two replicas)."""
    greeting = f"rank {rank} from {started_from} at {me}\n".encode()
    deadline = time.monotonic() + MEET_TIMEOUT_S
    if rank == 0:
        server = socket.create_server(("0.0.0.0", master[1]))
        server.settimeout(MEET_TIMEOUT_S)
        conn, _ = server.accept()
    else:
        while True:  # rank 0 may not listen yet, or its overlay not be up: try until the deadline
            try:
                conn = socket.create_connection(master, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    conn.settimeout(MEET_TIMEOUT_S)
    conn.sendall(greeting)
    heard = b""
    while not heard.endswith(b"\n"):  # a byte at a time: the steps' bytes follow the line on the same connection
        byte = conn.recv(1)
        if not byte:
            raise ConnectionError(f"the peer closed after {heard!r}")
        heard += byte
    conn.settimeout(None)  # a collective step waits for its peer as long as it takes
    return conn, heard.decode().strip()


try:
    peer, heard = meet()
except OSError as exc:
    print(f"the gang did not meet: {exc!r}", file=sys.stderr)
    sys.exit(3)
try:
    with open(os.environ["IDLEGRID_HOSTFILE"]) as f:
        hostfile = f.read()
except OSError as exc:
    hostfile = f"unreadable: {exc}"
with open(os.path.join(outputs, f"met-from-{started_from}.json"), "w") as f:
    json.dump({"heard": heard, "env": {name: os.environ[name] for name in VARIABLES}, "hostfile": hostfile}, f)


def collective() -> bool:
    """Send the peer this step's byte and wait for its; False once the peer has finished (closed its end)."""
    try:
        peer.sendall(b".")
        return peer.recv(1) == b"."
    except OSError:
        return False


together = True
while step < STEPS:
    step += 1
    save()
    time.sleep(STEP_S)
    together = together and collective()
with open(os.path.join(outputs, "result.txt"), "w") as f:
    f.write(f"done {step}\n")
