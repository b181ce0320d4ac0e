"""The state machines follow the transition tables of docs/master.md ("State machines") exactly."""

import pytest

from common.errors import InvalidTransition
from master.states import AGENT, COMMAND, FINAL_COMMAND_STATES, GPU


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        ("enrolled", "connected", "ready"),
        ("ready", "workload_started", "busy"),
        ("busy", "workload_finished", "ready"),
        ("ready", "drain", "maintenance"),
        ("busy", "heartbeat_lost", "offline"),
        ("offline", "connected", "ready"),
        ("ready", "quarantine", "quarantined"),
        ("offline", "revoke", "retired"),
    ],
)
def test_agent_transitions(state, event, expected):
    assert AGENT.next(state, event) == expected


def test_a_retired_agent_never_comes_back():
    for event in AGENT.events():
        assert not AGENT.allows("retired", event)


def test_gpu_follows_its_agent_offline_and_back():
    assert GPU.next("busy", "lost") == "offline"
    assert GPU.next("offline", "restored") == "available"
    assert GPU.next("available", "reserve") == "reserved"


def test_command_moves_forward_only():
    assert COMMAND.next("pending", "send") == "sent"
    assert COMMAND.next("sent", "ack") == "acked"
    assert COMMAND.next("acked", "succeed") == "succeeded"
    assert COMMAND.next("acked", "expire") == "timed_out"
    for final in FINAL_COMMAND_STATES:
        for event in COMMAND.events():
            assert not COMMAND.allows(final.value, event)


def test_an_impossible_transition_is_refused_with_its_name():
    with pytest.raises(InvalidTransition, match="from 'succeeded' on 'ack'"):
        COMMAND.next("succeeded", "ack")
