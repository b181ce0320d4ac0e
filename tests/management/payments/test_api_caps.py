"""Spend caps through the API on a real Master (SQLite): a renter sets its own caps (no payment provider needed),
reads them with what it spent, removes them; hostile caps (negative, zero, huge, malformed, too many, a project's cap
naming none) are refused with the reason and change nothing; another account's caps are not the renter's to set or
read, and a provider has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from master.config import MasterConfig
from tests.management.hosts import api_key
from tests.support.operator_api import OperatorApi, operator_api

CAPS = "/api/v1/billing/caps"
SETTINGS = "/api/v1/billing/settings"


async def put_caps(api: OperatorApi, caps: Any, headers: dict[str, str], **extra: Any) -> tuple[int, dict[str, Any]]:
    answer = await api.put(CAPS, json={"caps": caps, **extra}, headers=headers)
    return answer.status, await answer.json()


async def test_a_renter_sets_reads_and_removes_its_caps(tmp_path: Path) -> None:
    async with operator_api(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)) as api:
        ann = await api_key(api.master, "renter", "ann")
        caps = [
            {"window": "hour", "limit": "2.50"},
            {"window": "month", "limit": "100", "hard": True},
            {"scope": "project", "project": "train", "window": "hour", "limit": "1", "hard": True},
        ]
        status, shown = await put_caps(api, caps, ann)
        assert status == 200, shown
        assert [(c["scope"], c["project"], c["window"], c["limit"], c["hard"]) for c in shown["caps"]] == [
            ("account", None, "hour", "2.50", False),
            ("account", None, "month", "100.00", True),
            ("project", "train", "hour", "1.00", True),
        ]
        read = await (await api.get(SETTINGS, headers=ann)).json()
        assert [c["limit"] for c in read["caps"]] == ["2.50", "100.00", "1.00"]
        status, shown = await put_caps(api, [], ann)
        assert status == 200 and shown["caps"] == []


async def test_hostile_caps_are_refused_with_the_reason_and_change_nothing(tmp_path: Path) -> None:
    async with operator_api(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)) as api:
        ann = await api_key(api.master, "renter", "ann")
        await put_caps(api, [{"window": "hour", "limit": "5"}], ann)
        for caps, why in [
            ([{"window": "hour", "limit": "-5"}], "more than 0"),
            ([{"window": "hour", "limit": "0"}], "more than 0"),
            ([{"window": "hour", "limit": "99999999999"}], "at most"),
            ([{"window": "hour", "limit": "1e3"}], "limit"),
            ([{"window": "hour", "limit": "0.0000001"}], "limit"),
            ([{"window": "week", "limit": "5"}], "window"),
            ([{"scope": "project", "window": "hour", "limit": "5"}], "names its project"),
            ([{"window": "hour", "limit": "5"}, {"window": "hour", "limit": "6"}], "same scope, window and kind"),
            ([{"window": "hour", "limit": str(n + 1), "scope": "project", "project": f"p{n}"} for n in range(21)], "20"),
            ("not a list", "caps"),
        ]:
            status, said = await put_caps(api, caps, ann)
            assert status == 400 and why in said["error"]["message"], (caps, said)
        read = await (await api.get(SETTINGS, headers=ann)).json()
        assert [c["limit"] for c in read["caps"]] == ["5.00"]  # as before


async def test_another_account_s_caps_are_not_the_renter_s_and_a_provider_has_none(tmp_path: Path) -> None:
    async with operator_api(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)) as api:
        ann = await api_key(api.master, "renter", "ann")
        await api_key(api.master, "renter", "bob")
        acme = await api_key(api.master, "provider", "acme")
        status, said = await put_caps(api, [{"window": "hour", "limit": "1", "hard": True}], ann, account="bob")
        assert status == 403, said
        assert (await api.get(SETTINGS, params={"account": "bob"}, headers=ann)).status == 403
        status, said = await put_caps(api, [{"window": "hour", "limit": "1"}], acme)
        assert status == 403, said
        status, said = await put_caps(api, [{"window": "hour", "limit": "1"}], api.auth, account="acme")
        assert status == 409 and "renter" in said["error"]["message"], said  # the operator may, for renters only
        status, said = await put_caps(api, [{"window": "hour", "limit": "1", "hard": True}], api.auth, account="bob")
        assert status == 200, said
        bob = await (await api.get(SETTINGS, params={"account": "bob"}, headers=api.auth)).json()
        assert [c["limit"] for c in bob["caps"]] == ["1.00"]
        status, said = await put_caps(api, [{"window": "hour", "limit": "1"}], api.auth, account="nobody")
        assert status == 404, said
