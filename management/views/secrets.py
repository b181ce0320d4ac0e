"""Secrets' answers: a secret's name, when it was created and its size; never its value (management/services/secrets.py
hands out ``SecretListing``, which cannot carry it)."""

from __future__ import annotations

from management.services.secrets import SecretListing
from management.views.base import View, rfc3339


class SecretView(View):
    name: str
    created_at: str
    size: int  # the value's length in bytes


class DeletedSecret(View):
    name: str
    deleted: bool  # always true: a secret not there answers 404


class SecretList(View):
    items: list[SecretView]


def secret_view(s: SecretListing) -> SecretView:
    return SecretView(name=s.name, created_at=rfc3339(s.created_at) or "", size=s.size)


def secret_list_view(items: list[SecretListing]) -> SecretList:
    return SecretList(items=[secret_view(s) for s in items])


def deleted_secret_view(name: str) -> DeletedSecret:
    return DeletedSecret(name=name, deleted=True)
