"""Launch templates (the templates service, docs/templates.md): the catalog this Master offers, read once at start
(management/launch/templates.py), and the workload spec each launches. Every account may read them."""

from __future__ import annotations

from typing import Any

import msgspec

from management.launch.templates import LaunchTemplate, TemplateCatalog, spec_of


class TemplateView(LaunchTemplate, kw_only=True):
    """A template as the API answers it: its fields, and the workload spec it launches (what ``--template`` starts
    from before the flags given over it)."""

    spec: dict[str, Any]


class TemplateList(msgspec.Struct, kw_only=True):
    items: list[TemplateView]


class TemplatesService:
    """``Services.templates``."""

    def __init__(self, catalog: TemplateCatalog) -> None:
        self.catalog = catalog

    def view(self, template: LaunchTemplate) -> TemplateView:
        return TemplateView(**msgspec.structs.asdict(template), spec=spec_of(template))

    def list_templates(self) -> TemplateList:
        return TemplateList(items=[self.view(t) for t in self.catalog.all()])

    def get_template(self, name: str) -> TemplateView:
        return self.view(self.catalog.get(name))

    def launch_spec(self, name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The spec that launching ``name`` submits, with ``overrides`` over it (UnknownTemplate for a name not here)."""
        return spec_of(self.catalog.get(name), overrides)
