"""The demo's own templates (its Master's templates_dir): each reads as the Master reads it, and hello-web serves the
demo image's page on the port the image's httpd listens on, as a link."""

from __future__ import annotations

from management.devgrid.demo import DEMO_TEMPLATE, TEMPLATES_DIR
from management.devgrid.podman_host import DEMO, DEMO_IMAGE, DEMO_PORT
from management.launch.templates import TemplateCatalog


def test_the_demos_template_runs_its_local_image_and_links_the_port_its_web_server_listens_on():
    template = TemplateCatalog.load(TEMPLATES_DIR).get(DEMO_TEMPLATE)

    assert (template.image, template.source) == (DEMO_IMAGE, "operator")
    assert [(p.port, p.kind) for p in template.ports] == [(DEMO_PORT, "http")]
    assert template.command == []  # the image's own CMD: its web server
    assert f'"-p", "{DEMO_PORT}"' in next(change for change in DEMO.changes if change.startswith("CMD"))
