"""Launch templates (management/launch/templates.py): the shipped catalog, the operator's, and the spec each launches."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from management.launch.templates import InvalidTemplate, TemplateCatalog, UnknownTemplate, spec_of
from master.records import WorkloadSpec

SHIPPED = ("comfyui", "cuda-shell", "jupyter", "vllm")


def test_the_shipped_catalog_has_the_four_templates_and_each_launches_a_valid_spec():
    catalog = TemplateCatalog.load()
    assert [t.name for t in catalog.all()] == list(SHIPPED)
    for template in catalog.all():
        spec = msgspec.convert(spec_of(template), WorkloadSpec)
        assert spec.image == template.image and template.source == "shipped"
    jupyter = catalog.get("jupyter")
    assert [(p.port, p.kind, p.public) for p in jupyter.ports] == [(8888, "http", False)]
    assert spec_of(jupyter)["links"] == [{"port": 8888, "kind": "http", "public": False}]
    assert catalog.get("cuda-shell").ports == []
    with pytest.raises(UnknownTemplate, match="no template 'nope'; the templates are: comfyui, cuda-shell"):
        catalog.get("nope")


def test_overrides_win_env_merges_and_dropping_a_port_drops_its_link():
    vllm = TemplateCatalog.load().get("vllm")
    spec = spec_of(vllm, {"name": "mine", "env": {"MODEL": "org/small", "HF_TOKEN": "t"}, "replica": {"models": ["l40s"]}})
    assert spec["name"] == "mine" and spec["env"] == {"MODEL": "org/small", "HF_TOKEN": "t"}
    assert spec["replica"] == {"gpus": 1, "models": ["l40s"]}
    assert spec_of(vllm, {"ports": [9000]})["links"] == []


def test_an_operators_template_is_added_or_replaces_a_shipped_one(tmp_path: Path):
    (tmp_path / "jupyter.toml").write_text('title = "Our Jupyter"\nimage = "registry.local/jupyter:1"\n')
    (tmp_path / "echo.toml").write_text('title = "Echo"\nimage = "busybox"\ncommand = ["echo", "hi"]\n')
    catalog = TemplateCatalog.load(tmp_path)
    assert catalog.get("jupyter").title == "Our Jupyter" and catalog.get("jupyter").source == "operator"
    assert catalog.get("echo").command == ["echo", "hi"]
    assert len(catalog.all()) == len(SHIPPED) + 1


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("bad", "title = ", "not valid TOML"),
        ("bad", 'image = "x"\n', "title"),
        ("bad", 'title = "t"\nimage = "x"\nsize = 3\n', "size"),
        ("bad", 'title = "t"\nimage = "x"\n[[ports]]\nport = 0\n', "port"),
        ("bad", 'title = "t"\nimage = "x"\nrecommended_models = ["gtx-9999"]\n', "unknown GPU model"),
        ("Bad_Name", 'title = "t"\nimage = "x"\n', "file name"),
    ],
)
def test_a_bad_template_file_stops_the_load_naming_the_file_and_the_field(tmp_path: Path, name: str, text: str, said: str):
    (tmp_path / f"{name}.toml").write_text(text)
    with pytest.raises(InvalidTemplate, match=said) as caught:
        TemplateCatalog.load(tmp_path)
    assert str(tmp_path) in str(caught.value)


def test_a_missing_templates_dir_is_named():
    with pytest.raises(InvalidTemplate, match="no such directory"):
        TemplateCatalog.load(Path("/nonexistent/templates"))
