"""Console sessions: an encrypted cookie (aiohttp-session), who is signed in, and the CSRF token.

The cookie holds, encrypted and authenticated with a key kept in the Master's state dir (0600, made on first start):
a random session id, a CSRF token, and once signed in the account id, its password epoch and when the sign-in was.
Every console request reads the account again: a disabled account, a changed password (the epoch moved on) or a
session older than ``ConsoleSettings.session_lifetime_s`` is signed out there and then. The cookie is HttpOnly and
SameSite=Strict.

Its name is one nothing else on the host can shadow where the browser allows it: over https (``cookie_secure``)
``__Host-idlegrid_console``, Secure, ``Path=/`` and no Domain, which a browser takes only from a secure origin of this
very host, and which no sibling subdomain can set or narrow. Over plain http (the local demo) it stays
``idlegrid_console`` with ``Path=/console``. Cookies ignore ports, so a workload's link on another port of the same host
could still try to plant one: the links' proxy drops every Set-Cookie of a platform name (management/http/cookies.py),
and a request that carries the console's cookie twice (a second one scoped to a longer path, which is all a link's
script could add beside an HttpOnly cookie) is treated as carrying none: the console never picks one of two.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp_session import Session, get_session
from aiohttp_session.cookie_storage import EncryptedCookieStorage
from cryptography.fernet import Fernet

from common.errors import NotFound
from management.access_control import AccountRole, Action, Principal, Resource, Scope, scope_for
from management.http.cookies import cookie_pairs
from master.port import AccountRecord, ConsoleSettings

COOKIE_NAME = "idlegrid_console"  # over plain http, Path=/console
SECURE_COOKIE_NAME = "__Host-idlegrid_console"  # over https: Secure, Path=/, no Domain (the browser enforces all three)
KEY_FILE = "console-session.key"
CSRF_FIELD = "csrf_token"  # the hidden field every console form carries
CSRF_HEADER = "X-CSRF-Token"  # what htmx and the console's scripts send instead

SIGNED_IN_KEY = web.RequestKey("console_account", AccountRecord)


class SignInRequired(Exception):
    """A page that needs a signed-in account was asked for without one (the console answers with the sign-in page)."""


def session_key(state_dir: Path) -> bytes:
    """The cookie encryption key: read from the state dir, or made there (0600) on first start."""
    path = state_dir / KEY_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    key = Fernet.generate_key()
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another start made it meanwhile
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as fh:
        fh.write(key + b"\n")
    return key


class ConsoleCookieStorage(EncryptedCookieStorage):
    """The encrypted cookie, its name, path and Secure flag decided per request when ``cookie_secure`` is "auto"."""

    def __init__(self, key: bytes, settings: ConsoleSettings) -> None:
        super().__init__(
            Fernet(key),
            cookie_name=COOKIE_NAME,
            max_age=int(settings.session_lifetime_s),
            path="/console",
            httponly=True,
            samesite="Strict",
            secure=settings.cookie_secure == "always",
        )
        self._secure_mode = settings.cookie_secure

    def secure_for(self, request: web.Request) -> bool:
        """Whether this request's cookie is the Secure ``__Host-`` one."""
        return self._secure_mode == "always" or (self._secure_mode == "auto" and request.secure)

    def load_cookie(self, request: web.Request) -> str | None:
        """The session cookie's value; None without one, and None when the cookie comes more than once (another one
        of its name, with a longer path, was set beside it by someone else: neither is trusted)."""
        name = SECURE_COOKIE_NAME if self.secure_for(request) else COOKIE_NAME
        sent = sum(1 for key, _ in cookie_pairs(request.headers.getall("Cookie", [])) if key == name)
        return request.cookies.get(name) if sent == 1 else None  # aiohttp's reading: the value unquoted

    async def save_session(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        secure = self.secure_for(request)
        name, path = (SECURE_COOKIE_NAME, "/") if secure else (COOKIE_NAME, "/console")
        if session.empty:
            response.del_cookie(name, path=path, secure=secure, httponly=True, samesite="Strict")
            return
        data = self._fernet.encrypt(self._encoder(self._get_session_data(session)).encode("utf-8")).decode("utf-8")
        response.set_cookie(name, data, max_age=self.max_age, path=path, secure=secure, httponly=True, samesite="Strict")

    def retire_plain_cookie(self, request: web.Request, response: web.StreamResponse) -> None:
        """Over https, a plain ``idlegrid_console`` cookie (from before the ``__Host-`` name, or planted by a link on
        another port) is never read, only cleared: its owner signs in once more."""
        if self.secure_for(request) and not response.prepared and COOKIE_NAME in request.cookies:
            response.del_cookie(COOKIE_NAME, path="/console")


@dataclass(frozen=True)
class SessionState:
    """What one console session holds (the cookie's content, decrypted)."""

    sid: str
    csrf: str
    account: str | None
    epoch: int
    since: float


async def session_state(request: web.Request) -> SessionState:
    """This request's session, given an id and a CSRF token if it had none."""
    session = await get_session(request)
    if "sid" not in session or "csrf" not in session:
        session["sid"] = secrets.token_urlsafe(16)
        session["csrf"] = secrets.token_urlsafe(32)
    return SessionState(
        sid=session["sid"],
        csrf=session["csrf"],
        account=session.get("account"),
        epoch=int(session.get("epoch", 0)),
        since=float(session.get("since", 0.0)),
    )


async def begin(request: web.Request, account: AccountRecord) -> None:
    """Sign ``account`` in: a new session (new id and CSRF token: nothing of the anonymous one is kept)."""
    session = await get_session(request)
    session.invalidate()
    session = await get_session(request)  # a fresh one, saved in place of the old
    session["sid"] = secrets.token_urlsafe(16)
    session["csrf"] = secrets.token_urlsafe(32)
    session["account"] = account.id
    session["epoch"] = account.password_epoch
    session["since"] = time.time()
    request[SIGNED_IN_KEY] = account


async def end(request: web.Request) -> None:
    """Sign out: the cookie is cleared."""
    session = await get_session(request)
    session.invalidate()


async def flash(request: web.Request, message: str) -> None:
    """A one-line notice shown at the top of the next page rendered in this session."""
    session = await get_session(request)
    session["flash"] = [*session.get("flash", []), message][-5:]


async def take_flashes(request: web.Request) -> list[str]:
    session = await get_session(request)
    return list(session.pop("flash", []))


def signed_in_account(request: web.Request) -> AccountRecord:
    """The account signed in for this request; SignInRequired when there is none."""
    account = request.get(SIGNED_IN_KEY)
    if account is None:
        raise SignInRequired()
    return account


async def signed_in(request: web.Request, resource: Resource, action: Action) -> Scope:
    """The scope a console page acts in, decided by the rules the API reads too (management/access_control.py) for the signed-in
    account: SignInRequired without one, Forbidden when its role may not ``action`` ``resource``."""
    account = signed_in_account(request)
    state = await session_state(request)
    try:
        role = AccountRole(account.role)
    except ValueError:
        raise NotFound(f"account {account.id!r} has role {account.role!r}, which the console does not know") from None
    principal = Principal(name="console", role=role, account=account.id, key_id="", key_hash=f"session:{state.sid}")
    return scope_for(principal, resource, action)
