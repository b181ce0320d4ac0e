"""Every refusal and failure: ``{"error": {"code", "message"}}`` (management/http/errors.py raises and writes it)."""

from __future__ import annotations

from management.views.base import View


class ErrorDetail(View):
    code: str  # "not_found", "bad_request", "rate_limited", ... (errors.STATUS_OF_CODE)
    message: str  # for a person: what was wrong and, where it can, what to do


class Error(View):
    """Every refusal and failure: ``{"error": {"code", "message"}}`` (management/http/errors.py)."""

    error: ErrorDetail
