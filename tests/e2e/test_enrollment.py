"""Acceptance 1: an agent enrolls through an Access relay with a join token and comes up ready with its GPUs tiered."""

import json
import time

from tests.support.grid import wait_for


def test_agent_enrolls_through_a_relay_and_comes_up_ready_with_tiered_gpus(grid):
    relay = grid.relays["relay-1"]
    done = grid.enroll("host-a", relay)
    assert done.returncode == 0, done.stderr
    agent_id = grid.agent_id("host-a")
    key_file = grid.agent_dir("host-a") / "agent.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    # The relay passes on the Master's relay directory, so the host can fail over from its very first start.
    directory = json.loads((grid.agent_dir("host-a") / "relays.json").read_text())
    assert [(r["relay_id"], r["region"], r["url"]) for r in directory] == [("relay-1", "eu-west", relay.agent_url)]

    grid.start_agent("host-a", simulate="h100:2,t4:1")
    agent = grid.wait_state(agent_id, "ready")

    assert agent["provider"] == "prov-1"
    assert agent["relay"] == "relay-1"
    assert agent["simulated"] is True
    tiers = {g["model"]: g["tier"] for g in agent["gpus"]}
    assert set(tiers) == {"h100-sxm", "t4"}
    assert all(tier for tier in tiers.values()), tiers
    assert tiers["h100-sxm"] != tiers["t4"]
    assert 0 <= agent["reputation"]["score"] <= 1
    assert set(agent["reputation"]["components"]) == {
        "uptime",
        "command_success",
        "container_success",
        "rentals",
        "verification",
        "ratings",
    }


def test_a_join_token_works_once(grid):
    relay = grid.relays["relay-1"]
    token = grid.join_token()
    assert grid.enroll("first", relay, token).returncode == 0
    second = grid.enroll("second", relay, token)
    assert second.returncode != 0
    assert "already used" in second.stderr


def test_expired_and_wrong_tokens_are_refused_with_clear_errors(grid):
    relay = grid.relays["relay-1"]
    expired = grid.join_token(ttl_s=1)
    time.sleep(1.5)
    refused = grid.enroll("late", relay, expired)
    assert refused.returncode != 0
    assert "expired" in refused.stderr

    wrong = grid.enroll("guess", relay, "igjt_not-a-real-token")
    assert wrong.returncode != 0
    assert "not valid" in wrong.stderr
    assert not (grid.agent_dir("guess") / "identity.json").exists()


def test_refusals_are_recorded_as_events(grid):
    relay = grid.relays["relay-1"]
    grid.enroll("guess", relay, "igjt_wrong")
    events = wait_for(lambda: grid.get("/api/v1/events?kind=agent.enrollment_refused")["items"], 5, "a refusal event")
    assert events[0]["data"]["code"] == "token_unknown"


def test_an_operator_creates_a_token_with_the_cli_and_the_host_reports_its_bandwidth(grid):
    import subprocess
    import sys

    from tests.support.grid import REPO

    grid.ensure_provider("acme")
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "management.cli",
            "token",
            "create",
            "--provider",
            "acme",
            "--api",
            f"http://127.0.0.1:{grid.api_port}",
            "--operator-token-file",
            str(grid.master_dir / "operator.token"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("igjt_")
    assert grid.enroll("measured", grid.relays["relay-1"], token).returncode == 0
    agent_id = grid.agent_id("measured")
    grid.spawn("measured", "agent", ["agent", "--state-dir", str(grid.agent_dir("measured")), "--simulate", "l4:1"])
    host = wait_for(
        lambda: (h := grid.agent(agent_id)["host"]) and h.get("bandwidth_mbps_down") and h,
        40,
        "the bandwidth measured against the relay",
    )
    assert host["bandwidth_mbps_down"] > 0 and host["bandwidth_mbps_up"] > 0
    assert host["cpu_cores"] >= 1 and host["ram_mib"] > 0 and host["kernel"]
    assert grid.agent(agent_id)["provider"] == "acme"
