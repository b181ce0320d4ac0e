"""Settings shared by every daemon: the loader refuses values no setting can mean."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from common.config import load_config
from common.errors import ConfigError


class Settings(msgspec.Struct, kw_only=True):
    timeout_s: float = 30.0
    weights: list[float] = []


@pytest.mark.parametrize("spelling", ["nan", "inf", "-inf", "+inf"])
def test_a_non_finite_number_in_toml_is_refused_naming_the_setting(tmp_path: Path, spelling: str) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text(f"timeout_s = {spelling}\n")
    with pytest.raises(ConfigError, match="timeout_s must be a finite number"):
        load_config(Settings, path=path, env_prefix="T_", env={})


@pytest.mark.parametrize("spelling", ["NaN", "Infinity", "-inf"])
def test_a_non_finite_number_from_the_environment_is_refused(spelling: str) -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        load_config(Settings, env_prefix="T_", env={"T_TIMEOUT_S": spelling})


def test_a_non_finite_number_inside_a_list_setting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text("weights = [1.0, nan]\n")
    with pytest.raises(ConfigError, match="weights"):
        load_config(Settings, path=path, env_prefix="T_", env={})


def test_finite_numbers_pass(tmp_path: Path) -> None:
    path = tmp_path / "daemon.toml"
    path.write_text("timeout_s = 2.5\nweights = [1.0, 0.5]\n")
    assert load_config(Settings, path=path, env_prefix="T_", env={}) == Settings(timeout_s=2.5, weights=[1.0, 0.5])


def test_a_list_setting_is_read_comma_separated_from_its_variable() -> None:
    from agent.config import load_agent_config

    config = load_agent_config(env={"IDLEGRID_AGENT_EGRESS_ALLOW": "minio.lan:9000, registry.lan"})
    assert config.egress_allow == ["minio.lan:9000", "registry.lan"]
    assert config.egress_rule().allows("minio.lan", 9000) and not config.egress_rule().allows("minio.lan", 9001)


def test_an_egress_allow_entry_that_is_not_host_or_host_port_is_refused_naming_it() -> None:
    from master.config import MasterConfig

    with pytest.raises(ConfigError, match="egress_allow: 'http://minio.lan:9000' is not HOST or HOST:PORT"):
        MasterConfig(egress_allow=["http://minio.lan:9000"]).egress_rule()
