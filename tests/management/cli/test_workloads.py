"""``idlegrid workload``, run in-process against the real API of a real Master (SQLite) with a renter's key file:
what a renter types and what it reads back. The blocking CLI runs in a thread beside the server's event loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from management.cli import main as cli
from management.http.keys import SERVICES_KEY
from tests.management.hosts import add_agent, api_key
from tests.support.stored import stored_workload


@pytest.fixture
async def renter(api, tmp_path: Path):
    """``run(*args)`` runs ``idlegrid workload ARGS`` as renter alice; returns (exit status, stdout, stderr)."""
    key_file = tmp_path / "alice.key"
    key_file.write_text((await api_key(api.master, "renter", "alice"))["Authorization"].removeprefix("Bearer "))
    url = str(api.make_url("")).rstrip("/")

    async def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        argv = ["workload", *args[:1], "--api", url, "--key-file", str(key_file), *args[1:]]
        code = await asyncio.to_thread(cli.main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def test_a_renter_submits_lists_shows_and_cancels_a_workload(renter, capsys):
    code, out, err = await renter(
        "submit", "--name", "train", "--image", "ghcr.io/acme/train:1", "--gpus", "2", "--model", "h100-sxm",
        "--env", "HF_TOKEN=hf_secret", "--port", "8080", "--", "python", "train.py", "--epochs", "3", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("submitted wl-") and out.rstrip().endswith("for account alice: queued")
    workload_id = out.split()[1]

    code, out, _ = await renter("list", capsys=capsys)
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "ACCOUNT", "STATE", "REPLICAS", "GPUS", "PRIORITY", "CREATED", "REASON"]
    assert row.split()[:7] == [workload_id, "train", "alice", "queued", "1", "2", "normal"]

    code, out, _ = await renter("get", workload_id, capsys=capsys)
    assert "command:     python train.py --epochs 3" in out
    assert "env:         HF_TOKEN  (values are never shown)" in out and "hf_secret" not in out
    assert "replicas:    1 x 2 GPU (h100-sxm)" in out

    code, out, _ = await renter("cancel", workload_id, capsys=capsys)
    assert (code, out.strip()) == (0, f"{workload_id} (train): cancelled (cancelled by its owner)")
    code, out, _ = await renter("list", "--state", "queued", capsys=capsys)
    assert out.strip() == "no workloads"
    code, out, _ = await renter("get", workload_id, "--json", capsys=capsys)
    assert json.loads(out)["state"] == "cancelled"


async def test_a_spec_file_gives_every_field_and_flags_override_it(renter, capsys, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(
        'name = "sweep"\nimage = "busybox"\nreplicas = 3\npriority = "high"\n'
        '[replica]\ngpus = 1\nmin_vram_mib = 24000\n[constraints]\nregions = ["eu-west"]\nmin_reputation = 0.8\n'
    )
    code, out, err = await renter("submit", "-f", str(spec), "--replicas", "2", "--network", "none", "--json", capsys=capsys)
    assert code == 0, err
    body = json.loads(out)
    assert (body["spec"]["replicas"], body["spec"]["priority"], body["spec"]["network"]) == (2, "high", "none")
    assert body["spec"]["replica"]["min_vram_mib"] == 24000
    assert body["spec"]["constraints"] == body["spec"]["constraints"] | {"regions": ["eu-west"], "min_reputation": 0.8}


async def test_a_gang_on_a_grid_without_an_overlay_is_refused_naming_what_the_operator_runs_and_the_opt_out(renter, capsys):
    code, _, err = await renter("submit", "--name", "pair", "--image", "busybox", "--replicas", "2", capsys=capsys)

    assert code == 2
    assert "400 invalid_workload_spec: replicas: this grid runs no gang overlay" in err
    assert "idlegrid ca issue-lighthouse" in err and "[[overlay.lighthouses]]" in err and "--network none" in err


@pytest.mark.parametrize(("written", "amount"), [("0.5", "0.5"), ("2", "2"), ("0.000125", "0.000125"), ('"0.5"', "0.5")])
async def test_a_bid_written_as_a_number_in_a_spec_file_is_that_amount_of_money(renter, capsys, api, tmp_path, written, amount):
    """Issue 37: ``bid = 0.5`` in a spec file was refused ("Expected `str | null`, got `float`"). A number is the same
    exact amount the quoted text gives."""
    await api.operator.credit("alice", "5")
    spec = tmp_path / "cheap.toml"
    spec.write_text(f'name = "cheap"\nimage = "busybox"\n[rental]\nkind = "interruptible"\nbid = {written}\n')
    code, out, err = await renter("submit", "-f", str(spec), "--json", capsys=capsys)
    assert code == 0, err
    rental = json.loads(out)["rental"]
    assert (rental["kind"], rental["bid"]) == ("interruptible", amount), rental


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("NaN", "rental.bid: nan is not an amount"),  # JSON as Python reads it
        ("Infinity", "rental.bid: inf is not an amount"),
        ("-0.5", "rental.bid: -0.5 is negative: an amount is 0 or more"),
        ("0.1234567", "rental.bid: 0.1234567 has more than 6 decimals"),
        ("true", "rental.bid"),  # a boolean is no amount either (refused by the spec's own check)
    ],
)
async def test_a_bid_that_is_no_amount_of_money_is_refused_saying_why(renter, capsys, tmp_path, written, said):
    spec = tmp_path / "bad.json"
    spec.write_text(f'{{"name": "cheap", "image": "busybox", "rental": {{"kind": "interruptible", "bid": {written}}}}}')
    code, out, err = await renter("submit", "-f", str(spec), capsys=capsys)
    assert code == 2 and out == ""
    assert said in err and "Traceback" not in err, err


async def test_allow_process_runtime_is_a_flag_and_is_off_without_it(renter, capsys):
    flags = ("--name", "demo", "--image", "none", "--allow-process-runtime", "--json")
    code, out, err = await renter("submit", *flags, capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["spec"]["constraints"]["allow_process_runtime"] is True
    code, out, err = await renter("submit", "--name", "plain", "--image", "busybox", "--json", capsys=capsys)
    assert json.loads(out)["spec"]["constraints"]["allow_process_runtime"] is False


async def test_restart_policy_and_max_restarts_are_flags_and_without_them_a_plain_workload_is_never_restarted(renter, capsys):
    flags = ("--name", "retry", "--image", "busybox", "--restart-policy", "on_failure", "--max-restarts", "5", "--json")
    code, out, err = await renter("submit", *flags, capsys=capsys)
    assert code == 0, err
    assert (json.loads(out)["spec"]["restart_policy"], json.loads(out)["spec"]["max_restarts"]) == ("on_failure", 5)
    code, out, err = await renter("submit", "--name", "plain", "--image", "busybox", "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["spec"]["restart_policy"] == "never"  # the policy in force, stated in the answer


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--restart-policy", "sometimes"], "argument --restart-policy: invalid choice: 'sometimes' (choose from "),
        (["--max-restarts", "many"], "argument --max-restarts: 'many' is not a whole number of restarts"),
        (["--max-restarts", "1001"], "argument --max-restarts: 1001 restarts is out of range: give 0..1000"),
        (["--restart-policy", "never", "--max-restarts", "2"], "--max-restarts counts restarts under --restart-policy"),
    ],
)
async def test_a_bad_restart_policy_or_count_is_refused_saying_what_is_allowed(renter, capsys, args, said):
    try:
        code, out, err = await renter("submit", "--name", "x", "--image", "busybox", *args, capsys=capsys)
    except SystemExit as exc:  # argparse refuses a flag's value itself: usage and the reason on stderr, status 2
        code = int(exc.code or 0)
        out, err = capsys.readouterr()
    assert code == 2 and out == "", out
    assert said in err and "Traceback" not in err, err
    if "invalid choice" in said:
        assert all(policy in err for policy in ("never", "on_failure", "always")), err


async def test_disk_asks_for_hosts_with_that_much_free_disk_and_a_negative_one_is_refused(renter, capsys):
    code, out, err = await renter("submit", "--name", "big", "--image", "busybox", "--disk", "200", "--json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["spec"]["constraints"]["min_disk_gib"] == 200
    code, _out, err = await renter("submit", "--name", "neg", "--image", "busybox", "--disk", "-1", capsys=capsys)
    assert code != 0 and "min_disk_gib" in err


async def test_the_api_and_key_come_from_the_environment_unless_a_flag_names_them(api, renter, capsys, tmp_path, monkeypatch):
    """As for `idlegrid account`: IDLEGRID_API and IDLEGRID_API_KEY, which the demo's banner tells a renter to set."""
    await renter("submit", "--name", "mine", "--image", "busybox", capsys=capsys)  # the fixture writes alice's key file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.setenv("IDLEGRID_API", str(api.make_url("")).rstrip("/"))
    monkeypatch.setenv("IDLEGRID_API_KEY", (tmp_path / "alice.key").read_text())
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["workload", "list", "--json"]) == 0
    assert [w["name"] for w in json.loads(capsys.readouterr().out)] == ["mine"]

    monkeypatch.setenv("IDLEGRID_API_KEY", "igak_not_a_key")  # --key-file wins over the environment
    assert await asyncio.to_thread(cli.main, ["workload", "list", "--key-file", str(tmp_path / "alice.key")]) == 0
    assert "mine" in capsys.readouterr().out
    assert await asyncio.to_thread(cli.main, ["workload", "list"]) == 2
    assert "401" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--name", "x", "--image", "busybox", "--gpus", "0"], "replica.gpus"),  # checked before sending
        (["--name", "x", "--image", "busybox", "--model", "h900"], "replica.models: unknown GPU model 'h900'"),  # by the API
        (["--name", "x", "--image", "busybox", "--priority", "urgent"], "priority: unknown priority class 'urgent'"),
        (["--name", "x", "--image", "busybox", "--env", "NOEQUALS"], "KEY=VALUE"),
        (["--image", "busybox"], "name: give --name"),
        (["--name", "x", "--image", "busybox", "--max-duration-s", "nan"], "max_duration_s"),
    ],
)
async def test_a_bad_spec_is_named_in_one_line_without_a_traceback(renter, capsys, args, said):
    code, out, err = await renter("submit", *args, capsys=capsys)
    assert code == 2 and out == ""
    assert said in err and "Traceback" not in err
    assert err.startswith("idlegrid workload submit: ")


