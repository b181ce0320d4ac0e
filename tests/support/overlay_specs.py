"""A gang replica's overlay as the Master would sign it, for the agent's overlay tests (process and docker runtimes)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.overlay import GangOverlays, OverlayKey
from common.overlay import OverlaySpec
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings


def replica_overlay(root: Path, replica: int) -> tuple[GangOverlays, OverlaySpec]:
    """The host's overlays (its key under ``root/state``) and replica ``replica``'s spec of gang ``wl-ab`` (2 replicas,
    block 100.64.1.0/25, a lighthouse named at 127.0.0.1:4242), signed by a fresh overlay CA for that key."""
    overlays = GangOverlays(OverlayKey.load_or_create(root / "state"), root / "state-overlay")
    settings = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["127.0.0.1:4242"])])
    overlay = OverlayAuthority.create(settings).replica_spec(
        workload_id="wl-ab", network="100.64.1.0/25", replica=replica, replicas=2, gpus=1,
        public_key_pem=overlays.key.public_pem, now=time.time(),
    )  # fmt: skip
    return overlays, overlay
