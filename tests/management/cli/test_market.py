"""The market's commands against a real Master with its API (in a thread of this process), through the CLI's own entry
point, read as a person reads them: ``offers search``, ``rent``, ``bid``, ``credit``, ``balance``, ``ledger`` (and
``--csv``), ``spend``, ``earnings``, ``payouts``. The hosts are simulated (no GPU here)."""

from __future__ import annotations

import asyncio
import json

import pytest

from management.cli import main as cli
from management.cli.market import runway
from management.cli.workloads import balance_lasting
from tests.management.cli.test_accounts import idlegrid, served  # noqa: F401  # the served Master and the CLI runner
from tests.management.hosts import add_agent, api_key


def in_master(served, coro):  # noqa: F811
    return asyncio.run_coroutine_threadsafe(coro, served.loop).result(timeout=30)


@pytest.fixture
def keys(served) -> dict[str, str]:  # noqa: F811
    """Provider acme with a priced 2-GPU host; renter lab. The values are their API keys."""
    master = served.server.master
    in_master(served, add_agent(master, "agt-a1", "a10:2", provider="acme", runtime="docker", isolation="container"))
    found = {}
    for role, account in (("provider", "acme"), ("renter", "lab")):
        found[account] = in_master(served, api_key(master, role, account))["Authorization"].removeprefix("Bearer ")
    return found


def test_a_renter_searches_rents_and_bids_from_the_command_line(idlegrid, keys):  # noqa: F811
    idlegrid("host", "price", "set", "agt-a1", "--on-demand", "2.40", "--min-bid", "0.60", "--api-key", keys["acme"])
    table = idlegrid("offers", "search", "num_gpus>=2 price<=3", "--api-key", keys["lab"])
    header, row = table.splitlines()
    assert header.split()[:4] == ["OFFER", "MODEL", "GPUS", "VRAM"]
    assert row.split()[:3] == ["agt-a1", "a10", "2/2"] and "2.40" in row.split() and "0.60" in row.split()
    empty = idlegrid("offers", "search", "price<1", "--api-key", keys["lab"])
    assert empty.strip() == "no offers: no offer has price<1 (it is the first condition; 1 offer in all)"
    refused = idlegrid("offers", "search", "gpu_ram=>24", "--api-key", keys["lab"], ok=False)
    assert (
        refused.strip() == "idlegrid offers search: 400 bad_request: position 7: expected an operator after 'gpu_ram', found '=>'"
    )

    broke = idlegrid("rent", "agt-a1", "--image", "python:3.11", "--bid", "0.70", "--api-key", keys["lab"], ok=False)
    assert "402 insufficient_funds" in broke and "needed 0.011667 USD, the balance available is 0.00 USD" in broke, broke
    idlegrid("credit", "lab", "3.5")
    rented = idlegrid("rent", "agt-a1", "--image", "python:3.11", "--bid", "0.70", "--api-key", keys["lab"])
    first, terms, cost = rented.splitlines()
    assert first.startswith("rented agt-a1: workload wl-") and first.endswith("is queued")
    assert terms == "interruptible at your bid of 0.70 USD per GPU-hour, on hosts whose minimum bid it meets"
    assert cost == "total 0.70 USD per hour; the balance of 3.50 USD lasts about 5.0 h at that rate (nothing else runs now)"
    workload_id = first.split()[3]
    rebid = idlegrid("bid", workload_id, "0.90", "--api-key", keys["lab"])
    assert (
        rebid.strip() == f"{workload_id}: interruptible at your bid of 0.90 USD per GPU-hour, on hosts whose minimum bid it meets"
    )
    low = idlegrid("rent", "agt-a1", "--image", "python:3.11", "--bid", "0.10", "--api-key", keys["lab"], ok=False)
    assert "bid 0.10 USD is under offer agt-a1's minimum bid 0.60 USD" in low


def test_money_commands_show_balances_ledger_and_statements(idlegrid, keys):  # noqa: F811
    credited = idlegrid("credit", "lab", "12.5", "--memo", "top-up")
    assert credited.strip() == "credited lab: available 12.50 USD"
    balance = idlegrid("balance", "--api-key", keys["lab"])
    assert balance.splitlines()[:3] == [
        "account:    lab",
        "available:  12.50 USD",
        "held:       0.00 USD  (held for running rentals; what is not used returns)",
    ]
    assert "runway:     as long as nothing runs" in balance.splitlines()  # nothing runs: shown, not left out
    ledger = idlegrid("ledger", "--api-key", keys["lab"])
    header, row = ledger.splitlines()
    assert header.split() == ["SEQ", "WHEN", "KIND", "AMOUNT", "BALANCE", "WORKLOAD", "MEMO"]
    assert row.split()[3:] == ["credit", "12.50", "12.50", "-", "top-up"]
    as_csv = idlegrid("ledger", "--csv", "--api-key", keys["lab"])
    assert as_csv.endswith("\n") and as_csv.splitlines()[1].endswith("top-up,12.50,12.50")
    assert idlegrid("spend", "--api-key", keys["lab"]).strip() == "nothing spent yet"
    assert idlegrid("earnings", "--api-key", keys["acme"]).strip() == "nothing earned yet"
    assert idlegrid("payouts", "--period", "week", "--api-key", keys["acme"]).strip() == "nothing earned yet"
    as_json = json.loads(idlegrid("balance", "lab", "--json"))
    assert (as_json["available"], as_json["currency"]) == ("12.50", "USD")
    refused = idlegrid("credit", "lab", "1", "--api-key", keys["lab"], ok=False)
    assert "403" in refused and "may not write ledger" in refused


