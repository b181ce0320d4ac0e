"""``idlegrid access`` / ``python -m access``: flags become settings; the daemon runs until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp

from access.cli import add_parser, overrides
from access.config import load_access_config
from management.devgrid.localgrid import free_port
from tests.access.conftest import eventually

REPO = Path(__file__).resolve().parents[2]


def test_the_access_subcommand_turns_flags_into_settings():
    parser = argparse.ArgumentParser(prog="idlegrid")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "access",
            "--relay-id",
            "relay-eu-1",
            "--region",
            "eu-west",
            "--agent-port",
            "9000",
            "--host",
            "0.0.0.0",
            "--cert",
            "r.crt",
            "--key",
            "r.key",
            "--ca",
            "ca.crt",
            "--http-public-url",
            "https://relay-eu-1.example:443",
            "--tunnel-bytes-per-s",
            "1048576",
            "--max-tunnels",
            "64",
            "--max-tunnels-per-agent",
            "4",
        ]
    )
    assert callable(args.func)
    config = load_access_config(None, {}, overrides(args))
    assert (config.relay_id, config.region, config.agent_port, config.http_port) == ("relay-eu-1", "eu-west", 9000, 7201)
    assert (config.agent_host, config.http_host, config.cert_file, config.ca_file) == ("0.0.0.0", "0.0.0.0", "r.crt", "ca.crt")
    assert (config.http_public_url, config.tunnel_bytes_per_s, config.max_tunnels, config.max_tunnels_per_agent) == (
        "https://relay-eu-1.example:443",
        1048576,
        64,
        4,
    )


async def test_python_m_access_links_up_serves_and_stops_on_sigterm(master, pki):
    agent_port, http_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "access",
        "--relay-id",
        pki.relay.identity.id,
        "--region",
        "cli",
        "--master-url",
        master.url,
        "--agent-port",
        str(agent_port),
        "--http-port",
        str(http_port),
        "--cert",
        str(pki.relay.cert),
        "--key",
        str(pki.relay.key),
        "--ca",
        str(pki.ca_file),
        cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(lambda: master.hellos, "the relay process to link up", timeout=15)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{http_port}/healthz", ssl=pki.client_context()) as response:
                assert (await response.json())["master_link"] == "up"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.stderr is not None
    lines = (await process.stderr.read()).decode().splitlines()
    records = [json.loads(line) for line in lines]  # one JSON object per line, nothing else
    assert any(r["msg"] == "access relay started" and r["relay"] == pki.relay.identity.id for r in records)
