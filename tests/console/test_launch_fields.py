"""The launch form's fields beyond the basics (replicas, restart policy, links, variables from secrets, a private
registry's credentials, the sandboxed-process box for the image ``none``), in Debian's Chromium against a real
Master. Hosts are registered as a hello would (no agent runs behind them: what is checked is what the Master stores)."""

from __future__ import annotations

import re

import msgspec
import pytest

from management.market.money import parse_amount
from management.market.prices import PriceSetting
from master.port import WorkloadSpec
from tests.console.conftest import ConsoleMaster, console_config, sign_in_as
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def grid(tmp_path):
    """A grid whose operator offers sandboxed hosts, with two of acme's (A10 x2 each) at 1.20 per GPU-hour; rita has
    25.00 and two secrets."""
    console_master = ConsoleMaster(msgspec.structs.replace(console_config(tmp_path), offer_sandboxed_hosts=True))
    console_master.start()
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        for host in ("agt-p1", "agt-p2"):
            await add_agent(master, host, "a10:2", provider="acme", runtime="process", isolation="sandbox")
        await services.prices.set_default_price("acme", PriceSetting(on_demand="1.20"))
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")
        await services.secrets.create("rita", "hf", "hf_token_value")
        await services.secrets.create("rita", "ghcr", "registry-password")

    console_master.run(seed())
    yield console_master
    console_master.stop()


@pytest.fixture
def sign_in(grid):
    return lambda page, role: sign_in_as(page, grid.url, role)


def stored_spec(grid, workload_id: str):
    return grid.run(grid.services.workloads.workload_overview(workload_id, account="rita")).workload.spec


