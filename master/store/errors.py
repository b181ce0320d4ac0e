"""Errors of the store."""

from __future__ import annotations

from common.errors import Conflict, IdlegridError


class UnstorableRecord(IdlegridError):
    """A record the store refuses to write, because it could not be read back as it was written."""

    code = "unstorable_record"


class StaleWorkload(Conflict):
    """A workload write that named a version other than the stored one: someone else wrote it first. Read it again."""


class DuplicateWorkload(Conflict):
    """A new workload whose id is already stored."""


class DuplicateSecret(Conflict):
    """A new secret whose name the account already uses: secrets are never overwritten in place (delete it first)."""
