"""Errors of the store."""

from __future__ import annotations

from common.errors import IdlegridError


class UnstorableRecord(IdlegridError):
    """A record the store refuses to write, because it could not be read back as it was written."""

    code = "unstorable_record"
