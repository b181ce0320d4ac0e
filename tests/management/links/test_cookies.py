"""Which cookies a link's container may set in the visitor's browser, and which of the visitor's cookies it is given
(management/http/cookies.py, carried out by management/links/proxy.py). Cookies ignore ports, so a cookie a link sets
for its host reaches the console's listener too: only cookies of the link's own path, not named like the platform's,
without a Domain, may pass."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from management.http.cookies import (
    cookie_header_without_platform,
    default_path,
    is_platform_cookie,
    judge_set_cookie,
    parse_set_cookie,
)

LINK = "/w/wl-0a1b-8888/"
PAGE = "/w/wl-0a1b-8888/tree/notebook.ipynb"  # where the browser was when the answer came


def judged(line: str, *, scope: str = LINK, request_path: str = PAGE) -> str:
    return judge_set_cookie(line, scope=scope, request_path=request_path)


@pytest.mark.parametrize(
    "line",
    [
        "_xsrf=2|abc; Path=/w/wl-0a1b-8888/",
        "session=1; Path=/w/wl-0a1b-8888/api; HttpOnly; SameSite=Lax",
        "session=1; Path=/w/wl-0a1b-8888",  # path-match sends it to the link only, never to /w/wl-0a1b-88880
        "theme=dark",  # no Path: the page's directory, /w/wl-0a1b-8888/tree
        "theme=dark; Path=relative",  # an invalid Path is the default one too
        "t=1; Expires=Wed, 21 Oct 2037 07:28:00 GMT; Max-Age=60; Secure",
        "__Host-app=1; Path=/w/wl-0a1b-8888/; Secure",  # a prefixed name of the app's own (the browser refuses it anyway)
    ],
)
def test_a_cookie_of_the_links_own_path_passes(line):
    assert judged(line) == ""


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("idlegrid_console=stolen; Path=/console", "platform's cookie name"),
        ("idlegrid_console=stolen; Path=/w/wl-0a1b-8888/", "platform's cookie name"),  # however narrow
        ("IDLEGRID_Console=x", "platform's cookie name"),
        ("__Host-idlegrid_console=x; Path=/; Secure", "platform's cookie name"),
        ("__secure-idlegrid_console=x; Path=/w/wl-0a1b-8888/; Secure", "platform's cookie name"),
        (" idlegrid_link =igl_x; Path=/w/wl-0a1b-8888/", "platform's cookie name"),
        ("idlegrid_anything=1", "platform's cookie name"),
        ("theme=dark; Path=/", "leaves the link"),
        ("theme=dark; Path=/console", "leaves the link"),
        ("theme=dark; Path=/w/", "leaves the link"),
        ("theme=dark; Path=/w/wl-0a1b-888", "leaves the link"),  # a prefix of the name, not of the path
        ("theme=dark; Path=/w/wl-0a1b-88889/", "leaves the link"),  # another link
        ("theme=dark; Path=/W/wl-0a1b-8888/", "leaves the link"),  # paths match case-sensitively
        ("theme=dark; Path=/w/wl-0a1b-8888/; Path=/", "leaves the link"),  # the last Path counts
        ("theme=dark; Domain=127.0.0.1; Path=/w/wl-0a1b-8888/", "Domain"),
        ("theme=dark; domain=.example.net; Path=/w/wl-0a1b-8888/", "Domain"),
        ("theme=dark; Domain=; Path=/w/wl-0a1b-8888/", "Domain"),
        ("idlegrid_console", "cannot be read"),  # a nameless cookie: its value would be sent as that name
        ("=idlegrid_console=x; Path=/console", "cannot be read"),
        ("theme=da\x00rk; Path=/", "cannot be read"),
        ("theme=dark; Path=/w/wl-0a1b-8888/\x01; Path=/", "cannot be read"),
    ],
)
def test_a_platform_name_a_domain_a_path_outside_the_link_or_junk_is_dropped(line, why):
    assert why in judged(line)


def test_without_a_path_a_cookie_is_scoped_by_the_page_it_came_with():
    assert judged("a=1", request_path="/w/wl-0a1b-8888/") == ""  # default path /w/wl-0a1b-8888: still the link's
    assert judged("a=1", request_path="/w/wl-0a1b-8888/a/b") == ""
    assert "leaves the link" in judged("a=1", request_path="/w/wl-0a1b-8888")  # /w: every link's
    assert "leaves the link" in judged("a=1", request_path="/w/wl-0a1b-8888%2F..%2F..%2Fconsole/x")  # raw, as sent
    assert default_path("/") == "/" and default_path("/x") == "/" and default_path("/a/b/c") == "/a/b"


def test_on_a_links_own_host_any_path_passes_but_never_a_domain_or_a_platform_name():
    assert judged("theme=dark; Path=/", scope="/", request_path="/lab") == ""
    assert judged("theme=dark", scope="/", request_path="/") == ""
    assert "Domain" in judged("theme=dark; Domain=links.example.net", scope="/", request_path="/")
    assert "platform's" in judged("idlegrid_link=x; Path=/", scope="/", request_path="/")


def test_the_platforms_cookies_are_taken_off_what_the_container_is_sent():
    sent = [
        "idlegrid_console=A-session; _xsrf=2|abc; __Host-idlegrid_console=A2",
        "idlegrid_link=igl_tok; theme=dark; Idlegrid_Console=x; odd",
    ]
    assert cookie_header_without_platform(sent) == "_xsrf=2|abc; theme=dark"
    assert cookie_header_without_platform(["idlegrid_console=only"]) == ""


@given(st.text(alphabet=st.characters(codec="latin-1"), max_size=80), st.sampled_from([LINK, "/"]))
def test_whatever_a_container_sends_a_cookie_that_passes_is_its_own(line, scope):
    if judged(line, scope=scope) == "":
        cookie = parse_set_cookie(line)
        assert cookie is not None and not is_platform_cookie(cookie.name) and not cookie.has_domain
        path = cookie.path or default_path(PAGE)
        assert path.startswith(scope) or path == scope.rstrip("/")
