"""The Kubernetes manifests (deploy/k8s/): every resource is valid against Kubernetes' own schema (the
kubernetes-validate package, with the API's schemas bundled, strict: an unknown field is an error), and the
manifests hold what the deployment promises: images this repository builds, non-root pods, keys from Secrets,
probes on /healthz, the Masters as a Deployment of two, the relay behind a Service, the agent on GPU nodes only."""

from __future__ import annotations

import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.manifests import BUILT_IMAGES, DEPLOY, image_repository

K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30.0"  # the oldest minor release still maintained when these were written


def resources() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [
            (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc) for doc in yaml.safe_load_all(path.read_text()) if doc
        ]
    return found


RESOURCES = resources()


def one(kind: str, name: str) -> dict[str, Any]:
    [found] = [doc for _, doc in RESOURCES if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    return one(kind, name)["spec"]["template"]["spec"]


@pytest.mark.parametrize("where,resource", RESOURCES, ids=[where for where, _ in RESOURCES])
def test_each_resource_is_valid_against_the_kubernetes_schema(where: str, resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    if resource["kind"] != "Namespace":
        assert resource["metadata"].get("namespace") == "idlegrid", where


def test_the_validator_rejects_what_kubernetes_would() -> None:
    """The check can fail: a misspelled field and a probe on a port name the container lacks the schema's way."""
    deployment = one("Deployment", "idlegrid-master")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/healthz", "port": 7000}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_pods_run_images_built_here_as_an_unprivileged_user() -> None:
    for where, resource in RESOURCES:
        if resource["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = resource["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["runAsUser"] != 0, where
        assert spec["automountServiceAccountToken"] is False, where
        for container in spec["containers"]:
            assert image_repository(container["image"]) in BUILT_IMAGES, (where, container["image"])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where


def test_the_masters_are_a_deployment_of_two_on_the_store_with_keys_from_secrets() -> None:
    deployment = one("Deployment", "idlegrid-master")
    assert deployment["spec"]["replicas"] == 2
    spec = pod_spec("Deployment", "idlegrid-master")
    [master] = spec["containers"]
    env = {e["name"]: e["valueFrom"] for e in master["env"]}
    assert env["IDLEGRID_MASTER_STORE_URL"]["secretKeyRef"] == {"name": "idlegrid-store", "key": "url"}
    # Each Master is its own node in the lease, advertised at its pod's address (docs/ha.md).
    assert env["IDLEGRID_MASTER_NODE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["IDLEGRID_MASTER_ADVERTISE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["pki"]["secret"]["secretName"] == "idlegrid-master-pki"
    for probe in ("readinessProbe", "livenessProbe"):
        assert master[probe]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert {p["name"]: p["containerPort"] for p in master["ports"]} == {"api": 7000, "link": 7100, "links": 7300}
    config = tomllib.loads(one("ConfigMap", "idlegrid-master")["data"]["master.toml"])
    assert config["ha"] is True and config["host"] == "0.0.0.0"
    assert config["links"]["port"] == 7300 and config["links"]["public_url"]  # links never on the API's origin
    assert "idlegrid-master.idlegrid.svc" in config["server_names"]
    # The settings the Master reads are the ConfigMap's plus the pod's IP in server_ips, written before it starts.
    assert master["args"] == ["master", "--config", "/etc/idlegrid/run/master.toml"]
    prepare = {c["name"]: c for c in spec["initContainers"]}["prepare"]
    assert 'server_ips = ["%s", "127.0.0.1"]' in prepare["args"][0]


def test_the_relay_is_behind_a_service_and_links_to_every_master() -> None:
    spec = pod_spec("Deployment", "idlegrid-relay-eu-1")
    [relay] = spec["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert relay[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert {v["name"]: v for v in spec["volumes"]}["pki"]["secret"]["secretName"] == "idlegrid-relay-eu-1"
    service = one("Service", "idlegrid-relay-eu-1")
    labels = one("Deployment", "idlegrid-relay-eu-1")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["port"] for p in service["spec"]["ports"]} == {7200, 7201}
    config = one("ConfigMap", "idlegrid-relay-eu-1")["data"]["access.toml"]
    assert 'master_urls = ["wss://idlegrid-master.idlegrid.svc:7100/link"]' in config
    master_service = one("Service", "idlegrid-master")
    assert {p["port"] for p in master_service["spec"]["ports"]} == {7000, 7100, 7300}


def test_the_agent_runs_on_gpu_nodes_and_enrolls_with_its_nodes_token() -> None:
    spec = pod_spec("DaemonSet", "idlegrid-agent")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    [agent] = spec["containers"]
    assert "resources" in agent and "nvidia.com/gpu" not in agent["resources"].get("limits", {})  # sees all, takes none
    enroll = {c["name"]: c for c in spec["initContainers"]}["enroll"]
    assert "/etc/idlegrid/join/$NODE_NAME" in enroll["args"][0]
    assert {v["name"]: v for v in spec["volumes"]}["join"]["secret"]["secretName"] == "idlegrid-join-tokens"
