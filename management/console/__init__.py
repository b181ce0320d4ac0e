"""The web console: server-rendered pages served by the Master beside the API, from the same origin (docs/console.md).

``add_console`` wires it into the API's aiohttp application: templates (aiohttp-jinja2), the encrypted session cookie
(aiohttp-session), the console's middleware (who is signed in, CSRF, security headers, errors as pages), the vendored
browser code and our own static files, and every page module in ``management.console.pages``. Pages call only the
services (management/services/); what an account may do is decided by management/access_control.py.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections.abc import Callable
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp_session import session_middleware

from management.console import assets, pages
from management.console.middleware import console_middleware
from management.console.nav import NavItem
from management.console.pages.signin import THROTTLE_KEY
from management.console.rendering import NAV_KEY
from management.console.session import CSRF_FIELD, CSRF_HEADER, ConsoleCookieStorage, session_key
from management.console.templating import FILTERS
from management.console.throttle import SignInThrottle
from management.http.keys import SERVICES_KEY
from management.services import Services
from master.port import ConsoleSettings

__all__ = ["add_console"]

# aiohttp 3.14 warns, once per key, when a request's state is keyed by a string; aiohttp-session 2.12 keys its session
# that way. The Master's operator would read that line under every first sign-in, about a library's code, not ours
# (ours uses typed keys). Exactly that warning from aiohttp-session's modules is silenced; every other one shows.
warnings.filterwarnings("ignore", category=web.NotAppKeyWarning, module=r"aiohttp_session(\.|$)")

TEMPLATES = Path(__file__).parent / "templates"


def _page_modules() -> list[object]:
    return [importlib.import_module(f"{pages.__name__}.{info.name}") for info in pkgutil.iter_modules(pages.__path__)]


def add_console(app: web.Application, services: Services, settings: ConsoleSettings, *, state_dir: Path) -> None:
    """Serve the console from ``app`` (the API's application, before it starts); the session key lives in
    ``state_dir``. ``services`` must be the ones ``app`` serves (the pages read them from the app)."""
    if not settings.enabled:
        return
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(TEMPLATES),
        filters=FILTERS,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(
        csrf_field=CSRF_FIELD, csrf_header=CSRF_HEADER, vendor_available=assets.vendor_available(), static=_static_url(app)
    )
    storage = ConsoleCookieStorage(session_key(state_dir), settings)
    app.middlewares.append(session_middleware(storage))
    app.middlewares.append(console_middleware(settings, storage))
    app[THROTTLE_KEY] = SignInThrottle(settings.signin_burst, settings.signin_per_minute)
    nav: list[NavItem] = []
    assets.add_routes(app.router)
    for module in _page_modules():
        module.add_routes(app.router)  # type: ignore[attr-defined]
        nav.extend(getattr(module, "NAV", []))
    app[NAV_KEY] = nav
    if SERVICES_KEY not in app:  # pages read the services from the app, as the API's handlers do
        app[SERVICES_KEY] = services


def _static_url(app: web.Application) -> Callable[[str], str]:
    def static(name: str) -> str:
        return str(app.router["console_static"].url_for(filename=name))

    return static
