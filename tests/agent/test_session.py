"""The agent's session with the Master (agent/session.py): one rule per frame kind, and its invariants as properties.

No socket and no clock: each test hands the session an encoded frame, as the relay would send it, and reads the
action. The last property runs the session with the real executor, ledger and simulated runtime behind it.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.executor import CommandExecutor
from agent.ledger import CommandLog
from agent.runtime.simulated import SimulatedRuntime
from agent.session import (
    NOTHING,
    SEND_HELLO,
    AckCommand,
    BadFrame,
    Challenged,
    MasterError,
    MasterSession,
    NewDirectory,
    NewKeys,
    OpenTunnel,
    RefuseTunnel,
    RelayReported,
    RenewalAnswered,
    ResultAcked,
    RevealAsked,
    RunCommand,
    Welcomed,
    WorkerAnswered,
)
from common.containers import LABEL_COMMAND_ID, ContainerInfo, ContainerSpec
from common.pki import CommandSigner, CommandVerifier
from common.tunnel import Ticket, TicketBody
from common.wire import (
    Command,
    CommandBody,
    Config,
    Error,
    ErrorCode,
    Ping,
    RelayDirectory,
    RelayEntry,
    RelayStatus,
    RenewResponse,
    ResultAck,
    TunnelOpen,
    VerifyChallenge,
    VerifyReveal,
    Welcome,
    WorkerAnswer,
    encode,
    signing_bytes,
)

AGENT = "agt-session"
SIGNER = CommandSigner.generate()
RELAY = RelayEntry(relay_id="relay-a", region="eu-west", url="wss://127.0.0.1:1")


def command(command_id: str = "cmd-1") -> Command:
    spec = {"name": f"c-{command_id}", "image": "none", "command": ["sleep", "1"]}
    body = CommandBody(
        id=command_id,
        agent_id=AGENT,
        kind="create_container",
        spec=spec,
        issued_at=time.time(),
        deadline=time.time() + 3600,
        key_id=SIGNER.key_id,
    )
    return Command(body=body, signature=SIGNER.sign(signing_bytes(body)))


def tunnel_open(ticket_id: str = "tun-1") -> TunnelOpen:
    body = TicketBody(
        id=ticket_id,
        kind="logs",
        account="acct-1",
        workload="wl-1",
        agent_id=AGENT,
        container="c-1",
        relay_id="relay-a",
        issued_at=1.0,
        expires_at=2.0,
        key_id="k1",
    )
    return TunnelOpen(ticket=Ticket(body=body, signature="", public_key="", endorsement=""))


def welcome(**fields: object) -> Welcome:
    return Welcome(**{"version": 1, "agent_id": AGENT, "heartbeat_s": 5.0, "telemetry_s": 10.0, **fields})  # type: ignore[arg-type]


# --- one rule per frame kind ----------------------------------------------------------------------------------


def test_a_welcome_sets_both_report_intervals_and_is_carried_out():
    session = MasterSession()
    frame = welcome(heartbeat_s=2.0, telemetry_s=7.0, relays=[RELAY])
    assert session.receive(encode(frame)) == Welcomed(frame)
    assert (session.heartbeat_s, session.telemetry_s) == (2.0, 7.0)


def test_a_new_command_is_run():
    session = MasterSession()
    cmd = command("cmd-1")
    assert session.receive(encode(cmd)) == RunCommand(cmd)
    assert session.running == {"cmd-1"}


def test_a_resend_of_a_command_running_here_is_only_acked():
    session = MasterSession()
    session.receive(encode(command("cmd-1")))
    assert session.receive(encode(command("cmd-1"))) == AckCommand("cmd-1")
    assert session.running == {"cmd-1"}


def test_a_resend_after_the_command_ended_is_run_again_for_the_ledger_to_answer():
    session = MasterSession()
    cmd = command("cmd-1")
    session.receive(encode(cmd))
    session.command_ended("cmd-1")
    assert session.receive(encode(cmd)) == RunCommand(cmd)


def test_a_command_while_stopping_is_neither_acked_nor_run():
    session = MasterSession()
    session.stop()
    assert session.receive(encode(command())) is NOTHING
    assert session.running == set()


def test_a_result_ack_is_passed_to_the_ledger():
    assert MasterSession().receive(encode(ResultAck(id="cmd-1"))) == ResultAcked("cmd-1")


def test_a_tunnel_open_is_passed_to_the_tunnel_server():
    frame = tunnel_open()
    assert MasterSession().receive(encode(frame)) == OpenTunnel(frame)


def test_a_tunnel_open_while_stopping_is_refused():
    session = MasterSession()
    session.stop()
    assert session.receive(encode(tunnel_open("tun-9"))) == RefuseTunnel("tun-9")


def test_a_relay_that_cannot_reach_the_master_is_degraded_until_it_says_otherwise_or_a_new_connection_opens():
    session = MasterSession()
    down = RelayStatus(master_link="down", buffered=3)
    assert session.receive(encode(down)) == RelayReported(down, degraded=True)
    assert session.relay_degraded
    up = RelayStatus(master_link="up")
    assert session.receive(encode(up)) == RelayReported(up, degraded=False, hello_again=True)  # not welcomed yet
    assert not session.relay_degraded
    session.receive(encode(down))
    session.connection_opened()
    assert not session.relay_degraded


def test_the_master_reachable_again_before_a_welcome_has_the_hello_sent_again_and_after_one_not():
    """A hello the relay handed to a Master that died before welcoming (an HA leader SIGKILLed mid-hello) is gone: the
    successor never heard it, and an agent not welcomed sends nothing else (its heartbeats wait for the welcome). So
    when the relay reaches a Master again and this connection has no welcome, the hello goes again (found by ``bench
    takeover``: agents never ready at the new leader). A welcomed connection's, or a stopping agent's, does not."""
    session = MasterSession()
    down, up = RelayStatus(master_link="down"), RelayStatus(master_link="up")
    session.receive(encode(down))
    assert session.receive(encode(up)) == RelayReported(up, degraded=False, hello_again=True)
    session.receive(encode(welcome()))
    session.receive(encode(down))
    assert session.receive(encode(up)) == RelayReported(up, degraded=False, hello_again=False)
    session.connection_opened()  # a new relay: no welcome on it yet
    assert session.receive(encode(up)).hello_again  # type: ignore[union-attr]
    session.stop()
    assert session.receive(encode(up)) == RelayReported(up, degraded=False, hello_again=False)


def test_a_relay_directory_is_passed_on():
    assert MasterSession().receive(encode(RelayDirectory(relays=[RELAY]))) == NewDirectory([RELAY])


def test_a_config_changes_the_intervals_it_names_and_passes_its_keys_on():
    session = MasterSession()
    session.receive(encode(welcome(heartbeat_s=5.0, telemetry_s=10.0)))
    frame = Config(heartbeat_s=20.0, command_keys={"k2": "pub"}, key_endorsements={"k2": "sig"}, retired_keys=["k1"])
    assert session.receive(encode(frame)) == NewKeys({"k2": "pub"}, {"k2": "sig"}, ["k1"])
    assert (session.heartbeat_s, session.telemetry_s) == (20.0, 10.0)


def test_a_config_with_zero_intervals_and_no_keys_keeps_the_intervals():
    session = MasterSession(heartbeat_s=5.0, telemetry_s=10.0)
    assert session.receive(encode(Config(heartbeat_s=0.0))) == NewKeys({}, {}, [])
    assert (session.heartbeat_s, session.telemetry_s) == (5.0, 10.0)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf"), 8 * 86400.0])
def test_a_welcome_with_an_interval_no_agent_can_keep_is_a_bad_frame_and_changes_nothing(interval):
    # 0 or less would send heartbeats in a tight loop (asyncio.sleep of a negative number returns at once);
    # nan or infinity would send none. The frame is refused at decode: the agent keeps the intervals it has.
    session = MasterSession(heartbeat_s=5.0, telemetry_s=10.0)
    for fields in ({"heartbeat_s": interval}, {"telemetry_s": interval}):
        action = session.receive(encode(welcome(**fields)))
        assert isinstance(action, BadFrame)
        assert (session.heartbeat_s, session.telemetry_s) == (5.0, 10.0)


@pytest.mark.parametrize("interval", [-0.5, 8 * 86400.0])  # (JSON has no nan or infinity: those arrive as null, kept)
def test_a_config_with_a_negative_or_week_long_interval_is_a_bad_frame_and_changes_nothing(interval):
    session = MasterSession(heartbeat_s=5.0, telemetry_s=10.0)
    assert isinstance(session.receive(encode(Config(heartbeat_s=interval))), BadFrame)
    assert isinstance(session.receive(encode(Config(telemetry_s=interval))), BadFrame)
    assert (session.heartbeat_s, session.telemetry_s) == (5.0, 10.0)


def test_a_renewal_answer_is_passed_to_the_renewer():
    frame = RenewResponse(error="not yet")
    assert MasterSession().receive(encode(frame)) == RenewalAnswered(frame)


def test_a_verification_challenge_and_its_reveal_go_to_the_benchmark():
    challenge = VerifyChallenge(challenge_id="ch-1", gpu_uuid="GPU-1", seed=1, n=8, k=2, rounds=1, deadline=5.0)
    reveal = VerifyReveal(challenge_id="ch-1", rows=[0, 3])
    session = MasterSession()
    assert session.receive(encode(challenge)) == Challenged(challenge)
    assert session.receive(encode(reveal)) == RevealAsked(reveal)


def test_a_worker_answer_goes_to_the_worker_api_server():
    answer = WorkerAnswer(call_id="call-1", status=200, body={"id": "r1", "input": {"x": 1}, "attempt": 1})
    assert MasterSession().receive(encode(answer)) == WorkerAnswered(answer)


def test_a_worker_answer_with_a_status_no_http_has_is_a_bad_frame():
    assert isinstance(MasterSession().receive(b'{"type": "worker_answer", "call_id": "c", "status": 42}'), BadFrame)


def test_a_ping_is_echoed_by_every_later_heartbeat():
    session = MasterSession()
    assert session.heartbeat(1.0, []).ping is None
    assert session.receive(encode(Ping(nonce="n-1"))) is NOTHING
    assert session.heartbeat(2.0, ["c-1"]).ping == "n-1"
    assert session.heartbeat(3.0, ["c-1"]).ping == "n-1"


def test_hello_required_asks_for_the_hello_again():
    frame = Error(code=ErrorCode.HELLO_REQUIRED.value, message="say hello first")
    assert MasterSession().receive(encode(frame)) is SEND_HELLO


def test_any_other_error_is_only_reported():
    frame = Error(code="rate_limited", message="slow down")
    assert MasterSession().receive(encode(frame)) == MasterError("rate_limited", "slow down")


AGENT_FRAME = encode(ResultAck(id="x")).replace(b"result_ack", b"heartbeat")  # a frame the agent sends, not the Master


@pytest.mark.parametrize("message", [b"not json", b'{"type": "no_such_frame"}', b'{"type": "command"}', AGENT_FRAME])
def test_a_message_that_is_not_a_frame_of_the_master_is_a_bad_frame(message):
    action = MasterSession().receive(message)
    assert isinstance(action, BadFrame) and action.error.code


# --- invariants -------------------------------------------------------------------------------------------------


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_receive_never_raises(message):
    assert MasterSession().receive(message) is not None


def test_heartbeat_numbers_only_grow_across_connections():
    session = MasterSession()
    seqs = [session.heartbeat(1.0, []).seq]
    session.connection_opened()
    seqs += [session.heartbeat(2.0, []).seq, session.heartbeat(3.0, []).seq]
    assert seqs == sorted(set(seqs))


# Steps of a command's life as the relay and the executor may order them: a delivery (first or resend) of one of
# three ids, the end of a run (the executor returned), a result ack, and the agent starting to stop.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["deliver", "end", "ack"]), st.sampled_from(["c1", "c2", "c3"])),
        st.just(("stop", "")),
    ),
    max_size=40,
)


@given(STEPS)
def test_a_command_id_is_run_at_most_once_at_a_time_and_every_receipt_is_acked_unless_stopping(steps):
    session = MasterSession()
    frames = {i: encode(command(i)) for i in ("c1", "c2", "c3")}
    running: set[str] = set()
    for step, command_id in steps:
        if step == "deliver":
            action = session.receive(frames[command_id])
            if session.stopping:
                assert action is NOTHING  # not acked: the Master resends it when the agent is back
                continue
            # acked exactly once for this receipt: either with its run or alone
            assert isinstance(action, RunCommand | AckCommand)
            if isinstance(action, RunCommand):
                assert command_id not in running, f"{command_id} handed to the executor while it runs"
                running.add(command_id)
        elif step == "end" and command_id in running:
            running.discard(command_id)
            session.command_ended(command_id)
        elif step == "ack":
            assert session.receive(encode(ResultAck(id=command_id))) == ResultAcked(command_id)
        elif step == "stop":
            session.stop()
        assert session.running == running


class SlowCreates(SimulatedRuntime):
    """The simulated runtime, whose creates each take a few turns of the event loop (so resends can arrive while one
    runs) and which counts every create asked of it, by command id."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[str] = Counter()

    async def create(self, spec: ContainerSpec, *, labels: Mapping[str, str]) -> ContainerInfo:
        self.asked[labels[LABEL_COMMAND_ID]] += 1
        for _ in range(3):
            await asyncio.sleep(0)
        return await super().create(spec, labels=labels)


