"""deploy/compose.yaml: it parses, names only images deploy/ builds or the projects' own public ones, mounts the
monitoring files that exist, and its services are wired the way docs/run-a-grid.md says (a Master pair on a MongoDB
replica set, two relays given every Master, Prometheus and Grafana). Running it needs those public images, which no
registry here can serve: the images built here run the same daemons in tests/deploy/test_agent_image.py."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec
import yaml

from access.config import AccessConfig
from master.config import MasterConfig
from tests.deploy.manifests import DEPLOY, is_known_image

COMPOSE = DEPLOY / "compose.yaml"


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def service_images(doc: dict[str, Any]) -> dict[str, str]:
    return {name: service["image"] for name, service in doc["services"].items() if "image" in service}


def bind_sources(service: dict[str, Any]) -> list[Path]:
    """The host paths a service mounts (``./x:/y``, relative to the compose file), not named volumes."""
    sources = []
    for volume in service.get("volumes", []):
        source = volume.split(":", 1)[0]
        if source.startswith((".", "/")):
            sources.append((COMPOSE.parent / source).resolve())
    return sources


def test_every_service_runs_an_image_built_here_or_a_well_known_public_one() -> None:
    doc = compose()
    images = service_images(doc)
    assert set(images) == set(doc["services"]), "every service names its image"
    assert all(is_known_image(image) for image in images.values()), images
    assert not is_known_image("docker.io/someone/idlegrid-server:latest")  # the check can fail


def test_the_monitoring_files_it_mounts_exist() -> None:
    services = compose()["services"]
    for name, service in services.items():
        for source in bind_sources(service):
            assert source.exists(), f"{name} mounts {source}, which is missing"
    prometheus = bind_sources(services["prometheus"])
    assert DEPLOY / "prometheus" / "prometheus.yml" in prometheus and DEPLOY / "prometheus" / "rules.yml" in prometheus
    grafana = bind_sources(services["grafana"])
    assert DEPLOY / "grafana" / "dashboards" in grafana
    assert DEPLOY / "grafana" / "provisioning" / "datasources" in grafana
    # Prometheus's file discovery reads targets/*.yml beside its config: this grid's are mounted there.
    targets = {Path(v.split(":")[1]): Path(v.split(":")[0]) for v in services["prometheus"]["volumes"] if v.startswith(".")}
    assert (COMPOSE.parent / targets[Path("/etc/prometheus/targets")] / "master.yml").exists()


def test_a_master_pair_on_a_mongodb_replica_set() -> None:
    services = compose()["services"]
    masters = [name for name, s in services.items() if s.get("command", [None])[0] == "master"]
    assert masters == ["master-a", "master-b"]
    mongods = [name for name, s in services.items() if s.get("command", [None])[0] == "mongod"]
    assert len(mongods) == 3
    for name in masters:
        url = services[name]["environment"]["IDLEGRID_MASTER_STORE_URL"]
        assert url.startswith("mongodb://") and "replicaSet=rs0" in url
        assert all(f"{m}:27017" in url for m in mongods)


# Settings that come with the Masters' high availability (docs/ha.md, built beside this): until it is merged, the
# daemons do not know them; once it is, they are checked like every other.
HA_SETTINGS = {"master": {"ha", "node_id", "advertise_host"}, "access": {"master_urls"}}


def accepted(settings: dict[str, Any], config: type[msgspec.Struct], daemon: str) -> None:
    known = {field.name for field in msgspec.structs.fields(config)}
    assert set(settings) - known <= HA_SETTINGS[daemon], set(settings) - known
    msgspec.convert({k: v for k, v in settings.items() if k in known}, config)


def test_its_settings_files_are_what_the_daemons_accept() -> None:
    master = tomllib.loads((DEPLOY / "compose" / "config" / "master.toml").read_text())
    accepted(master, MasterConfig, "master")
    assert master["ha"] is True
    assert {"master-a", "master-b"} <= set(master["server_names"])
    assert master["links"]["port"] == 7300  # workloads' links: a listener of their own, published beside the API
    services = compose()["services"]
    for name in ("master-a", "master-b"):
        environment = services[name]["environment"]
        assert environment["IDLEGRID_MASTER_NODE_ID"] == environment["IDLEGRID_MASTER_ADVERTISE_HOST"] == name
        assert any(port.endswith(":7300") for port in services[name]["ports"])
    for relay in ("relay-a", "relay-b"):
        settings = tomllib.loads((DEPLOY / "compose" / "config" / f"{relay}.toml").read_text())
        accepted(settings, AccessConfig, "access")
        assert settings["relay_id"] == relay
        assert settings["master_urls"] == ["wss://master-a:7100/link", "wss://master-b:7100/link"]
        assert services[relay]["command"] == ["access", "--config", "/etc/idlegrid/access.toml"]