def test_a_launch_carries_replicas_restart_policy_links_secret_variables_and_registry_credentials(grid, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/launch")
    box = page.get_by_label("May run as a sandboxed process", exact=False)
    assert not box.is_checked()
    page.get_by_label("Name", exact=True).fill("gang-1")
    page.get_by_label("Image", exact=True).fill("none")
    assert box.is_checked(), "the image none runs only as a process: typing it ticks the box"
    page.get_by_label("Command", exact=False).fill("sleep 300")
    page.get_by_label("Replicas", exact=False).fill("2")
    page.get_by_label("Restart policy").select_option("on_failure")
    page.get_by_label("Max restarts", exact=False).fill("5")
    page.get_by_label("Links, one", exact=False).fill("8888 private\n8080 public\n2222 tcp")
    page.get_by_label("Variable 1").fill("HF_TOKEN")
    page.get_by_label("From secret 1").select_option("hf")
    assert page.get_by_label("From secret 1").locator("option").all_inner_texts() == ["(none)", "ghcr", "hf"]
    page.get_by_label("Registry username").fill("rita-bot")
    page.get_by_label("Password or token", exact=False).select_option("ghcr")
    page.get_by_role("button", name="Update the total").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "Total 2.40 USD per hour for 2 GPU(s)" in page.locator("#cost").inner_text()  # both replicas' GPUs
    assert page.get_by_label("Restart policy").input_value() == "on_failure"  # what was chosen is kept
    assert page.get_by_label("Password or token", exact=False).input_value() == "ghcr"
    shot(page, "launch-filled")
    page.get_by_role("button", name="Launch").click()
    # This grid runs no gang overlay: a gang is refused beside its replicas, naming the operator's fix and the opt-out.
    refusal = page.locator("#replicas-error").inner_text()
    assert "this grid runs no gang overlay" in refusal and "idlegrid ca issue-lighthouse" in refusal, refusal
    shot(page, "gang-refused-without-overlay")
    page.get_by_label("No gang network", exact=False).check()
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    shot(page, "launched")
    spec = stored_spec(grid, page.url.rsplit("/", 1)[1])
    assert spec.replicas == 2 and spec.restart_policy == "on_failure" and spec.max_restarts == 5
    assert spec.network == "none"
    assert [(link.port, link.kind, link.public) for link in spec.links] == [
        (8888, "http", False), (8080, "http", True), (2222, "tcp", False),
    ]  # fmt: skip
    assert sorted(spec.ports) == [2222, 8080, 8888]
    assert spec.env == {"HF_TOKEN": "${secret:hf}"}
    assert spec.constraints.allow_process_runtime
    assert spec.registry_auth is not None and spec.registry_auth.username == "rita-bot"
    assert "registry-password" not in page.content()


def test_the_image_none_is_placeable_even_with_the_box_left_unticked(grid, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("hello")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("May run as a sandboxed process", exact=False).uncheck()
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    assert stored_spec(grid, page.url.rsplit("/", 1)[1]).constraints.allow_process_runtime


def test_bad_fields_are_said_beside_them_and_nothing_is_launched(grid, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("bad")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("Replicas", exact=False).fill("0")
    page.get_by_label("Max restarts", exact=False).fill("-1")
    page.get_by_label("Links, one", exact=False).fill("8888 open")
    page.get_by_label("Variable 1").fill("HF_TOKEN")
    page.get_by_label("Registry username").fill("rita-bot")
    page.get_by_label("Environment variables", exact=False).fill("A=1")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "replicas: from 1 to" in page.locator("#replicas-error").inner_text()
    assert "max restarts: from 0 to 1000" in page.locator("#max_restarts-error").inner_text()
    assert "links, line 1: PORT private, PORT public or PORT tcp, not '8888 open'" in page.locator("#links-error").inner_text()
    assert "give both the variable's name and the secret" in page.locator("#secret_var_0-error").inner_text()
    assert "registry: give both the username and the secret" in page.locator("#registry_user-error").inner_text()
    assert page.get_by_label("Links, one", exact=False).input_value() == "8888 open"
    shot(page, "errors-beside-fields")
    page.get_by_label("Replicas", exact=False).fill("1")
    page.get_by_label("Max restarts", exact=False).fill("3")
    page.get_by_label("Links, one", exact=False).fill("")
    page.get_by_label("Registry username").fill("")
    page.get_by_label("Variable 1").fill("A")
    page.get_by_label("From secret 1").select_option("hf")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "A is set twice" in page.locator("#secret_var_0-error").inner_text()
    assert grid.run(grid.services.workloads.list_workloads(owner="rita", states=None, after=None, limit=5)).items == []


def test_a_refusal_of_the_submit_is_said_beside_the_field_it_names(grid, page, sign_in, shot):
    """The egress rule refuses a store on a private address at submit (judged without connecting: a literal), and the
    form says so under the endpoint's field."""
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("private-store")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("May run as a sandboxed process", exact=False).check()
    page.get_by_label("Checkpoint location").fill("s3://runs/ck/")
    page.get_by_label("Credentials (your secret)").select_option("hf")
    page.get_by_label("Endpoint", exact=False).fill("http://10.1.2.3:9000")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "10.1.2.3 is 10.1.2.3: a private address" in page.locator("#storage_endpoint-error").inner_text()
    assert page.get_by_label("Endpoint", exact=False).get_attribute("aria-invalid") == "true"
    shot(page, "submit-refused-by-field")


def launch_gang(grid, page) -> str:
    page.goto(f"{grid.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("gang-2")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("Command", exact=False).fill("python3 -c 'print(1)'")
    page.get_by_label("Replicas", exact=False).fill("2")
    page.get_by_label("Restart policy").select_option("always")
    page.get_by_label("Links, one", exact=False).fill("8080 public")
    page.get_by_label("Ports to reach", exact=False).fill("6006")
    page.get_by_label("Environment variables", exact=False).fill("PLAIN=kept-out")
    page.get_by_label("Variable 1").fill("HF_TOKEN")
    page.get_by_label("From secret 1").select_option("hf")
    page.get_by_label("Registry username").fill("rita-bot")
    page.get_by_label("Password or token", exact=False).select_option("ghcr")
    page.get_by_label("No gang network", exact=False).check()  # this grid runs no gang overlay
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    return page.url.rsplit("/", 1)[1]


def test_an_ended_workload_restarts_as_a_new_one_with_the_same_spec(grid, page, sign_in, shot):
    sign_in(page, "renter")
    first = launch_gang(grid, page)
    assert page.get_by_role("button", name=re.compile("^Restart")).count() == 0  # while it is open: Stop
    page.get_by_role("button", name="Stop this workload").click()
    page.get_by_role("button", name=re.compile("^Restart")).click()
    page.wait_for_url(lambda url: first not in url and "/console/workloads/wl-" in url)
    assert f"Restarted {first} as" in page.locator(".flash").inner_text()
    shot(page, "restarted")
    second = page.url.rsplit("/", 1)[1]
    old = grid.run(grid.services.workloads.get_workload(first))
    new = grid.run(grid.services.workloads.get_workload(second))
    assert new.spec == old.spec and new.account == "rita"
    assert grid.server.master.secrets.unseal(new.sealed_registry_password) == "registry-password"


def test_clone_fills_the_launch_form_from_the_spec_and_says_what_it_could_not_copy(grid, page, sign_in, shot):
    sign_in(page, "renter")
    launch_gang(grid, page)
    page.get_by_role("link", name="Clone into the launch form").click()
    page.wait_for_url("**/clone")
    assert page.get_by_label("Name", exact=True).input_value() == "gang-2"
    assert page.get_by_label("Command", exact=False).input_value() == "python3 -c 'print(1)'"
    assert page.get_by_label("Replicas", exact=False).input_value() == "2"
    assert page.get_by_label("No gang network", exact=False).is_checked()
    assert page.get_by_label("Restart policy").input_value() == "always"
    assert page.get_by_label("Links, one", exact=False).input_value() == "8080 public"
    assert page.get_by_label("Ports to reach", exact=False).input_value() == "6006"
    assert page.get_by_label("Variable 1").input_value() == "HF_TOKEN"
    assert page.get_by_label("From secret 1").input_value() == "hf"
    assert page.get_by_label("Registry username").input_value() == "rita-bot"
    assert page.get_by_label("May run as a sandboxed process", exact=False).is_checked()
    notes = page.locator("#clone-notes").inner_text()
    assert "PLAIN" in notes and "registry password" in notes
    assert "kept-out" not in page.content()  # an env value is never shown again
    shot(page, "clone-filled")
    page.get_by_label("Name", exact=True).fill("gang-3")
    page.get_by_label("Password or token", exact=False).select_option("ghcr")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    spec = stored_spec(grid, page.url.rsplit("/", 1)[1])
    assert (spec.name, spec.replicas, spec.restart_policy, sorted(spec.ports)) == ("gang-3", 2, "always", [6006, 8080])


def test_renting_an_offer_takes_the_same_fields_and_ticks_the_box_for_a_sandboxed_host(grid, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{grid.url}/console/offers/agt-p1/rent")
    assert page.get_by_label("May run as a sandboxed process", exact=False).is_checked()  # the offer's host has no engine
    page.get_by_label("Name", exact=True).fill("rented")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("Restart policy").select_option("on_failure")
    page.get_by_label("Max restarts", exact=False).fill("2")
    page.get_by_label("Links, one", exact=False).fill("8888")
    page.get_by_label("Variable 1").fill("HF_TOKEN")
    page.get_by_label("From secret 1").select_option("hf")
    shot(page, "rent-filled")
    page.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    spec = stored_spec(grid, page.url.rsplit("/", 1)[1])
    assert (spec.restart_policy, spec.max_restarts, spec.env) == ("on_failure", 2, {"HF_TOKEN": "${secret:hf}"})
    assert [(link.port, link.public) for link in spec.links] == [(8888, False)] and spec.ports == [8888]
    assert spec.rental is not None and spec.rental.offer == "agt-p1"


def test_another_accounts_workload_can_be_neither_cloned_nor_restarted(grid, page, sign_in):
    async def theirs() -> str:
        from master.records import AccountRecord, PlacementConstraints

        await grid.server.master.accounts.create(AccountRecord(id="zoe", role="renter"))
        await grid.services.market.credit("zoe", parse_amount("1"), "theirs", key="zoe")
        spec = WorkloadSpec(name="theirs", image="none", constraints=PlacementConstraints(allow_process_runtime=True))
        return (await grid.services.workloads.submit_workload("zoe", spec)).id

    workload = grid.run(theirs())
    sign_in(page, "renter")
    assert page.goto(f"{grid.url}/console/workloads/{workload}/clone").status == 404
    token = page.locator("meta[name=csrf-token]").get_attribute("content")
    answer = page.request.post(
        f"{grid.url}/console/workloads/{workload}/restart", form={"csrf_token": token}, headers={"Origin": grid.url}
    )
    assert answer.status == 404
    assert len(grid.run(grid.services.workloads.list_workloads(owner="zoe", limit=5)).items) == 1  # nothing resubmitted
