"""Launch templates: what a template is, how the catalog is read, and how one becomes a workload spec (pure but for
reading the TOML files once, at start).

A template is one TOML file, its name the file's stem (``jupyter.toml`` is ``jupyter``):

    title = "PyTorch with Jupyter"
    description = "..."
    image = "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    command = ["sh", "-c", "pip install jupyterlab && exec jupyter lab ..."]
    env = { JUPYTER_TOKEN = "" }
    gpus = 1                      # GPUs per replica it asks for
    recommended_models = ["h100-sxm", "a100-80gb"]
    min_vram_gib = 24
    disk_gib = 50                 # what its image and data need on the host
    [[ports]]
    port = 8888
    kind = "http"                 # http: an HTTPS link (docs/links.md); tcp: port-forward or SSH -L
    public = false

Invariants: every template in the catalog decodes into ``LaunchTemplate`` and its spec (``spec_of``) passes the
workload spec's own checks, so a template that the Master lists always submits. The shipped catalog is checked at
start like the operator's: a bad file stops the Master with its name and the field, never a 500 later. An operator's
template replaces a shipped one of the same name.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

from common.catalog import CATALOG
from common.errors import IdlegridError, NotFound
from master.port import PortLink, SpecJson, WorkloadSpec

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")
SHIPPED = "management.launch.catalog"


class InvalidTemplate(IdlegridError):
    """A template file that cannot be read, or whose workload would be refused; the message names file and field."""

    code = "invalid_template"


class UnknownTemplate(NotFound):
    code = "unknown_template"


class LaunchTemplate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = ""  # the file's stem; set by the loader
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=120)]
    description: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    image: str
    command: list[str] = []
    env: dict[str, str] = {}
    ports: list[PortLink] = []
    gpus: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1
    recommended_models: list[str] = []
    min_vram_gib: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0
    disk_gib: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    # It may run sandboxed as a host process where the operator offers such hosts (a template for a local grid).
    allow_process_runtime: bool = False
    source: str = "shipped"  # "shipped" or "operator": set by the loader


def spec_of(template: LaunchTemplate, overrides: SpecJson | None = None) -> SpecJson:
    """The workload spec (as the API takes it) that ``template`` launches, ``overrides``' fields over it (a field given
    there wins whole: ``env`` is merged key by key, ``replica`` and ``constraints`` field by field)."""
    spec: SpecJson = {
        "name": template.name,
        "image": template.image,
        "command": list(template.command),
        "env": dict(template.env),
        "ports": [p.port for p in template.ports],
        "links": [msgspec.to_builtins(p) for p in template.ports if p.kind == "http"],
        "replica": {"gpus": template.gpus},
    }
    if template.allow_process_runtime:
        spec["constraints"] = {"allow_process_runtime": True}
    for field, value in (overrides or {}).items():
        if field == "env":
            spec["env"] = spec["env"] | dict(value)
        elif field in ("replica", "constraints"):
            spec[field] = dict(spec.get(field) or {}) | dict(value)
        elif field == "ports":
            spec["ports"] = list(value)
            spec["links"] = [link for link in spec["links"] if link["port"] in value]
        else:
            spec[field] = value
    return spec


def read_template(name: str, text: str, *, where: str, source: str) -> LaunchTemplate:
    """One template from its TOML text; InvalidTemplate naming ``where`` and the field."""
    if not NAME.match(name):
        raise InvalidTemplate(f"{where}: a template's file name is lowercase letters, digits and '-' (.toml), not {name!r}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidTemplate(f"{where}: not valid TOML: {exc}") from None
    try:
        template = msgspec.convert(data | {"name": name, "source": source}, LaunchTemplate)
    except msgspec.ValidationError as exc:
        raise InvalidTemplate(f"{where}: {exc}") from None
    unknown = [m for m in template.recommended_models if m not in CATALOG]
    if unknown:
        raise InvalidTemplate(f"{where}: recommended_models: unknown GPU model {', '.join(map(repr, unknown))}")
    try:
        msgspec.convert(spec_of(template), WorkloadSpec)
    except msgspec.ValidationError as exc:
        raise InvalidTemplate(f"{where}: the workload it launches would be refused: {exc}") from None
    return template


class TemplateCatalog:
    """The templates this Master offers, by name: the shipped ones, then the operator's over them."""

    def __init__(self, templates: Mapping[str, LaunchTemplate]) -> None:
        self._templates = dict(sorted(templates.items()))

    @classmethod
    def load(cls, operator_dir: Path | None = None) -> TemplateCatalog:
        found: dict[str, LaunchTemplate] = {}
        for entry in sorted(resources.files(SHIPPED).iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".toml"):
                stem = entry.name.removesuffix(".toml")
                found[stem] = read_template(stem, entry.read_text(), where=f"shipped template {entry.name}", source="shipped")
        if operator_dir is not None:
            if not operator_dir.is_dir():
                raise InvalidTemplate(f"templates_dir {operator_dir}: no such directory")
            for path in sorted(operator_dir.glob("*.toml")):
                found[path.stem] = read_template(path.stem, path.read_text(), where=str(path), source="operator")
        return cls(found)

    def all(self) -> list[LaunchTemplate]:
        return list(self._templates.values())

    def get(self, name: str) -> LaunchTemplate:
        template = self._templates.get(name)
        if template is None:
            raise UnknownTemplate(f"no template {name!r}; the templates are: {', '.join(self._templates) or 'none'}")
        return template
