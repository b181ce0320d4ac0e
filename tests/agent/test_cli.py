"""The agent's command line (agent/cli.py): a relay's URL is taken with either scheme; its subcommands' behaviour
through the whole command line is in tests/management/cli/test_main.py."""

import pytest

from agent.cli import relay_url
from common.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "scheme", "expected"),
    [
        ("wss://relay.example:7200", "wss", "wss://relay.example:7200"),
        ("https://relay.example:7201/", "https", "https://relay.example:7201"),
        ("wss://relay.example:7201", "https", "https://relay.example:7201"),
        ("https://relay.example:7200", "wss", "wss://relay.example:7200"),
        ("relay.example:7200", "wss", "wss://relay.example:7200"),
        ("127.0.0.1:7201", "https", "https://127.0.0.1:7201"),
    ],
)
def test_a_relay_url_is_taken_with_either_scheme(given, scheme, expected):
    assert relay_url(given, scheme) == expected


@pytest.mark.parametrize("given", ["http://relay.example:7201", "ftp://relay.example", "wss://", "https://relay:port"])
def test_a_relay_url_that_is_not_one_is_refused_clearly(given):
    with pytest.raises(ConfigError, match="relay"):
        relay_url(given, "wss")
