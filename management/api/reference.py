"""The API reference page, ``GET /api/v1/docs``: plain HTML rendered on the server from the OpenAPI document.

Operations are listed by tag with their parameters, body and answers; every schema they name follows with its fields.
No script, no stylesheet from elsewhere: the page is one self-contained document, escaped throughout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from html import escape

from aiohttp import web

from management.api.openapi import DOCUMENT_KEY, PublishedDocument
from management.http.schemas import OpenApiJson

DOCS_PATH = "/api/v1/docs"
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "code,.path{font-family:ui-monospace,monospace}table{border-collapse:collapse;margin:.3rem 0 1rem}"
    "td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left;vertical-align:top}"
    ".method{font-weight:bold;display:inline-block;min-width:4.5rem}section.op{border-top:1px solid #ddd;padding:.5rem 0}"
)


def schema_text(schema: OpenApiJson) -> str:
    """A schema in a few words: ``AgentView``, ``array of string``, ``integer ≥ 1 ≤ 1000``, ``string | null``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'
    if "anyOf" in schema:
        return " | ".join(schema_text(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"<code>{escape(str(v))}</code>" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return "array of " + schema_text(schema.get("items", {}))
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return "object of " + schema_text(schema["additionalProperties"])
    bounds = [
        f"{word} {escape(str(schema[key]))}"
        for key, word in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if key in schema
    ]
    if "pattern" in schema:
        bounds.append(f"matching <code>{escape(schema['pattern'])}</code>")
    return " ".join([escape(str(kind)), *bounds])


def _rows(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _operation_html(path: str, method: str, op: OpenApiJson) -> str:
    parts = [
        f'<section class="op" id="{escape(op["operationId"])}">',
        f'<h3><span class="method">{escape(method.upper())}</span> <span class="path">{escape(path)}</span></h3>',
        f"<p>{escape(op['summary'])}{' (no key needed)' if op.get('security') == [] else ''}</p>",
    ]
    if op.get("description"):
        parts.append(f"<p>{escape(op['description'])}</p>")
    if op["parameters"]:
        rows = [
            (
                f"<code>{escape(p['name'])}</code>",
                escape(p["in"]),
                "yes" if p["required"] else "no",
                schema_text(p["schema"]),
            )
            for p in op["parameters"]
        ]
        parts.append(_rows(("parameter", "in", "required", "schema"), rows))
    if "requestBody" in op:
        bodies = ", ".join(f"{escape(m)}: {schema_text(c['schema'])}" for m, c in op["requestBody"]["content"].items())
        parts.append(f"<p>Body: {bodies}</p>")
    answers = [
        (
            f"<code>{escape(status)}</code>",
            escape(answer["description"]),
            ", ".join(f"{escape(m)}: {schema_text(c['schema'])}" for m, c in answer.get("content", {}).items()),
        )
        for status, answer in op["responses"].items()
    ]
    parts.append(_rows(("status", "meaning", "body"), answers))
    parts.append("</section>")
    return "".join(parts)


def _schema_html(name: str, schema: OpenApiJson) -> str:
    required = set(schema.get("required", ()))
    parts = [f'<section id="schema-{escape(name)}"><h3>{escape(name)}</h3>']
    if schema.get("description"):
        parts.append(f"<p>{escape(schema['description'])}</p>")
    properties = schema.get("properties", {})
    if properties:
        rows = [
            (f"<code>{escape(field)}</code>", "yes" if field in required else "no", schema_text(s))
            for field, s in properties.items()
        ]
        parts.append(_rows(("field", "required", "schema"), rows))
    else:
        parts.append(f"<p>{schema_text(schema)}</p>")
    parts.append("</section>")
    return "".join(parts)


def render(doc: OpenApiJson) -> str:
    """The reference page of ``doc``: operations by tag (in the document's tag order), then the schemas."""
    by_tag: dict[str, list[str]] = {t["name"]: [] for t in doc.get("tags", ())}
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            by_tag.setdefault(op["tags"][0], []).append(_operation_html(path, method, op))
    title = escape(doc["info"]["title"])
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{title}</h1><p>{escape(doc['info'].get('description', ''))}</p>",
        '<p>Every call but this page and <a href="/api/v1/openapi.json">the OpenAPI document</a> needs '
        '<code>Authorization: Bearer &lt;API key&gt;</code>. Errors answer <code>{"error": {"code", "message"}}</code>.</p>',
        "<nav><ul>" + "".join(f'<li><a href="#tag-{escape(t)}">{escape(t)}</a></li>' for t in by_tag) + "</ul></nav>",
    ]
    for tag, operations in by_tag.items():
        parts.append(f'<h2 id="tag-{escape(tag)}">{escape(tag)}</h2>')
        parts.extend(operations)
    parts.append("<h2>Schemas</h2>")
    parts.extend(_schema_html(name, schema) for name, schema in sorted(doc["components"]["schemas"].items()))
    parts.append("</body></html>")
    return "".join(parts)


@functools.cache
def _page(published: PublishedDocument) -> str:
    """The page of an app's document, rendered once (the document is fixed when the app is built)."""
    return render(published.document)


async def reference_page(request: web.Request) -> web.Response:
    return web.Response(text=_page(request.app[DOCUMENT_KEY]), content_type="text/html")
