"""What a failed create may tell the renter: the engine's words without the container's secrets or the host's paths.

A create that fails (a pull refused, a mount that cannot be made, a command the runtime cannot start) answers with the
engine's message, which the Master shows the renter as the workload's ``state_reason``. That message can quote what it
was given: an env value (the renter's secrets, ``${secret:…}`` resolved by the Master), the registry password, the
storage keys, and this host's directories (its state, data and work directories, which say how the provider laid out
the machine). ``redact`` takes them out before the result leaves the host, so neither the command record nor the renter
ever holds them. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from common.containers import ContainerSpec

MIN_SECRET_CHARS = 4  # shorter values ("1", "on") would blank ordinary words; a secret is longer than this
HIDDEN = "<hidden>"


def secrets_of(spec: ContainerSpec) -> list[str]:
    """Every value of ``spec`` that is the renter's secret: its env's values, the registry password, the storage keys, an
    endpoint worker's token."""
    found = list(spec.env.values())
    if spec.endpoint_worker is not None:
        found.append(spec.endpoint_worker.token)
    if spec.registry_auth is not None:
        found.append(spec.registry_auth.password)
    if spec.storage is not None:
        keys = spec.storage.credentials
        found += [keys.access_key_id, keys.secret_access_key, keys.session_token]
    return found


def redact(text: str, secrets: Iterable[str], paths: Mapping[str, str]) -> str:
    """``text`` with each secret (of at least MIN_SECRET_CHARS) replaced by HIDDEN and each path (a key of ``paths``)
    by its label, e.g. ``{"/var/lib/idlegrid/agent": "<agent state>"}``. Longest first, so a secret or path that contains
    another is taken out whole, in one pass (a label put in is not searched again)."""
    words = {s: HIDDEN for s in secrets if len(s) >= MIN_SECRET_CHARS}
    words |= {p.rstrip("/"): label for p, label in paths.items() if len(p.rstrip("/")) > 1}
    if not words:
        return text
    # One pass, longest first: what was put in is never searched again.
    pattern = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
    return pattern.sub(lambda m: words[m.group(0)], text)
