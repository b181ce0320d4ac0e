"""The Master's server runs the alert loop: a webhook created through the API (its secret shown once) receives a
signed alert the loop fires on its own period, on a real Master and API (SQLite) and a real aiohttp receiver."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import aiohttp

from common.wire import AgentEvent, AgentEventKind
from management.app import MasterServer
from management.monitoring.notifier import SIGNATURE_HEADER
from master.config import MasterConfig
from tests.management.hosts import add_agent
from tests.management.monitoring.receiver import WebhookReceiver


async def test_the_servers_alert_loop_delivers_to_a_webhook_made_through_the_api(tmp_path):
    # The receiver is on 127.0.0.1: the operator allows its own webhooks private targets (webhook_allow_private).
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0, alert_period_s=0.1, webhook_allow_private=True)
    server = MasterServer(config)
    await server.start()
    receiver = WebhookReceiver()
    await receiver.start()
    try:
        auth = {"Authorization": f"Bearer {server.operator_token_file.read_text().strip()}"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.api_url}/api/v1/webhooks", json={"url": receiver.url}, headers=auth) as answer:
                assert answer.status == 201
                secret = (await answer.json())["secret"]
        master = server.master
        await add_agent(master, "agt-acme", "a10:1", provider="acme", runtime="simulated", isolation="container")
        gpu = master.gpus("agt-acme")[0]
        report = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=gpu.uuid, code=79)
        fault = master.health.on_report(gpu, report, time.time())
        assert fault is not None
        await master.registry.mark_faulty(gpu, fault)

        [delivered] = await receiver.wait_for(1)
        assert delivered.payload["alert"]["rule"] == "gpu_hardware_error"
        assert (
            delivered.headers[SIGNATURE_HEADER]
            == "sha256=" + hmac.new(secret.encode(), delivered.body, hashlib.sha256).hexdigest()
        )
        await asyncio.sleep(0.3)  # three more periods: the same alert is not delivered again
        assert len(receiver.requests) == 1
    finally:
        await receiver.stop()
        await server.stop()