async def test_another_accounts_workload_is_not_found(renter, capsys, api):
    theirs = await api.operator.submit_workload({"name": "secret-job", "image": "busybox"}, account="bob")
    code, _, err = await renter("cancel", theirs["id"], capsys=capsys)
    assert code == 2 and f"404 not_found: no workload '{theirs['id']}'" in err


# --- why a workload waits: `workload explain` and `workload get` ---------------------------------------------------
# A real Master with three hosts of two simulated H100s each (no GPU here); the scheduling loop is run by hand.


@pytest.fixture
async def grid(api):
    for n in (1, 2, 3):
        await add_agent(api.master, f"agt-{n}", "h100:2", provider="acme", runtime="docker", isolation="container")
    return api.app[SERVICES_KEY].workloads.scheduler


async def submitted(renter, capsys, *args: str) -> str:
    code, out, err = await renter("submit", "--image", "busybox", *args, capsys=capsys)
    assert code == 0, err
    return out.split()[1]


async def explained(renter, capsys, workload_id: str) -> str:
    code, out, err = await renter("explain", workload_id, capsys=capsys)
    assert code == 0, err
    return out


async def bob_submits(api, **spec: Any) -> str:
    response = await api.post(
        "/api/v1/workloads", json={"image": "busybox"} | spec, headers=await api_key(api.master, "renter", "bob")
    )
    assert response.status == 201, await response.text()
    return (await response.json())["id"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpus", "8"], ("8 GPUs", "the most any host has that match is 2")),  # hosts have 2 each
        (["--model", "l40s"], ("no GPU on this grid is a l40s", "replica.models", "h100")),  # a model no host here has
        (["--vendor", "amd"], ("no GPU on this grid is made by amd",)),  # a ROCm image on a grid of NVIDIA hosts
    ],
)
async def test_a_workload_that_can_never_fit_on_this_grid_is_refused_at_once_saying_why(renter, capsys, grid, args, said):
    """Issue 23, money before work: never queued to wait for ever; the reason names what to change."""
    code, out, err = await renter("submit", "--image", "busybox", "--name", "too-big", *args, capsys=capsys)
    assert code == 2 and out == "", out
    assert "409 conflict: this workload can never run on this grid" in err and all(word in err for word in said), err
    code, out, _ = await renter("list", capsys=capsys)
    assert code == 0 and "too-big" not in out


