"""Relay settings: defaults, then TOML, then IDLEGRID_ACCESS_* variables, then flags; bad values say which."""

import pytest

from access.config import load_access_config
from common.errors import ConfigError
from common.wire import MAX_FRAME_BYTES


def test_defaults_suit_a_local_run():
    config = load_access_config(None, {}, {})
    assert (config.relay_id, config.region, config.master_url) == ("relay-1", "local", "wss://127.0.0.1:7100/link")
    assert (config.agent_host, config.agent_port, config.http_port) == ("127.0.0.1", 7200, 7201)
    assert (config.max_frame_bytes, config.rate_per_agent, config.burst) == (MAX_FRAME_BYTES, 50.0, 200)
    assert (config.buffer_frames, config.max_handshakes, config.handshake_timeout_s, config.idle_timeout_s) == (
        10_000,
        256,
        10.0,
        60.0,
    )
    assert (config.http_head_timeout_s, config.speedtest_transfers_per_ip) == (5.0, 8)
    assert (config.speedtest_bytes_per_window, config.speedtest_window_s) == (1024**3, 3600.0)
    assert (config.tunnel_bytes_per_s, config.max_tunnels, config.max_tunnels_per_agent, config.tunnel_grace_s) == (
        32 * 1024 * 1024,
        256,
        16,
        5.0,
    )
    assert config.http_public_url == ""


def test_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('relay_id = "relay-eu-1"\nregion = "eu-west"\nagent_port = 9000\nburst = 10\n')
    env = {"IDLEGRID_ACCESS_REGION": "eu-central", "IDLEGRID_ACCESS_AGENT_PORT": "9100", "OTHER": "x"}
    config = load_access_config(path, env, {"agent_port": 9200, "http_port": None})
    assert (config.relay_id, config.region, config.agent_port, config.http_port, config.burst) == (
        "relay-eu-1",
        "eu-central",
        9200,
        7201,
        10,
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"IDLEGRID_ACCESS_AGENT_PORT": "seventy"}, "agent_port"),
        ({"IDLEGRID_ACCESS_HTTP_PORT": "70000"}, "http_port"),
        ({"IDLEGRID_ACCESS_BURST": "0"}, "burst"),
        ({"IDLEGRID_ACCESS_MASTER_URL": "http://x"}, "master_url"),
        ({"IDLEGRID_ACCESS_MAX_FRAME_BYTES": str(64 * 1024 * 1024)}, "max_frame_bytes"),
        ({"IDLEGRID_ACCESS_HTTP_HEAD_TIMEOUT_S": "0"}, "http_head_timeout_s"),
        ({"IDLEGRID_ACCESS_SPEEDTEST_TRANSFERS_PER_IP": "0"}, "speedtest_transfers_per_ip"),
        ({"IDLEGRID_ACCESS_SPEEDTEST_WINDOW_S": "-1"}, "speedtest_window_s"),
        ({"IDLEGRID_ACCESS_SPEEDTEST_BYTES_PER_WINDOW": "1000000"}, "the largest speed-test image"),
        ({"IDLEGRID_ACCESS_LINK_BATCH_FRAMES": "0"}, "link_batch_frames"),
        ({"IDLEGRID_ACCESS_LINK_BATCH_BYTES": "1000"}, "link_batch_bytes"),
        ({"IDLEGRID_ACCESS_LINK_BATCH_WINDOW_S": "5"}, "link_batch_window_s"),
        ({"IDLEGRID_ACCESS_TUNNEL_BYTES_PER_S": "0"}, "tunnel_bytes_per_s"),
        ({"IDLEGRID_ACCESS_MAX_TUNNELS": "0"}, "max_tunnels"),
        ({"IDLEGRID_ACCESS_MAX_TUNNELS_PER_AGENT": "0"}, "max_tunnels_per_agent"),
        ({"IDLEGRID_ACCESS_TUNNEL_GRACE_S": "-1"}, "tunnel_grace_s"),
        ({"IDLEGRID_ACCESS_TUNNEL_OPEN_RATE_PER_AGENT": "0"}, "tunnel_open_rate_per_agent"),
        ({"IDLEGRID_ACCESS_HTTP_PUBLIC_URL": "http://relay.example"}, "http_public_url"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_setting(env, needle):
    with pytest.raises(ConfigError, match=needle):
        load_access_config(None, env, {})


def test_an_unknown_setting_in_the_file_is_an_error(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text("agent_prot = 1\n")
    with pytest.raises(ConfigError, match="agent_prot"):
        load_access_config(path, {}, {})
