"""``asyncssh``, as the agent's SSH end imports it (agent/ssh_server.py, agent/ssh_files.py).

asyncssh 2.24 names cryptography's DSA classes at module load (in type aliases and signatures), and cryptography 51
deprecated DSA: every process that imported asyncssh printed ten lines of ``CryptographyDeprecationWarning`` on its
stderr, which a provider reads as something wrong with the agent (and the CLI's one-line errors stopped being one
line). The warning is about asyncssh's code, not anything the agent does: the agent never makes or accepts DSA keys
(its host keys are Ed25519, renters' keys are matched by fingerprint). So exactly that warning, raised from asyncssh's
modules, is silenced for the life of the process (attribute reads later on warn too); every other warning shows.
Remove this once asyncssh stops touching DSA at import (see constraints.txt for the version in use).
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

warnings.filterwarnings("ignore", message="DSA is deprecated", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")

import asyncssh  # noqa: E402 (the filter must be in place first)

__all__ = ["asyncssh"]
