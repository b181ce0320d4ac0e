"""The third-party browser code the console uses, served by the Master from management/console/node_modules/.

scripts/setup-env installs it from the npm registry (``npm ci --omit=dev``, pinned by package-lock.json); only the
files named here are served, at /console/vendor/NAME. Without npm the pages still work as plain HTML: the charts and
the terminal say they need it.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

NODE_MODULES = Path(__file__).parent / "node_modules"

# What the pages load -> where the npm package keeps it.
VENDOR_FILES: dict[str, str] = {
    "htmx.min.js": "htmx.org/dist/htmx.min.js",
    "uPlot.iife.min.js": "uplot/dist/uPlot.iife.min.js",
    "uPlot.min.css": "uplot/dist/uPlot.min.css",
    "xterm.js": "@xterm/xterm/lib/xterm.js",
    "xterm.css": "@xterm/xterm/css/xterm.css",
    "addon-fit.js": "@xterm/addon-fit/lib/addon-fit.js",
}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css"}


def vendor_available() -> bool:
    return all((NODE_MODULES / relative).is_file() for relative in VENDOR_FILES.values())


async def vendor_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    relative = VENDOR_FILES.get(name)
    if relative is None:
        raise web.HTTPNotFound(text=f"no vendored file {name!r}")
    path = NODE_MODULES / relative
    if not path.is_file():
        raise web.HTTPNotFound(text=f"{name} is not installed: run scripts/setup-env (it needs npm)")
    response = web.FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})
    response.content_type = CONTENT_TYPES[path.suffix]
    return response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/vendor/{name}", vendor_file)
    router.add_static("/console/static", Path(__file__).parent / "static", append_version=True, name="console_static")
