"""Pulling images in the docker runtime: real registries (Debian docker-registry, one public and one behind htpasswd),
images built with Podman and pushed to them, and a second Podman service, the host's engine, that lacks them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.runtime.docker import DockerRuntime
from agent.runtime.images import ImageLimits, PullProgress
from common.containers import LABEL_COMMAND_ID, ContainerSpec, RegistryAuth
from common.errors import (
    BadCommand,
    ImageNotFound,
    ImagePullTimeout,
    ImageTooLarge,
    ImageUnauthorized,
    RegistryNotAllowed,
    is_renter_fault,
)
from tests.support.podman import PodmanService
from tests.support.registry import (
    BIG_FILLER_BYTES,
    OTHER_PASSWORD,
    OTHER_USER,
    PASSWORD,
    USER,
    Images,
    ThrottledProxy,
    filled_registries,
    pulling_engine,
)

pytestmark = pytest.mark.podman
MB = 1_000_000
ALICE = RegistryAuth(username=USER, password=PASSWORD)


@pytest.fixture(scope="module")
def images(podman: PodmanService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    with filled_registries(podman, tmp_path_factory.mktemp("images")) as made:
        yield made


@pytest.fixture(scope="module")
def engine(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanService]:
    with pulling_engine(tmp_path_factory.mktemp("engine"), images) as service:
        yield service


@pytest.fixture
def clean(engine: PodmanService, images: Images) -> Iterator[None]:
    """Each test starts with none of the registries' images on the host and leaves no container behind."""
    yield
    engine.podman("rm", "--all", "--force", "--time", "0")
    for ref in [*images.small, images.big, images.secret, images.slow_big]:
        engine.podman("rmi", "--force", ref, check=False)


def _runtime(engine: PodmanService, images: Images, tmp_path: Path, **limits: object) -> DockerRuntime:
    """A host whose provider allows the test's registries (on 127.0.0.1, a private address) by name."""
    limits = {"egress": images.provider_allows, **limits}
    return DockerRuntime(engine.socket_path, images=ImageLimits(**limits), image_state=tmp_path / "images.json")  # type: ignore[arg-type]


def _has(engine: PodmanService, ref: str) -> bool:
    return engine.podman("image", "exists", ref, check=False).returncode == 0


def _job(name: str, image: str, **fields: object) -> ContainerSpec:
    return ContainerSpec(name=name, image=image, command=["sleep", "300"], **fields)  # type: ignore[arg-type]