async def test_explain_names_the_quota_that_holds_a_workload_back(renter, capsys, grid, api):
    response = await api.patch("/api/v1/accounts/alice", json={"gpu_quota": 2}, headers=api.auth)
    assert response.status == 200, await response.text()
    first = await submitted(renter, capsys, "--name", "first", "--gpus", "2")
    await grid.cycle()
    assert (await stored_workload(api.master.store, first)).state == "scheduled"
    wl = await submitted(renter, capsys, "--name", "second", "--gpus", "1")

    out = await explained(renter, capsys, wl)

    lines = out.splitlines()
    assert lines[0] == (
        f"{wl} (second) waits. Waiting for quota: account alice holds 2 of its 2 GPUs and this workload asks for 1 "
        "more; it starts when the account's other workloads free enough."
    )
    assert "quota:            account alice holds 2 of its 2 GPUs; this asks 1 more (1 over it)" in lines
    assert "blocked by:       the GPU quota of account alice" in lines
    assert "fits idle GPUs:   yes" in lines  # the grid has room: only the quota holds it back
    assert "estimated start:  when the account's other workloads end and free enough of its quota" in lines
    assert any(line.split() == ["held", "by", "others", "2", "4"] for line in lines)  # 2 of 6 GPUs are alice's first


async def test_explain_names_the_gang_ahead_that_has_the_gpus_reserved(renter, capsys, grid, api):
    # Two high-priority workloads of 2 GPUs run on two of the three hosts for an hour at most.
    for n in (1, 2):
        await bob_submits(api, name=f"running-{n}", priority="high", max_duration_s=3600, replica={"gpus": 2})
    await grid.cycle()
    # A high-priority gang of 2 x 2 GPUs cannot preempt its equals: it is first in line, with GPUs reserved for the
    # hour's end; alice's small job with no max duration would delay it on the idle host, so it waits behind.
    gang = await bob_submits(api, name="gang", priority="high", replicas=2, network="none", replica={"gpus": 2})
    wl = await submitted(renter, capsys, "--name", "small", "--gpus", "1")

    out = await explained(renter, capsys, wl)

    lines = out.splitlines()
    waits = f"{wl} (small) waits. Waiting behind {gang} (priority high), which is next in line for room from 20"
    assert lines[0].startswith(waits)
    assert "t=" not in out  # every moment is a time a person reads
    assert lines[0].endswith("A workload with a max duration that ends before then could start now.")
    assert f"queue:            position 2 of 2 in the order the scheduler considers them; just ahead: {gang}" in lines
    assert any(
        line.startswith(f"blocked by:       waits behind {gang} (priority high), which has 4 GPUs reserved") for line in lines
    )
    assert "fits idle GPUs:   yes" in lines
    assert any(line.startswith("estimated start:  20") and line.endswith("UTC (in 60 min)") for line in lines)

    code, out, _ = await renter("explain", gang, capsys=capsys)
    assert code == 2  # bob's gang is not alice's to explain

    code, out, err = await renter("explain", wl, "--json", capsys=capsys)
    body = json.loads(out)
    assert (body["position"], body["ahead"], body["fits_now"]) == (2, [gang], True)
    assert "next in line for room from 20" in body["summary"] and body["estimated_start"].startswith("20")


