"""Why the agent stops (or refuses to start), each with what to do about it; the CLI prints the message and exits
with ``exit_code``, so a service manager or a script can tell "enroll again" from "fix the settings"."""

from __future__ import annotations

from websockets.frames import Close

from common.errors import ConfigError, IdlegridError, SignatureError
from common.wire import CLOSE_POLICY, CLOSE_REVOKED

# Exit codes of `idlegrid agent`. 2 is every other IdlegridError (bad settings, not enrolled): the CLI's default.
EXIT_CERTIFICATE_REVOKED = 3
REVOKED_REASON = "certificate revoked"  # the close reason relays give with CLOSE_POLICY for a revoked certificate


class CertificateRevoked(IdlegridError):
    """The platform revoked this agent's certificate: no relay will take it again, so retrying cannot help."""

    code = "certificate_revoked"
    exit_code = EXIT_CERTIFICATE_REVOKED

    def __init__(self, message: str = "certificate revoked: enroll again") -> None:
        super().__init__(message)


class SimulationSpecError(ConfigError, ValueError):
    """A ``--simulate`` spec that names no known GPU model or count; the message is one line saying which part."""

    code = "bad_simulate_spec"


class UnansweredCopy(SignatureError):
    """A copy of a command that does not verify, of an id this host started and did not finish (a restart cut the run
    short): the copy neither resumes nor ends that run, so there is no result to send. An intact copy resumes it."""


class UnknownGpu(IdlegridError):
    """A command names a GPU this host does not have (by UUID or index)."""

    code = "unknown_gpu"


class GpuConflict(IdlegridError):
    """A command names a GPU that another running container of this agent holds."""

    code = "gpu_conflict"


def is_revocation(close: Close | None) -> bool:
    """Whether a relay closed the connection because the certificate is revoked: CLOSE_REVOKED, or the CLOSE_POLICY
    with its "certificate revoked" reason that relays sent before CLOSE_REVOKED existed."""
    if close is None:
        return False
    return close.code == CLOSE_REVOKED or (close.code == CLOSE_POLICY and REVOKED_REASON in close.reason)
