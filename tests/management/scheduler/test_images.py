"""Whether a grid's hosts can ever get a workload's image: refused at submit with the fix named, never queued for ever;
placed only on a host that can get it; unknown sources (agents older than the report) refuse nothing."""

from __future__ import annotations

from common.inventory import MAX_IMAGES_IN_REPORT, ImageSource, image_refusal
from management.scheduler import Host, Job, ReplicaRequest, schedule
from management.scheduler.core import explain, never_fits
from tests.management.scheduler.grid import gpus, grid, placed, snapshot

JUPYTER = "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
DEMO = "localhost/idlegrid-demo:1"
NO_PULLS = ImageSource(pull=False)  # the demo's container host: no registry reachable, its images built there


def job(jid: str, image: str, **kw) -> Job:
    return Job(jid, "acme", request=ReplicaRequest(gpus=1), image=image, **kw)


def engine(hid: str, source: ImageSource | None, images: tuple[str, ...] = ()) -> Host:
    return Host(hid, runtime="docker", image_source=source, images=images)


def test_a_host_that_pulls_from_every_registry_gets_any_image():
    assert image_refusal(ImageSource(), (), JUPYTER) is None


def test_a_host_with_pulls_off_gets_only_what_it_has_under_any_spelling_of_its_name():
    assert image_refusal(NO_PULLS, ("docker.io/library/busybox:latest",), "busybox") is None
    assert image_refusal(NO_PULLS, (DEMO,), DEMO) is None
    assert image_refusal(NO_PULLS, (DEMO,), JUPYTER) == f"lack image {JUPYTER}, with image pulls off (image_pull)"


def test_registries_allowed_and_denied_name_the_setting_and_denied_wins():
    only_local = ImageSource(registries_allowed=["localhost", "*.example.org"])
    assert image_refusal(only_local, (), "registry.example.org/team/app:2") is None
    why = image_refusal(only_local, (), JUPYTER)
    assert why == "pull only from localhost, *.example.org, not from docker.io (image_registries_allowed)"
    denied = ImageSource(registries_allowed=["docker.io"], registries_denied=["index.docker.io"])
    assert image_refusal(denied, (), "pytorch/pytorch") == "refuse images from docker.io (image_registries_denied)"


def test_an_unknown_source_or_a_full_image_list_refuses_nothing():
    assert image_refusal(None, (), JUPYTER) is None  # an agent older than the report
    full = tuple(f"localhost/img-{i}:1" for i in range(MAX_IMAGES_IN_REPORT))  # the image may be past the bound
    assert image_refusal(NO_PULLS, full, JUPYTER) is None


def test_an_image_no_engine_host_can_get_never_fits_naming_the_registry_setting_and_the_images_there():
    hosts, units = grid([engine("demo", NO_PULLS, (DEMO,))], units=gpus("demo", 2))
    reason = never_fits(snapshot(hosts, units, queue=[]), job("jupyter", JUPYTER)) or ""
    assert reason.startswith(f"no host of this grid with a container engine can get image {JUPYTER}: 1 host lacks"), reason
    assert "image_pull on, docker.io within image_registries_allowed" in reason and f"the images here: {DEMO}" in reason
    assert never_fits(snapshot(hosts, units, queue=[]), job("hello", DEMO)) is None


def test_one_host_that_can_get_the_image_is_enough_and_placement_goes_there():
    hosts, units = grid(
        [engine("demo", NO_PULLS, (DEMO,)), engine("puller", ImageSource())], units=gpus("demo", 1) + gpus("puller", 1)
    )
    assert never_fits(snapshot(hosts, units, queue=[]), job("jupyter", JUPYTER)) is None
    plan = schedule(snapshot(hosts, units, queue=[job("jupyter", JUPYTER)]))
    assert placed(plan)["jupyter"] == (("puller-g0",),)


def test_a_host_that_cannot_get_the_image_is_filtered_and_the_explanation_says_why():
    hosts, units = grid(
        [engine("demo", NO_PULLS, (DEMO,)), engine("puller", ImageSource())], units=gpus("demo", 1) + gpus("puller", 1)
    )
    busy = snapshot(hosts, units, queue=[job("jupyter", JUPYTER)], extra_holders={"puller-g0": "other"})
    explanation = explain(busy, "jupyter")
    runtime = {f.name: f for f in explanation.filters}["runtime/isolation"]
    assert runtime.detail == f"1 host lacks image {JUPYTER}, with image pulls off (image_pull)", runtime


def test_a_rental_is_judged_on_the_host_it_rents():
    hosts, units = grid(
        [engine("demo", NO_PULLS, (DEMO,)), engine("puller", ImageSource())], units=gpus("demo", 1) + gpus("puller", 1)
    )
    reason = never_fits(snapshot(hosts, units, queue=[]), job("jupyter", JUPYTER, pin="demo")) or ""
    assert reason.startswith(f"offer demo cannot get image {JUPYTER}: 1 host lacks"), reason
    assert never_fits(snapshot(hosts, units, queue=[]), job("jupyter", JUPYTER, pin="puller")) is None


def test_an_image_on_a_grid_without_any_engine_never_fits_naming_what_would_run_it():
    hosts, units = grid([Host("proc", runtime="process", isolation="sandbox")], units=gpus("proc", 2))
    reason = never_fits(snapshot(hosts, units, queue=[]), job("jupyter", JUPYTER)) or ""
    assert reason.startswith("an image runs only on a host with a container engine, and no host of this grid has one")
    assert "Docker or Podman" in reason and "--runtime docker" in reason, reason