def test_the_command_after_a_double_dash_is_the_containers_and_a_command_that_runs_none_refuses_it(
    idlegrid,  # noqa: F811
    keys,
    served,  # noqa: F811
    capsys,
):
    api = ["--api", served.server.api_url, "--api-key", keys["lab"]]
    assert cli.main(["rent", "agt-a1", "--image", "python:3.11", *api, "--", "sh", "-c", "echo hi"]) == 0
    workload_id = capsys.readouterr().out.split()[3]
    shown = json.loads(idlegrid("workload", "get", workload_id, "--json", "--api-key", keys["lab"]))
    assert shown["spec"]["command"] == ["sh", "-c", "echo hi"]
    assert shown["rental"]["summary"].startswith("on demand at 0.00 USD per GPU-hour (offer agt-a1's price now)")
    with pytest.raises(SystemExit) as refused:
        cli.main(["balance", *api, "--", "sleep", "1"])
    assert refused.value.code == 2
    assert "'--' takes a container's command; 'idlegrid balance' runs none" in capsys.readouterr().err


def test_the_runway_is_said_in_hours_and_minutes_before_money_runs_out():
    assert runway(None) == "as long as nothing runs"
    assert runway(45.4) == "about 45 s, then running work is stopped (nothing destroyed)"  # once "about 0.0 hours"
    assert runway(7500.0) == "about 2 h 05 min, then running work is stopped (nothing destroyed)"
    assert runway(200_000.0).startswith("about 2 d 7 h,")


def test_how_long_the_balance_lasts_says_what_its_rate_counts():
    """Issue 37: "the balance lasts about 2.1 h at that rate" counted what already ran without saying so. The line
    names the rate and what it is made of, as ``rent`` and ``workload submit`` print it (the API's balance answer in)."""
    funds = {"account": "lab", "currency": "USD", "available": "12.00", "held": "0.50", "running_per_hour": "4.80"}
    assert balance_lasting(funds, "1.20", counted=False) == (
        "the balance of 12.50 USD lasts about 2.1 h at 6.00 USD per hour: 1.20 for this workload and 4.80 for what already runs"
    )
    assert balance_lasting(funds, "1.20", counted=True) == (
        "the balance of 12.50 USD lasts about 2.6 h at 4.80 USD per hour, the rate of all that runs now (this workload included)"
    )
    idle = funds | {"running_per_hour": "0.00"}
    assert balance_lasting(idle, "1.20", counted=False) == (
        "the balance of 12.50 USD lasts about 10.4 h at that rate (nothing else runs now)"
    )
    assert balance_lasting(idle, "0", counted=False) == ""  # nothing costs anything: no line


def test_a_rental_at_a_bid_resumes_after_preemption_by_default_and_the_flags_can_say_otherwise(idlegrid, keys, served):  # noqa: F811
    """Issue 37: `rent --bid` used to end failed when preempted (restart_policy never) while the README says it resumes."""
    # Three rentals of one GPU: a host with room for all, whether or not the scheduler has placed the first ones when the
    # next is asked for (a fresh-clone CI under load placed both of the first two on the 2-GPU host, refusing the third).
    in_master(
        served, add_agent(served.server.master, "agt-b4", "a10:4", provider="acme", runtime="docker", isolation="container")
    )
    idlegrid("credit", "lab", "5")
    bid = ("rent", "agt-b4", "--image", "python:3.11", "--bid", "0.70", "--api-key", keys["lab"])
    resumes = json.loads(idlegrid(*bid, "--json"))
    assert (resumes["spec"]["restart_policy"], resumes["spec"]["max_restarts"]) == ("on_failure", 3)
    told = json.loads(idlegrid(*bid, "--restart-policy", "never", "--json"))
    assert told["spec"]["restart_policy"] == "never"
    more = json.loads(idlegrid(*bid, "--max-restarts", "10", "--json"))
    assert (more["spec"]["restart_policy"], more["spec"]["max_restarts"]) == ("on_failure", 10)
    refused = idlegrid(*bid, "--restart-policy", "never", "--max-restarts", "2", ok=False)
    assert "--max-restarts counts restarts under --restart-policy on_failure or always" in refused, refused