# Deliveries of two ids, result acks and turns of the event loop (the runs move on), in any order.
DELIVERIES = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["deliver", "ack"]), st.sampled_from(["c1", "c2"])),
        st.just(("turn", "")),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(DELIVERIES)
def test_with_the_executor_behind_it_a_command_is_executed_at_most_once_whatever_the_order_of_resends_and_acks(steps):
    with tempfile.TemporaryDirectory() as state:
        asyncio.run(_deliver(Path(state), steps))


async def _deliver(state: Path, steps: list[tuple[str, str]]) -> None:
    """What the daemon does with the actions (agent/daemon.py ``_run_command``), minus the link: run the command in
    a task of its own, then tell the session it ended."""
    runtime = SlowCreates()
    ledger = CommandLog(state / "commands.db")
    executor = CommandExecutor(AGENT, ledger, runtime, CommandVerifier({SIGNER.key_id: SIGNER.public_key_b64()}))
    session = MasterSession()
    frames = {i: encode(command(i)) for i in ("c1", "c2")}
    runs: list[asyncio.Task[None]] = []

    async def run(cmd: Command) -> None:
        try:
            result = await executor.execute(cmd)
            assert result.ok, result
        finally:
            session.command_ended(cmd.body.id)

    try:
        for step, command_id in steps:
            if step == "deliver":
                action = session.receive(frames[command_id])
                if isinstance(action, RunCommand):
                    runs.append(asyncio.create_task(run(action.command)))
            elif step == "ack":
                if isinstance(session.receive(encode(ResultAck(id=command_id))), ResultAcked):
                    ledger.mark_acked(command_id)
            else:
                await asyncio.sleep(0)
        await asyncio.gather(*runs)
    finally:
        ledger.close()
    assert all(n == 1 for n in runtime.asked.values()), runtime.asked
    delivered = {i for step, i in steps if step == "deliver"}
    assert set(runtime.asked) == delivered  # and each delivered one did run
