"""Request in, typed schema out: bodies and query strings decoded by msgspec, every refusal a 400 naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from aiohttp import web

from management.http.errors import BadRequest, validation_message
from management.http.schemas import query_fields

S = TypeVar("S", bound=msgspec.Struct)


async def parse_body(request: web.Request, schema: type[S]) -> S:
    """The JSON body as ``schema``. Malformed JSON, NaN/Infinity, nesting deeper than msgspec decodes, wrong
    types (a boolean for a number included), unknown fields and bytes that are not UTF-8 (msgspec raises
    UnicodeDecodeError for those, not DecodeError) are each a 400 that says which."""
    raw = await request.read()  # bounded by the application's client_max_size
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        raise BadRequest(validation_message(exc, "body")) from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="bad_json") from None
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start}): JSON must be UTF-8", code="bad_json") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply", code="bad_json") from None


def parse_query(request: web.Request, schema: type[S]) -> S:
    """The query string as ``schema``: numbers are parsed from their text (never NaN or Infinity, which
    no integer field takes), unknown parameters and unknown filter values refused."""
    try:
        return msgspec.convert(query_fields(schema, request.query), schema, strict=False)
    except msgspec.ValidationError as exc:
        raise BadRequest(validation_message(exc, "query")) from None
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def json_response(body: Any, status: int = 200) -> web.Response:
    """Encoded with msgspec: several times faster than the stdlib for a page of a thousand GPUs."""
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")
