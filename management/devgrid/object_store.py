"""The demo's object store: an S3-compatible server on 127.0.0.1, so a renter's checkpoints, inputs and outputs have
somewhere to go on a machine with no network (docs/storage.md).

It is moto's server (``moto[server]``, the ``demo`` extra that ``scripts/demo`` installs), a process of the grid like
the others (``logs/storage.log``), on a port kept in ``ports.json`` (7900 when free on the first run). It takes any
key pair and keeps its objects in memory: a demo started again begins with an empty bucket ``demo``. The store is on
loopback, which the egress rule refuses (common/egress.py), so the demo's operator and its hosts' provider allow it
by name, as a grid's operator allows a store on its own network.
"""

from __future__ import annotations

import importlib.util
import urllib.request
from dataclasses import dataclass

from management.devgrid.localgrid import HOST, Daemon, LocalGrid, wait_until

DEFAULT_PORT = 7900
BUCKET = "demo"
KEYS = "demo:demo"  # what a renter stores as its secret for this store: any key pair is accepted
START_TIMEOUT_S = 30.0


def unavailable() -> str:
    """ "" when the store can run here, else why not (the banner's note)."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        return "moto[server] is not installed (scripts/demo installs it: pip install -e '.[demo]')"
    return ""


@dataclass
class ObjectStore:
    port: int
    daemon: Daemon | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def allowed(self) -> str:
        """The ``egress_allow`` entry that lets renters and hosts use it."""
        return f"{HOST}:{self.port}"

    @classmethod
    def plan(cls, grid: LocalGrid) -> ObjectStore:
        return cls(grid.service_port("storage", DEFAULT_PORT))

    def start(self, grid: LocalGrid) -> None:
        """Spawn the server; ``wait`` makes its bucket once it answers."""
        grid.check_ports({self.port: "the demo's object store"})
        args = ["-H", HOST, "-p", str(self.port)]
        # Any key pair, always: moto would check keys after INITIAL_NO_AUTH_ACTION_COUNT requests were it set in the
        # environment the demo inherits (a test's own moto sets it), and refuse the demo's keys (403).
        env = {"INITIAL_NO_AUTH_ACTION_COUNT": "inf"}
        self.daemon = grid.spawn("storage", "other", args, program=("moto.server",), env=env)

    def wait(self) -> None:
        """Until the server answers, then the bucket ``demo`` (an empty store after every start)."""
        wait_until(self._answers, START_TIMEOUT_S, f"the object store at {self.endpoint}")
        request = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def _answers(self) -> bool:
        if self.daemon is not None and not self.daemon.alive():
            raise RuntimeError(f"the object store exited: {self.daemon.last_words()}")
        with urllib.request.urlopen(f"{self.endpoint}/", timeout=2) as response:
            return bool(response.status == 200)
