"""Launch templates (the templates service, docs/templates.md): the catalog this Master offers, read once at start
(management/launch/templates.py), and the workload spec each launches. Every account may read them; their answers are
management/views/templates.py's."""

from __future__ import annotations

from management.launch.templates import LaunchTemplate, TemplateCatalog, spec_of
from master.port import SpecJson


class TemplatesService:
    """``Services.templates``."""

    def __init__(self, catalog: TemplateCatalog) -> None:
        self.catalog = catalog

    def list_templates(self) -> list[LaunchTemplate]:
        return list(self.catalog.all())

    def get_template(self, name: str) -> LaunchTemplate:
        """UnknownTemplate for a name not here."""
        return self.catalog.get(name)

    def launch_spec(self, name: str, overrides: SpecJson | None = None) -> SpecJson:
        """The spec that launching ``name`` submits, with ``overrides`` over it (UnknownTemplate for a name not here)."""
        return spec_of(self.catalog.get(name), overrides)
