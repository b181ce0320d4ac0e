"""Settings come from defaults, then the TOML file, then environment variables, then flags."""

import pytest

from common.errors import ConfigError
from master.config import load_master_config


def test_later_sources_override_earlier_ones(tmp_path):
    path = tmp_path / "master.toml"
    path.write_text("heartbeat_s = 2.0\napi_port = 9000\nlink_port = 9100\n")
    env = {"IDLEGRID_MASTER_API_PORT": "9001", "IDLEGRID_MASTER_LINK_PORT": "9101"}
    config = load_master_config(path, env=env, overrides={"link_port": 9102, "state_dir": None})
    assert (config.heartbeat_s, config.api_port, config.link_port) == (2.0, 9001, 9102)
    assert config.state_dir == ".idlegrid/master"  # a flag not given changes nothing
    assert config.missed_heartbeats == 3


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("nonsense = 1\n", {}, "unknown setting 'nonsense'"),
        ("heartbeat_s = [\n", {}, "not valid TOML"),
        ("", {"IDLEGRID_MASTER_API_PORT": "seven"}, "api_port"),
        ("max_gpus_per_host = 0\n", {}, "max_gpus_per_host"),
        ("report_window_s = 0\n", {}, "report_window_s"),
        ("report_events_per_window = -1\n", {}, "report_events_per_window"),
        # an agent told 0 (or less) would report in a tight loop, one told nan or a day between heartbeats never
        ("heartbeat_s = 0\n", {}, "heartbeat_s"),
        ("telemetry_s = -1.0\n", {}, "telemetry_s"),
        ("heartbeat_s = nan\n", {}, "heartbeat_s"),
        ("telemetry_s = 86400\n", {}, "telemetry_s"),
        # the rounds challenge's shape must fit the real kernel's tiles, or every real host would refuse it
        ("verify_round_n = 500\n", {}, "verify_round_n"),
        ("verify_round_k = 100\n", {}, "verify_round_k"),
        ("verify_round_k = 2048\n", {}, "verify_round_k"),
    ],
)
def test_bad_settings_are_named(tmp_path, text, env, message):
    path = tmp_path / "master.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_master_config(path, env=env)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_master_config(tmp_path / "nope.toml", env={})


@pytest.mark.parametrize(
    ("text", "port"),
    [
        ("", 7300),  # the default, beside the API's 7000
        ("api_port = 0\n", 0),  # a test's Master on any free API port: its links on any free port too, never 7300
        ("api_port = 0\n[links]\nport = 7400\n", 7400),
        ("[links]\nport = 0\n", 0),
    ],
)
def test_links_have_a_port_of_their_own(tmp_path, text, port):
    path = tmp_path / "master.toml"
    path.write_text(text)
    assert load_master_config(path, env={}).links_port == port


def test_a_links_port_out_of_range_is_named(tmp_path):
    path = tmp_path / "master.toml"
    path.write_text("[links]\nport = 70000\n")
    with pytest.raises(ConfigError, match="links.port"):
        load_master_config(path, env={})
