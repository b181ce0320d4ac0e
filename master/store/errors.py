"""Errors of the store."""

from __future__ import annotations

from common.errors import Conflict, IdlegridError


class UnstorableRecord(IdlegridError):
    """A record the store refuses to write, because it could not be read back as it was written."""

    code = "unstorable_record"


class DuplicateSecret(Conflict):
    """A new secret whose name the account already uses: secrets are never overwritten in place (delete it first)."""
