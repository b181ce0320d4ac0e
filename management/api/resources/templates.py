"""Launch templates (docs/templates.md): ``GET /api/v1/templates`` and ``GET /api/v1/templates/{name}``, each with the
workload spec it launches. Every account reads them; launching one is an ordinary submit (or rent) of that spec."""

from __future__ import annotations

from aiohttp import web

from management.http.keys import SERVICES_KEY
from management.http.requests import json_response
from management.views.templates import template_list_view, template_view


async def list_templates(request: web.Request) -> web.Response:
    return json_response(template_list_view(request.app[SERVICES_KEY].templates.list_templates()))


async def get_template(request: web.Request) -> web.Response:
    return json_response(template_view(request.app[SERVICES_KEY].templates.get_template(request.match_info["name"])))
