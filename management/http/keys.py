"""The keys under which an aiohttp app holds what the API's handlers and the console's pages call."""

from __future__ import annotations

from aiohttp import web

from management.services import Services

SERVICES_KEY = web.AppKey("services", Services)
