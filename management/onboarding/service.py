"""What the onboarding routes and the console's "Add a host" page ask of the grid, in one object."""

from __future__ import annotations

from pathlib import Path

from management.onboarding.package import AgentPackage
from management.onboarding.script import InstallCommand, install_commands, installer_template, served_script
from master.port import MasterPort

PACKAGE_CACHE = "dist"  # under the Master's state directory


class Onboarding:
    def __init__(self, master: MasterPort, package: AgentPackage | None = None) -> None:
        self._master = master
        wheel = master.config.agent_wheel
        self.package = package or AgentPackage(master.config.state_path / PACKAGE_CACHE, prebuilt=Path(wheel) if wheel else None)

    def access_url(self) -> str:
        """A relay's enrollment URL for new hosts: the first linked relay (by id) that told its HTTPS URL; "" if none."""
        urls = self._master.enrollment_urls()
        return urls[0][1] if urls else ""

    def install_script(self, grid_url: str) -> str:
        """The installer filled in for a host that fetched it from ``grid_url``; PackageUnavailable when it cannot be."""
        return served_script(installer_template(), grid_url=grid_url, access_url=self.access_url(), wheel=self.package.filename)

    def ca_pem(self) -> bytes:
        return self._master.ca_chain_pem()

    def commands(self, grid_url: str, token: str) -> list[InstallCommand]:
        return install_commands(grid_url, token)