async def test_get_shows_why_a_queued_workload_waits_and_nothing_once_it_is_placed(renter, capsys, grid, api):
    for name in ("fill-1", "fill-2"):  # hosts have 2 GPUs each: two are full, the third keeps one free
        await submitted(renter, capsys, "--name", name, "--gpus", "2")
    small = await submitted(renter, capsys, "--name", "fits", "--gpus", "1")
    await grid.cycle()
    wl = await submitted(renter, capsys, "--name", "waits", "--gpus", "2")
    code, out, _ = await renter("get", wl, capsys=capsys)
    assert code == 0 and "state:       queued" in out
    description, why = out.split("\n\nwhy it waits:\n")
    assert why.startswith(f"  {wl} (waits) ") and "\n  asks:             2 GPUs on one host; priority normal\n" in why

    code, out, _ = await renter("get", small, capsys=capsys)
    assert code == 0 and "state:       scheduled" in out and "why it waits" not in out
    code, out, _ = await renter("get", small, "--json", capsys=capsys)
    assert json.loads(out)["id"] == small  # the API's JSON, as it is

    code, out, _ = await renter("explain", small, capsys=capsys)  # the banner's "why it waits" line, on what runs
    assert code == 0 and out.startswith(f"{small} (fits) does not wait: it is scheduled ("), out
    code, _, err = await renter("explain", small, "--json", capsys=capsys)  # a script reads the API's own answer
    assert code == 2 and "409 conflict" in err and "only a queued workload waits" in err