async def test_an_image_the_host_lacks_is_pulled_with_progress_and_runs(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    job = _job("pulled", images.small[0])
    assert not _has(engine, job.image)
    seen: list[str] = []

    def report(progress: PullProgress) -> None:
        seen.append(progress.text())

    try:
        await runtime.ensure_image(job, on_progress=report)
        info = await runtime.create(job, labels={LABEL_COMMAND_ID: "cmd-pull"})
        refs = await runtime.image_references(limit=8)
    finally:
        await runtime.close()
    assert info.state == "running"
    assert _has(engine, job.image)
    assert seen, "the pull reported no progress"
    assert seen[-1].endswith("layers") and " of " in seen[-1]
    assert refs[0] == job.image  # the image just used is the warmest
    assert tmp_path.joinpath("images.json").stat().st_mode & 0o777 == 0o600


async def test_a_slow_pull_reports_bytes_of_total_as_it_goes(engine, images, clean, tmp_path):
    """Through a registry slowed to 2 MB/s, the 8 MB layer takes seconds, and the engine reports its bytes."""
    runtime = _runtime(engine, images, tmp_path)
    seen: list[tuple[int, int]] = []

    def report(progress: PullProgress) -> None:
        seen.append((progress.done_bytes, progress.total_bytes))

    try:
        async with ThrottledProxy(images.slow_port, images.public, rate=2 * MB):
            await runtime.ensure_image(_job("slow", images.slow_big), on_progress=report)
    finally:
        await runtime.close()
        engine.podman("rmi", "--force", images.slow_big, check=False)
    partial = [(done, total) for done, total in seen if 0 < done < total]
    assert partial, f"no progress in bytes while the layer downloaded: {seen}"
    assert all(total >= BIG_FILLER_BYTES for _, total in partial)


async def test_a_pull_past_the_largest_image_stops_as_soon_as_the_layers_say_so(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path, max_image_bytes=5 * MB)
    try:
        async with ThrottledProxy(images.slow_port, images.public, rate=2 * MB) as proxy:
            with pytest.raises(ImageTooLarge, match="this host takes images up to 5.0 MB"):
                await runtime.ensure_image(_job("slow-big", images.slow_big))
            carried = proxy.sent
    finally:
        await runtime.close()
    assert carried < BIG_FILLER_BYTES  # the layer's size was announced: the rest was never fetched
    assert not _has(engine, images.slow_big)


async def test_a_pull_past_the_hosts_pull_timeout_is_the_renters_fault(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path, pull_timeout_s=1.0)
    try:
        async with ThrottledProxy(images.slow_port, images.public, rate=1 * MB):
            with pytest.raises(ImagePullTimeout, match="longer than this host's pull timeout") as caught:
                await runtime.ensure_image(_job("slow-timeout", images.slow_big))
    finally:
        await runtime.close()
        engine.podman("rmi", "--force", images.slow_big, check=False)
    assert is_renter_fault(caught.value.code)


async def test_create_alone_pulls_a_missing_image(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    try:
        info = await runtime.create(_job("direct", images.small[1]), labels={LABEL_COMMAND_ID: "cmd-direct"})
    finally:
        await runtime.close()
    assert info.state == "running"


async def test_a_private_image_runs_with_the_renters_credentials(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    job = _job("private", images.secret, registry_auth=RegistryAuth(username=USER, password=PASSWORD))
    try:
        info = await runtime.create(job, labels={LABEL_COMMAND_ID: "cmd-private"})
    finally:
        await runtime.close()
    assert info.state == "running"
    assert PASSWORD not in repr(job)  # never in a log line that prints the spec


@pytest.mark.parametrize("auth", [None, RegistryAuth(username=USER, password="wrong")], ids=["none", "wrong"])
async def test_a_private_image_without_good_credentials_is_the_renters_fault(engine, images, clean, tmp_path, auth):
    runtime = _runtime(engine, images, tmp_path)
    try:
        with pytest.raises(ImageUnauthorized, match="registry refused access") as caught:
            await runtime.create(_job("denied", images.secret, registry_auth=auth), labels={LABEL_COMMAND_ID: "c"})
    finally:
        await runtime.close()
    assert is_renter_fault(caught.value.code)
    assert "wrong" not in str(caught.value)
    assert engine.inspect("denied") is None


async def test_a_wrong_tag_fails_with_image_not_found_as_the_renters_fault(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    wrong = f"{images.public.host}/tools/busy:no-such-tag"
    try:
        with pytest.raises(ImageNotFound, match="image not found") as caught:
            await runtime.create(_job("wrongtag", wrong), labels={LABEL_COMMAND_ID: "cmd-wrong"})
    finally:
        await runtime.close()
    assert caught.value.code == "image_not_found" and is_renter_fault(caught.value.code)
    assert engine.inspect("wrongtag") is None


@pytest.mark.parametrize(
    "limits",
    [{"registries_allowed": ("registry.example.org",)}, {"registries_denied": ("127.0.0.1:*", "*.example.org")}],
    ids=["not-allowed", "denied"],
)
async def test_a_registry_the_host_does_not_pull_from_is_refused_before_any_pull(engine, images, clean, tmp_path, limits):
    if "registries_denied" in limits:
        limits = {"registries_denied": (images.public.host,)}
    runtime = _runtime(engine, images, tmp_path, **limits)
    try:
        with pytest.raises(RegistryNotAllowed, match=images.public.host):
            await runtime.create(_job("refused", images.small[0]), labels={LABEL_COMMAND_ID: "cmd-refused"})
    finally:
        await runtime.close()
    assert not _has(engine, images.small[0])


async def test_an_image_over_the_hosts_largest_is_refused_and_not_kept(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path, max_image_bytes=5 * MB)
    try:
        await runtime.ensure_image(_job("small", images.small[0]))  # about 2 MB: within the limit
        with pytest.raises(ImageTooLarge, match="this host takes images up to 5.0 MB") as caught:
            await runtime.create(_job("big", images.big), labels={LABEL_COMMAND_ID: "cmd-big"})
    finally:
        await runtime.close()
    assert is_renter_fault(caught.value.code)
    assert not _has(engine, images.big)
    assert _has(engine, images.small[0])


async def test_the_disk_budget_evicts_the_least_recently_used_unused_pulled_image(engine, images, clean, tmp_path):
    one, two, three = images.small
    probe = _runtime(engine, images, tmp_path / "probe")
    tmp_path.joinpath("probe").mkdir()
    await probe.ensure_image(_job("size", one))
    size = int(engine.podman("image", "inspect", "--format", "{{.Size}}", one).stdout.strip())
    engine.podman("rmi", one)
    await probe.close()
    # Room for two pulled images and a half: the third pulled image must make room.
    runtime = _runtime(engine, images, tmp_path, disk_budget_bytes=size * 5 // 2)
    try:
        await runtime.create(_job("uses-one", one), labels={LABEL_COMMAND_ID: "cmd-one"})
        await runtime.ensure_image(_job("pull-two", two))
        await runtime.ensure_image(_job("pull-three", three))
        # ONE is the least recently used, but a container uses it: TWO goes instead, THREE was just pulled.
        assert (_has(engine, one), _has(engine, two), _has(engine, three)) == (True, False, True)
        await runtime.delete("uses-one", timeout_s=0)
        await runtime.ensure_image(_job("pull-two-again", two))
        # Now ONE is unused and the least recently used: it goes.
        assert (_has(engine, one), _has(engine, two), _has(engine, three)) == (False, True, True)
        assert _has(engine, engine.image)  # loaded by hand by the provider: never the agent's to evict
    finally:
        await runtime.close()


async def test_a_command_missing_from_the_image_is_the_renters_fault(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    job = ContainerSpec(name="badcmd", image=images.small[0], command=["/no/such/program"])
    try:
        with pytest.raises(BadCommand, match="fix the workload's command") as caught:
            await runtime.create(job, labels={LABEL_COMMAND_ID: "cmd-bad"})
    finally:
        await runtime.close()
    assert is_renter_fault(caught.value.code)
    assert engine.inspect("badcmd") is None


async def test_a_host_that_does_not_pull_says_the_image_is_not_here(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path, pull=False)
    try:
        with pytest.raises(ImageNotFound, match="not on this host, which does not pull images"):
            await runtime.create(_job("nopull", images.small[0]), labels={LABEL_COMMAND_ID: "cmd-nopull"})
    finally:
        await runtime.close()
    assert not _has(engine, images.small[0])


# --- what one renter proved, another proves too (issue 36, D3) ----------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "runs"),
    [
        (None, False),
        (RegistryAuth(username=USER, password="wrong"), False),
        (RegistryAuth(username=OTHER_USER, password=PASSWORD), False),
        (RegistryAuth(username=OTHER_USER, password=OTHER_PASSWORD), True),
    ],
    ids=["no-credentials", "wrong-password", "someone-elses-password", "own-valid-credentials"],
)
async def test_a_private_image_another_renter_pulled_runs_only_with_the_new_renters_own_valid_credentials(
    engine, images, clean, tmp_path, auth, runs
):
    runtime = _runtime(engine, images, tmp_path)
    try:
        alice = await runtime.create(_job("alice", images.secret, registry_auth=ALICE), labels={LABEL_COMMAND_ID: "a"})
        assert alice.state == "running"
        bob = _job("bob", images.secret, registry_auth=auth)
        if runs:
            assert (await runtime.create(bob, labels={LABEL_COMMAND_ID: "b"})).state == "running"
        else:
            with pytest.raises(ImageUnauthorized, match="registry refused access") as caught:
                await runtime.create(bob, labels={LABEL_COMMAND_ID: "b"})
            assert is_renter_fault(caught.value.code)
            assert engine.inspect("bob") is None  # never created, let alone started
            assert "wrong" not in str(caught.value) and PASSWORD not in str(caught.value)
    finally:
        await runtime.close()
    assert _has(engine, images.secret)  # a refused renter takes nothing away from the one who proved access


async def test_the_renter_who_pulled_a_private_image_runs_it_again_even_after_another_was_refused(
    engine, images, clean, tmp_path
):
    runtime = _runtime(engine, images, tmp_path)
    try:
        await runtime.ensure_image(_job("alice-1", images.secret, registry_auth=ALICE))
        with pytest.raises(ImageUnauthorized):
            await runtime.ensure_image(_job("bob", images.secret))
        again = await runtime.create(_job("alice-2", images.secret, registry_auth=ALICE), labels={LABEL_COMMAND_ID: "a"})
    finally:
        await runtime.close()
    assert again.state == "running"


async def test_the_executors_early_pull_check_is_made_again_by_create(engine, images, clean, tmp_path):
    """The executor calls ensure_image before create; a create on its own must not skip the access check."""
    runtime = _runtime(engine, images, tmp_path)
    try:
        await runtime.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
        with pytest.raises(ImageUnauthorized):
            await runtime.create(_job("bob", images.secret), labels={LABEL_COMMAND_ID: "b"})
    finally:
        await runtime.close()
    assert engine.inspect("bob") is None


async def test_a_private_image_named_by_its_id_still_needs_the_renters_credentials(engine, images, clean, tmp_path):
    """The engine finds an image by its id as well as its name: the check follows the image, not the words."""
    runtime = _runtime(engine, images, tmp_path)
    try:
        await runtime.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
        image_id = engine.podman("image", "inspect", "--format", "{{.Id}}", images.secret).stdout.strip()
        with pytest.raises(ImageUnauthorized, match="name it by its registry reference") as caught:
            await runtime.create(_job("bob", image_id[:12]), labels={LABEL_COMMAND_ID: "b"})
    finally:
        await runtime.close()
    assert is_renter_fault(caught.value.code)
    assert engine.inspect("bob") is None


async def test_a_private_image_is_never_among_the_images_the_host_lists(engine, images, clean, tmp_path):
    runtime = _runtime(engine, images, tmp_path)
    try:
        await runtime.ensure_image(_job("public", images.small[0]))
        await runtime.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
        await runtime.ensure_image(
            _job("teammate", images.secret, registry_auth=RegistryAuth(username=OTHER_USER, password=OTHER_PASSWORD))
        )
        listed = await runtime.image_references(limit=32)
    finally:
        await runtime.close()
    assert images.small[0] in listed
    assert not [ref for ref in listed if images.private.host in ref], listed


async def test_a_restarted_agent_still_asks_the_next_renter_for_credentials_and_keeps_no_password(
    engine, images, clean, tmp_path
):
    first = _runtime(engine, images, tmp_path)
    try:
        await first.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
    finally:
        await first.close()
    record = tmp_path / "image-access.json"
    assert record.stat().st_mode & 0o777 == 0o600
    assert PASSWORD not in record.read_text() and USER not in record.read_text()
    restarted = _runtime(engine, images, tmp_path)
    try:
        with pytest.raises(ImageUnauthorized):
            await restarted.create(_job("bob", images.secret), labels={LABEL_COMMAND_ID: "b"})
        listed = await restarted.image_references(limit=32)
    finally:
        await restarted.close()
    assert images.secret not in listed


async def test_an_agent_without_its_access_record_treats_what_it_pulled_as_private_until_pulled_again(
    engine, images, clean, tmp_path
):
    """An agent upgraded from before the record (or whose record was damaged) cannot tell which pulls had
    credentials: every image it pulled is hidden and pulled again by its next renter, which makes a public one
    public again."""
    first = _runtime(engine, images, tmp_path)
    try:
        await first.ensure_image(_job("public", images.small[0]))
        await first.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
    finally:
        await first.close()
    (tmp_path / "image-access.json").unlink()
    upgraded = _runtime(engine, images, tmp_path)
    try:
        before = await upgraded.image_references(limit=32)
        with pytest.raises(ImageUnauthorized):
            await upgraded.create(_job("bob", images.secret), labels={LABEL_COMMAND_ID: "b"})
        public = await upgraded.create(_job("carol", images.small[0]), labels={LABEL_COMMAND_ID: "c"})
        after = await upgraded.image_references(limit=32)
    finally:
        await upgraded.close()
    assert images.small[0] not in before and images.secret not in before
    assert public.state == "running"
    assert images.small[0] in after and images.secret not in after


async def test_a_host_that_does_not_pull_refuses_a_private_image_to_a_renter_who_has_not_proved_access(
    engine, images, clean, tmp_path
):
    puller = _runtime(engine, images, tmp_path)
    try:
        await puller.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
    finally:
        await puller.close()
    runtime = _runtime(engine, images, tmp_path, pull=False)
    try:
        with pytest.raises(ImageUnauthorized, match="cannot check yours") as caught:
            await runtime.create(_job("bob", images.secret), labels={LABEL_COMMAND_ID: "b"})
        alice = await runtime.create(_job("alice", images.secret, registry_auth=ALICE), labels={LABEL_COMMAND_ID: "a"})
    finally:
        await runtime.close()
    assert is_renter_fault(caught.value.code)
    assert engine.inspect("bob") is None
    assert alice.state == "running"


async def test_checking_a_second_renters_credentials_fetches_the_manifest_not_the_layers(engine, images, clean, tmp_path):
    """The check is a pull of an image the engine has: the registry answers for the manifest, the layers stay."""
    through_proxy = images.secret.replace(images.private.host, f"127.0.0.1:{images.slow_port}")
    teammate = RegistryAuth(username=OTHER_USER, password=OTHER_PASSWORD)
    runtime = _runtime(engine, images, tmp_path)
    try:
        async with ThrottledProxy(images.slow_port, images.private, rate=1e12) as proxy:  # counts, hardly slows
            await runtime.ensure_image(_job("alice", through_proxy, registry_auth=ALICE))
            first = proxy.sent
            await runtime.ensure_image(_job("teammate", through_proxy, registry_auth=teammate))
            second = proxy.sent - first
    finally:
        await runtime.close()
        engine.podman("rmi", "--force", through_proxy, check=False)
    print(f"first pull carried {first} bytes, the second renter's check {second}")
    assert first > 512 * 1024  # the busybox layer (about 1 MB compressed)
    assert 0 < second < 64 * 1024  # the registry was asked (and checked the teammate's password), no layer moved


def _publish(builder: PodmanService, source: str, target: str) -> None:
    """Point the private registry's ``target`` at the image ``source`` names (the renters' own pushes, by the builder
    Podman, so the host's engine keeps what it has)."""
    builder.podman("pull", "--quiet", "--tls-verify=false", source, timeout_s=120)
    builder.podman("tag", source, target)
    builder.podman("push", "--quiet", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", target, timeout_s=120)
    builder.podman("rmi", source, target)


def _variant(engine: PodmanService, container: str) -> str:
    return engine.podman("inspect", "--format", '{{index .Config.Labels "variant"}}', container).stdout.strip()


async def test_when_a_private_tag_moves_each_renter_runs_what_the_registry_serves_its_own_credentials(
    engine, images, podman, clean, tmp_path
):
    """The proof is of an image id, not of a name: a renter whose pull reached another image runs that one, and the
    renter proven for the old one must prove the new one too."""
    moving = f"{images.private.host}/team/secret:moving"
    teammate = RegistryAuth(username=OTHER_USER, password=OTHER_PASSWORD)
    runtime = _runtime(engine, images, tmp_path)
    try:
        _publish(podman, images.small[0], moving)
        await runtime.create(_job("alice-old", moving, registry_auth=ALICE), labels={LABEL_COMMAND_ID: "a1"})
        _publish(podman, images.small[1], moving)
        await runtime.create(_job("teammate-new", moving, registry_auth=teammate), labels={LABEL_COMMAND_ID: "t"})
        with pytest.raises(ImageUnauthorized):
            await runtime.create(_job("bob", moving), labels={LABEL_COMMAND_ID: "b"})
        await runtime.create(_job("alice-new", moving, registry_auth=ALICE), labels={LABEL_COMMAND_ID: "a2"})
        listed = await runtime.image_references(limit=32)
        ran = [_variant(engine, name) for name in ("alice-old", "teammate-new", "alice-new")]
    finally:
        await runtime.close()
        engine.podman("rm", "--all", "--force", "--time", "0")
        engine.podman("rmi", "--force", moving, check=False)
        engine.podman("image", "prune", "--force", check=False)  # the old image, untagged by the move
    assert ran == ["0", "1", "1"]
    assert moving not in listed


@pytest.mark.parametrize("short", ["team/secret:1", "secret:1"])
async def test_a_private_image_named_by_a_short_name_the_engine_resolves_still_needs_credentials(
    engine, images, clean, tmp_path, short
):
    """Podman finds ``team/secret:1`` and ``secret:1`` among the images it has; its pull of that short name goes to the
    private registry it came from, which asks for credentials."""
    runtime = _runtime(engine, images, tmp_path)
    try:
        await runtime.ensure_image(_job("alice", images.secret, registry_auth=ALICE))
        with pytest.raises(ImageUnauthorized, match="registry refused access"):
            await runtime.create(_job("bob", short), labels={LABEL_COMMAND_ID: "b"})
    finally:
        await runtime.close()
    assert engine.inspect("bob") is None
