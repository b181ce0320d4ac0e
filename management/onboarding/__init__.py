"""Providers onboard from the grid itself (docs/onboarding.md): the Master serves the installer (``/install.sh``,
filled in with the grid's URL, a relay and the agent's package name), the platform CA (``/ca.crt``) and the agent's
package (``/dist/<wheel>``, built from the source this Master runs); the console's "Add a host" page gives a
provider a fresh join token and the command that uses it."""

from management.onboarding.package import AgentPackage, PackageUnavailable
from management.onboarding.script import InstallCommand, install_commands, served_script

__all__ = ["AgentPackage", "InstallCommand", "PackageUnavailable", "install_commands", "served_script"]