async def test_a_private_images_credentials_come_from_the_environment_and_are_never_printed(renter, capsys, monkeypatch):
    monkeypatch.setenv("REGISTRY_TOKEN", "ghp-very-secret")
    flags = ("--name", "private", "--image", "ghcr.io/acme/private:1", "--registry-user", "acme")
    code, out, err = await renter("submit", *flags, "--registry-password-env", "REGISTRY_TOKEN", capsys=capsys)
    assert code == 0, err
    workload_id = out.split()[1]
    code, out, _ = await renter("get", workload_id, capsys=capsys)
    assert "image:       ghcr.io/acme/private:1  (registry user acme)" in out
    code, out, _ = await renter("get", workload_id, "--json", capsys=capsys)
    assert json.loads(out)["spec"]["registry_auth"] == {"username": "acme"} and "ghp-very-secret" not in out

    code, out, err = await renter("submit", *flags, "--registry-password-env", "UNSET_VARIABLE", capsys=capsys)
    assert code != 0 and "UNSET_VARIABLE: that environment variable is not set or empty" in err


async def test_port_forward_refuses_at_once_a_port_the_workload_does_not_declare_or_a_workload_not_running(renter, capsys):
    """Issue 37: ``port-forward`` printed "Forwarding …" and failed only at the first connection (the README's example
    declared no port). It refuses before listening, naming the fix."""
    code, out, err = await renter("submit", "--name", "web", "--image", "busybox", capsys=capsys)
    assert code == 0, err
    bare = out.split()[1]
    code, out, err = await renter("port-forward", bare, "8888", capsys=capsys)
    assert (code, out) == (2, "") and "Forwarding" not in err
    assert err.strip() == (
        f"idlegrid workload port-forward: workload {bare} declares no port 8888: submit it again with --port 8888 (or "
        "ports = [8888] in its spec file); a port-forward reaches only the ports a workload declares"
    )

    code, out, err = await renter("submit", "--name", "web", "--image", "busybox", "--port", "8888", capsys=capsys)
    assert code == 0, err
    queued = out.split()[1]
    code, _, err = await renter("port-forward", queued, "18888:9090", capsys=capsys)
    assert code == 2 and f"workload {queued} declares no port 9090 (it declares 8888): submit it again with --port 9090" in err
    code, _, err = await renter("port-forward", queued, "18888:8888", capsys=capsys)
    assert code == 2 and "Forwarding" not in err
    assert f"workload {queued} is queued, not running yet: forward once it runs (idlegrid workload get {queued}" in err
