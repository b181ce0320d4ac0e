"""``GET /install.sh``, ``/ca.crt`` and ``/dist/<wheel>``: what a provider's host fetches, with no key (the join token
in the command is what admits it). Outside /api/, so no API key is asked for; a standby Master answers 503 as for
every route (management/app.py)."""

from __future__ import annotations

from aiohttp import web

from management.http.errors import error_response
from management.http.keys import SERVICES_KEY
from management.onboarding.package import PackageUnavailable

SCRIPT_TYPE = "text/x-shellscript"
WHEEL_TYPE = "application/zip"  # a wheel is a zip archive (PEP 427)


def grid_url(request: web.Request) -> str:
    """The Master's URL as the host reached it (scheme and Host header): where the installer fetches the rest."""
    return str(request.url.origin())


async def install_script(request: web.Request) -> web.Response:
    onboarding = request.app[SERVICES_KEY].onboarding
    try:
        text = onboarding.install_script(grid_url(request))
    except PackageUnavailable as exc:
        return error_response(503, "agent_package_unavailable", str(exc))
    return web.Response(text=text, content_type=SCRIPT_TYPE, headers={"Cache-Control": "no-store"})


async def ca_certificate(request: web.Request) -> web.Response:
    pem = request.app[SERVICES_KEY].onboarding.ca_pem()
    return web.Response(body=pem, content_type="application/x-pem-file")


async def agent_wheel(request: web.Request) -> web.StreamResponse:
    package = request.app[SERVICES_KEY].onboarding.package
    try:
        name = package.filename
        if request.match_info["name"] != name:
            return error_response(404, "not_found", f"no such package here; this grid serves /dist/{name}")
        path = await package.path()
    except PackageUnavailable as exc:
        return error_response(503, "agent_package_unavailable", str(exc))
    return web.FileResponse(path, headers={"Content-Type": WHEEL_TYPE})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/install.sh", install_script)
    router.add_get("/ca.crt", ca_certificate)
    router.add_get("/dist/{name}", agent_wheel)
