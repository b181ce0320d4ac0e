"""The gang overlay's lighthouse for tests' local grids: management/devgrid/lighthouse.py is its one home (the demo runs
it too), started through the launcher (``Grid.start_lighthouse``, closed by ``Grid.stop``)."""

from __future__ import annotations

from management.devgrid.lighthouse import LIGHTHOUSE_ADDRESS, LIGHTHOUSE_PORT, Lighthouse, lighthouse_unavailable, overlay_toml

__all__ = ["LIGHTHOUSE_ADDRESS", "LIGHTHOUSE_PORT", "Lighthouse", "lighthouse_unavailable", "overlay_toml"]
