"""The pure image rules (agent/runtime/images.py): registries, pull queries, progress, whose fault, eviction, and the
last-use record. The Docker-API side is tested against real Podman and a real registry in test_runtime_images.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from agent.runtime.images import (
    ANONYMOUS,
    ImageAccess,
    ImageLimits,
    ImageUses,
    PullProgress,
    StoredImage,
    auth_header,
    check_registry,
    credential_fingerprint,
    evictions,
    pull_failure,
    pull_query,
    registry_of,
    warm_first,
)
from common.containers import ContainerSpec, RegistryAuth
from common.errors import ImageNotFound, ImageUnauthorized, RegistryNotAllowed, RuntimeFailure, is_renter_fault


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("busybox", "docker.io"),
        ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "docker.io"),
        ("ghcr.io/acme/train:1", "ghcr.io"),
        ("127.0.0.1:5000/team/app@sha256:abc", "127.0.0.1:5000"),
        ("localhost/idlegrid-busybox:test", "localhost"),
        ("Registry.Example.ORG/x", "registry.example.org"),
    ],
)
def test_the_registry_of_a_reference_is_read_as_the_docker_cli_reads_it(reference, registry):
    assert registry_of(reference) == registry


def test_denied_registries_win_over_allowed_ones_and_wildcards_cover_subdomains():
    limits = ImageLimits(registries_allowed=("*.example.org", "docker.io"), registries_denied=("bad.example.org",))
    check_registry("eu.example.org/team/app:1", limits)
    check_registry("pytorch/pytorch", limits)  # Docker Hub, named as docker.io
    with pytest.raises(RegistryNotAllowed, match="does not pull from bad.example.org"):
        check_registry("bad.example.org/app", limits)
    with pytest.raises(RegistryNotAllowed, match="pulls only from"):
        check_registry("ghcr.io/acme/app", limits)
    check_registry("ghcr.io/acme/app", ImageLimits())  # no lists: every registry


@pytest.mark.parametrize(
    ("reference", "query"),
    [
        ("busybox", {"fromImage": "busybox", "tag": "latest"}),
        ("127.0.0.1:5000/a/b:7", {"fromImage": "127.0.0.1:5000/a/b", "tag": "7"}),
        ("127.0.0.1:5000/a/b", {"fromImage": "127.0.0.1:5000/a/b", "tag": "latest"}),
        ("ghcr.io/a/b@sha256:00ff", {"fromImage": "ghcr.io/a/b", "tag": "sha256:00ff"}),
    ],
)
def test_a_pull_query_splits_the_tag_or_digest_off_not_a_registry_port(reference, query):
    assert pull_query(reference) == query


def test_the_auth_header_is_base64url_json_naming_the_registry():
    header = auth_header(RegistryAuth(username="u", password="p/+?"), "ghcr.io/acme/x:1")
    assert json.loads(base64.urlsafe_b64decode(header)) == {"username": "u", "password": "p/+?", "serveraddress": "ghcr.io"}


def test_credentials_never_show_in_a_specs_repr():
    spec = ContainerSpec(name="x", image="ghcr.io/a/b", registry_auth=RegistryAuth(username="me", password="tok-123"))
    assert "tok-123" not in repr(spec) and "me" in repr(spec)


def test_progress_counts_layers_and_the_bytes_the_engine_announces():
    progress = PullProgress()
    pull_stream: list[dict[str, Any]] = [  # Docker's pull stream
        {"status": "Pulling from library/python", "id": "3.12"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "a1"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "b2"},
        {"status": "Downloading", "progressDetail": {"current": 3_000_000, "total": 10_000_000}, "id": "a1"},
        {"status": "Downloading", "progressDetail": {"current": 1_000_000, "total": 2_000_000}, "id": "b2"},
        {"status": "Download complete", "progressDetail": {}, "id": "b2"},
    ]
    for event in pull_stream:
        progress.feed(event)
    assert (progress.done_bytes, progress.total_bytes) == (5_000_000, 12_000_000)
    assert progress.text() == "5.0 MB of 12.0 MB, 1 of 2 layers"
    assert PullProgress().text() == "0 of 0 layers"


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("manifest unknown: manifest unknown", ImageNotFound),
        ("pull access denied for x, repository does not exist or may require 'docker login'", ImageUnauthorized),
        ("unauthorized: authentication required", ImageUnauthorized),
        ("write /var/lib/docker/tmp: no space left on device", RuntimeFailure),
        ("dial tcp: connection refused", RuntimeFailure),
    ],
)
def test_a_pull_error_is_the_renters_only_when_the_image_or_its_credentials_are_why(message, kind):
    failure = pull_failure("ghcr.io/a/b:1", message, "unix:///docker.sock")
    assert type(failure) is kind
    assert is_renter_fault(failure.code) == (kind is not RuntimeFailure)


def test_eviction_removes_the_least_recently_used_unused_pulled_images_until_they_fit():
    images = [
        StoredImage(id="old", size=40, in_use=False),
        StoredImage(id="busy", size=40, in_use=True),
        StoredImage(id="mid", size=40, in_use=False),
        StoredImage(id="new", size=40, in_use=False),
        StoredImage(id="providers", size=1000, in_use=False),  # not pulled by the agent: not its to evict
    ]
    uses = {"old": 1.0, "busy": 0.5, "mid": 2.0, "new": 3.0}
    assert [i.id for i in evictions(images, uses, budget_bytes=100)] == ["old", "mid"]
    assert evictions(images, uses, budget_bytes=160) == []
    assert evictions(images, uses, budget_bytes=0) == []  # no budget
    assert [i.id for i in evictions(images, uses, budget_bytes=1)] == ["old", "mid", "new"]  # never the one in use


def test_the_last_use_record_survives_a_restart_and_a_damaged_one_forgets_quietly(tmp_path):
    path = tmp_path / "images.json"
    uses = ImageUses(path)
    uses.touch("sha256:a", 10.0, pulled=True)
    uses.touch("sha256:hand-loaded", 11.0)  # not pulled by the agent: not recorded
    assert ImageUses(path).uses == {"sha256:a": 10.0}
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("{not json")
    assert ImageUses(path).uses == {}


def test_the_hosts_image_list_is_warm_first_bounded_and_without_untagged_images():
    listed = warm_first([("a:1", 5.0), ("<none>:<none>", 9.0), ("b:1", 7.0), ("a:1", 1.0), ("c:1", 6.0)], limit=2)
    assert listed == ["b:1", "c:1"]


ALICE = RegistryAuth(username="alice", password="alice-pass")
REGISTRY = "registry.example.org"


def test_only_the_credentials_whose_pull_reached_a_private_image_are_admitted_to_it():
    access = ImageAccess(None)
    access.pulled("sha256:private", REGISTRY, ALICE)
    assert access.admits("sha256:private", REGISTRY, ALICE)
    assert not access.admits("sha256:private", REGISTRY, None)
    assert not access.admits("sha256:private", REGISTRY, RegistryAuth(username="alice", password="guess"))
    assert not access.admits("sha256:private", REGISTRY, RegistryAuth(username="bob", password="alice-pass"))
    assert not access.admits("sha256:private", "other.example.org", ALICE)  # the same words for another registry
    assert access.admits("sha256:public", REGISTRY, None)  # pulled anonymously or loaded by the provider
    assert access.private("sha256:private") and not access.private("sha256:public")


def test_a_private_image_an_anonymous_pull_reached_is_public_from_then_on():
    access = ImageAccess(None)
    access.pulled("sha256:x", REGISTRY, ALICE)
    access.pulled("sha256:x", REGISTRY, None)
    assert access.admits("sha256:x", REGISTRY, None) and not access.private("sha256:x")
    access.pulled("sha256:anon", REGISTRY, None)
    assert "sha256:anon" not in access.proven  # nothing to remember about a public image


def test_a_fingerprint_is_keyed_by_the_host_and_never_holds_the_password():
    one, two = ImageAccess(None), ImageAccess(None)
    mine = credential_fingerprint(one.key, REGISTRY, ALICE)
    assert mine != credential_fingerprint(two.key, REGISTRY, ALICE)  # another host's key: nothing to compare across
    assert "alice" not in mine and mine != ANONYMOUS
    assert credential_fingerprint(one.key, REGISTRY, None) == ANONYMOUS


def test_the_access_record_survives_a_restart_in_a_private_file(tmp_path):
    path = tmp_path / "image-access.json"
    ImageAccess(path).pulled("sha256:private", REGISTRY, ALICE)
    assert path.stat().st_mode & 0o777 == 0o600
    assert "alice-pass" not in path.read_text()
    again = ImageAccess(path)
    assert again.admits("sha256:private", REGISTRY, ALICE) and not again.admits("sha256:private", REGISTRY, None)


@pytest.mark.parametrize("damage", [None, "not json", '{"key": "00", "images": {}}', '{"images": []}'])
def test_a_missing_or_damaged_access_record_makes_every_image_the_agent_pulled_private(tmp_path, damage):
    path = tmp_path / "image-access.json"
    if damage is not None:
        path.write_text(damage)
    access = ImageAccess(path, pulled_before=["sha256:pulled"])
    assert access.private("sha256:pulled") and not access.admits("sha256:pulled", REGISTRY, ALICE)
    assert not access.private("sha256:loaded-by-the-provider")
    assert ImageAccess(path).private("sha256:pulled")  # written down: a second restart keeps it private


def test_the_access_record_forgets_images_no_longer_on_the_engine():
    access = ImageAccess(None)
    access.pulled("sha256:gone", REGISTRY, ALICE)
    access.pulled("sha256:kept", REGISTRY, ALICE)
    access.keep_only(["sha256:kept", "sha256:public"])
    assert set(access.proven) == {"sha256:kept"}
