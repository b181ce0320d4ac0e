"""Launch templates as the API answers them (docs/templates.md): each template's fields and the workload spec it
launches. The catalog is management/launch/templates.py's, read by management/services/templates.py."""

from __future__ import annotations

import msgspec

from management.launch.templates import LaunchTemplate, spec_of
from master.port import SpecJson


class TemplateView(LaunchTemplate, kw_only=True):
    """A template as the API answers it: its fields, and the workload spec it launches (what ``--template`` starts
    from before the flags given over it)."""

    spec: SpecJson


class TemplateList(msgspec.Struct, kw_only=True):
    items: list[TemplateView]


def template_view(template: LaunchTemplate) -> TemplateView:
    return TemplateView(**msgspec.structs.asdict(template), spec=spec_of(template))


def template_list_view(templates: list[LaunchTemplate]) -> TemplateList:
    return TemplateList(items=[template_view(t) for t in templates])
