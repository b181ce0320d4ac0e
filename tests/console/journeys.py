"""What the console's journeys on a real grid share: a console password for an account (set by the operator through
the API, as a deployment would), and signing in through the form with a screenshot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.grid import Grid


def give_password(grid: Grid, account: str, password: str) -> None:
    status, body = grid.call("PUT", f"/api/v1/accounts/{account}/password", {"password": password})
    assert status == 200, (status, body)


def sign_in(page: Any, grid: Grid, account: str, password: str, shot: Callable[[Any, str], Path]) -> None:
    page.goto(f"{grid.api_url}/console/")
    page.get_by_label("Account").fill(account)
    page.get_by_label("Password").fill(password)
    shot(page, "sign-in")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/console/signin" not in url)
